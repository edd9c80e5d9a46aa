//! An engine in the test process on a scratch folder: pipelines written from
//! strings, a fresh store, standard executors. For tests that drive runs directly
//! instead of through the binary.

#![allow(dead_code)]

use std::sync::Arc;

use serde_json::json;
use vectorstep::clock::SystemClock;
use vectorstep::config::Config;
use vectorstep::executor::Executors;
use vectorstep::run::context::Normalised;
use vectorstep::runner::{Created, Engine};
use vectorstep::store::Store;

/// The engine, its store, and the folder both live in (dropped last).
pub struct Scratch {
    pub engine: Arc<Engine>,
    pub store: Store,
    pub dir: tempfile::TempDir,
}

/// Writes each `(file stem, yaml)` into `pipelines/` and starts an engine on them.
pub fn engine_with(pipelines: &[(&str, &str)]) -> Scratch {
    engine_with_config(pipelines, "")
}

/// [`engine_with`], with `config_extra` (YAML lines) appended to the config.
pub fn engine_with_config(pipelines: &[(&str, &str)], config_extra: &str) -> Scratch {
    let dir = tempfile::tempdir().expect("tempdir");
    let pdir = dir.path().join("pipelines");
    std::fs::create_dir_all(&pdir).expect("mkdir");
    for (name, yaml) in pipelines {
        std::fs::write(pdir.join(format!("{name}.yaml")), yaml).expect("write pipeline");
    }
    let cfg = dir.path().join("config.yaml");
    let database = super::backend::Database::new(&dir.path().join("vs.db")).yaml();
    std::fs::write(
        &cfg,
        format!(
            "pipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\n{database}\n{config_extra}"
        ),
    )
    .expect("write config");
    let config = Arc::new(Config::load(&cfg, true).expect("config").0);
    let (set, d) = vectorstep::pipeline::load(std::slice::from_ref(&pdir), &config);
    let set = set.unwrap_or_else(|| panic!("{d}"));
    let store = config.open_store().expect("store");
    let engine = Engine::new(
        config.clone(),
        set,
        store.clone(),
        Executors::standard(&config),
        Arc::new(SystemClock),
    );
    Scratch { engine, store, dir }
}

/// Records a new run of `pipeline` from a generic trigger (not driven).
pub async fn create(engine: &Arc<Engine>, pipeline: &str, fingerprint: Option<&str>) -> Created {
    let p = engine.pipeline(pipeline).expect("pipeline");
    let trigger = Normalised {
        source: "generic".into(),
        pipeline: Some(pipeline.into()),
        fingerprint: fingerprint.map(str::to_string),
        ..Normalised::default()
    };
    engine
        .create_run(&p, &trigger, &json!({}), None, None)
        .await
        .expect("create_run")
}
