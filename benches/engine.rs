//! Engine throughput with the `mock` executor on a `synchronous=FULL` store, next to
//! the raw rate of single-row fsync'd SQLite commits measured in the same process.
//!
//! Run: `cargo bench --bench engine`. Targets (issue: run engine):
//! - one 100-step run: cost per step within 3x one raw commit (a step needs two
//!   durable records, so little else may cost anything);
//! - 200 concurrent 5-step runs: at least 2x the raw commit rate in steps per second,
//!   because concurrent runs share commits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vectorstep::clock::SystemClock;
use vectorstep::config::Config;
use vectorstep::executor::Executors;
use vectorstep::run::context::Normalised;
use vectorstep::runner::{Created, DriveMode, Engine, RunEnd};
use vectorstep::store::{raw_commit_probe, Store};

fn pipeline_yaml(name: &str, steps: usize) -> String {
    let mut s = format!("name: {name}\ntrigger: {{}}\nstage: production\ndurable: true\nsteps:\n");
    for i in 0..steps {
        s.push_str(&format!(
            "  - name: s{i}\n    executor: mock\n    executor_config:\n      output: {{confidence: 0.9, summary: \"step {i}\", next_step_context: \"\"}}\n    prompt_template: \"step {i} of {{{{ pipeline_name }}}}\"\n"
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

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pdir = dir.path().join("pipelines");
    std::fs::create_dir_all(&pdir).expect("mkdir");
    std::fs::write(pdir.join("long.yaml"), pipeline_yaml("long", 100)).expect("write");
    std::fs::write(pdir.join("short.yaml"), pipeline_yaml("short", 5)).expect("write");
    let cfg_path = dir.path().join("config.yaml");
    std::fs::write(&cfg_path, "pipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\ndatabase: {path: ./bench.db}\n").expect("write");
    let config = Arc::new(Config::load(&cfg_path, true).expect("config").0);
    let (set, diags) = vectorstep::pipeline::load(std::slice::from_ref(&pdir), &config);
    let set = set.unwrap_or_else(|| panic!("{diags}"));

    let raw_n = 300;
    let raw = raw_commit_probe(dir.path(), raw_n).expect("probe");
    let raw_per_commit = raw / raw_n;
    let raw_rate = raw_n as f64 / raw.as_secs_f64();
    println!(
        "raw fsync'd commit: {:.3} ms each, {:.0} commits/s",
        ms(raw_per_commit),
        raw_rate
    );

    let store = Store::open(&config.database_path).expect("store");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let engine = Engine::new(config.clone(), set, store.clone(), Executors::standard(&config), Arc::new(SystemClock));
        // Warm-up so file creation and page cache effects stay out of the numbers.
        run_one(&engine, "short").await;
        if std::env::var("BENCH_PROBE").is_ok() {
            let t = Instant::now();
            for i in 0..200 {
                let ev = vectorstep::events::Event::FanOutEmpty { step: "x".into() }.write("x", 0, format!("{i}"));
                store.commit(vec![ev]).await.expect("commit");
            }
            println!("store.commit of one event: {:.3} ms each", ms(t.elapsed() / 200));
        }

        let mut best = Duration::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            assert_eq!(run_one(&engine, "long").await, "completed");
            best = best.min(t.elapsed());
        }
        let per_step = best / 100;
        println!(
            "one 100-step run: {:.0} steps/s, {:.3} ms per step = {:.2}x one raw commit (target <= 3x)",
            100.0 / best.as_secs_f64(),
            ms(per_step),
            per_step.as_secs_f64() / raw_per_commit.as_secs_f64()
        );

        let t = Instant::now();
        let mut handles = Vec::new();
        for _ in 0..200 {
            let e = engine.clone();
            handles.push(tokio::spawn(async move { run_one(&e, "short").await }));
        }
        for h in handles {
            assert_eq!(h.await.expect("join"), "completed");
        }
        let elapsed = t.elapsed();
        let rate = 1000.0 / elapsed.as_secs_f64();
        println!(
            "200 concurrent 5-step runs: {:.0} steps/s in {:.2}s = {:.2}x the raw commit rate (target >= 2x)",
            rate,
            elapsed.as_secs_f64(),
            rate / raw_rate
        );
        let stats = store.stats();
        println!(
            "store: {} batches in {} transactions ({:.1} batches per fsync)",
            stats.batches_committed,
            stats.transactions_committed,
            stats.batches_committed as f64 / stats.transactions_committed.max(1) as f64
        );
    });
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
