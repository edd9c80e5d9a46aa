//! The store's two backends side by side, in one process, on one machine: the
//! embedded SQLite file and a local PostgreSQL server (throwaway, fsync on, the
//! server the tests use), driving the same pipelines with the `mock` executor.
//!
//! Run: `cargo bench --bench replicas`. Reports, per backend, one 100-step run
//! (steps/s) and 200 concurrent 5-step runs (runs/s and step transitions/s),
//! alternating the backends over several rounds so a noisy neighbour hits both.
//! Targets (issue: replicas on PostgreSQL): one replica on PostgreSQL at least 0.3x
//! SQLite's steps/s; at least 150 runs/s and 750 step transitions/s on a 2-core
//! machine. Several replicas at once are not measured yet: one `serve` per
//! database until runs are leased (docs/replicas.md).

#[path = "../tests/common/postgres.rs"]
#[allow(dead_code)]
mod postgres;

use std::sync::Arc;
use std::time::{Duration, Instant};

use vectorstep::clock::SystemClock;
use vectorstep::config::Config;
use vectorstep::executor::Executors;
use vectorstep::run::context::Normalised;
use vectorstep::runner::{Created, DriveMode, Engine, RunEnd};
use vectorstep::store::Store;

fn pipeline_yaml(name: &str, steps: usize) -> String {
    let mut s = format!("name: {name}\ntrigger: {{}}\nstage: production\ndurable: true\nsteps:\n");
    for i in 0..steps {
        s.push_str(&format!(
            "  - name: s{i}\n    executor: mock\n    executor_config:\n      output: {{confidence: 0.9, summary: \"step {i}\", next_step_context: \"\"}}\n"
        ));
    }
    s
}

async fn run_one(engine: &Arc<Engine>, name: &str) -> String {
    let p = engine.pipeline(name).expect("pipeline loaded");
    let trigger = Normalised {
        source: "bench".into(),
        pipeline: Some(name.into()),
        ..Default::default()
    };
    let Ok(Created::Inserted(id)) = engine
        .create_run(&p, &trigger, &serde_json::json!({}), None, None)
        .await
    else {
        panic!("run not created");
    };
    match engine.drive(&id, DriveMode::New).await {
        Ok(RunEnd::Finished(s)) => s.to_string(),
        other => panic!("run did not finish: {other:?}"),
    }
}

/// One round on one store: (steps/s of one 100-step run, seconds for 200
/// concurrent 5-step runs).
fn round(config: &Arc<Config>, store: &Store, pdir: &std::path::Path) -> (f64, Duration) {
    let (set, diags) = vectorstep::pipeline::load(&[pdir.to_path_buf()], config);
    let set = set.unwrap_or_else(|| panic!("{diags}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let engine = Engine::new(
            config.clone(),
            set,
            store.clone(),
            Executors::standard(config),
            Arc::new(SystemClock),
        );
        run_one(&engine, "short").await;
        let t = Instant::now();
        assert_eq!(run_one(&engine, "long").await, "completed");
        let single = 100.0 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        let handles: Vec<_> = (0..200)
            .map(|_| {
                let e = engine.clone();
                tokio::spawn(async move { run_one(&e, "short").await })
            })
            .collect();
        for h in handles {
            assert_eq!(h.await.expect("join"), "completed");
        }
        (single, t.elapsed())
    })
}

fn config(dir: &std::path::Path, database: &str) -> Arc<Config> {
    let path = dir.join(format!("config-{}.yaml", database.len()));
    std::fs::write(
        &path,
        format!("pipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\n{database}\n"),
    )
    .expect("write config");
    Arc::new(Config::load(&path, true).expect("config").0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pdir = dir.path().join("pipelines");
    std::fs::create_dir_all(&pdir).expect("mkdir");
    std::fs::write(pdir.join("long.yaml"), pipeline_yaml("long", 100)).expect("write");
    std::fs::write(pdir.join("short.yaml"), pipeline_yaml("short", 5)).expect("write");

    let pg = postgres::Postgres::start();
    let url = pg.database();
    let lite_config = config(dir.path(), "database: {path: ./bench.db}");
    let pg_config = config(
        dir.path(),
        &format!("database: {{url: {url:?}, pool_size: 16}}"),
    );
    let lite = Store::open(&lite_config.database_path).expect("SQLite store");
    let shared = Store::open_postgres(&url, 16).expect("PostgreSQL store");

    let rounds = 3;
    let (mut lite_single, mut lite_many, mut pg_single, mut pg_many) =
        (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let (s, m) = round(&lite_config, &lite, &pdir);
        lite_single.push(s);
        lite_many.push(1000.0 / m.as_secs_f64());
        let (s, m) = round(&pg_config, &shared, &pdir);
        pg_single.push(s);
        pg_many.push(1000.0 / m.as_secs_f64());
    }
    let (ls, lm, ps, pm) = (
        median(lite_single),
        median(lite_many),
        median(pg_single),
        median(pg_many),
    );
    println!("medians of {rounds} alternating rounds:");
    println!("  SQLite:                one 100-step run {ls:.0} steps/s; 200 concurrent 5-step runs {lm:.0} step transitions/s, {:.0} runs/s", lm / 5.0);
    println!("  PostgreSQL, 1 replica: one 100-step run {ps:.0} steps/s; 200 concurrent 5-step runs {pm:.0} step transitions/s, {:.0} runs/s", pm / 5.0);
    println!(
        "  PostgreSQL / SQLite: {:.2}x one run, {:.2}x concurrent (target >= 0.3x); 1 replica: {:.0} runs/s (target >= 150), {pm:.0} transitions/s (target >= 750)",
        ps / ls,
        pm / lm,
        pm / 5.0
    );
    let stats = shared.stats();
    println!(
        "  PostgreSQL writer: {} batches in {} transactions ({:.1} batches per commit)",
        stats.batches_committed,
        stats.transactions_committed,
        stats.batches_committed as f64 / stats.transactions_committed.max(1) as f64
    );
}
