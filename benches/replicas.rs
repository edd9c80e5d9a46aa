//! The store's two backends side by side, in one process, on one machine: the
//! embedded SQLite file and a local PostgreSQL server (throwaway, fsync on, the
//! server the tests use), driving the same pipelines with the `mock` executor.
//!
//! Run: `cargo bench --bench replicas`. Reports SQLite, one replica on
//! PostgreSQL and three replicas on the same PostgreSQL (three engines in this
//! process, each with its own store connection, writer and lease book, as three
//! `serve` processes would have): one 100-step run (steps/s) and 300 concurrent
//! 5-step runs (runs/s and step transitions/s), alternating over several rounds so
//! a noisy neighbour hits every configuration; then the adoption of 200 runs of a
//! replica that died (claim to start, p50 and p99).
//! Targets (issue: replicas on PostgreSQL): 3 replicas at least 0.8x the runs/s of
//! 1 replica; at least 150 runs/s and 750 step transitions/s on a 2-core machine;
//! 1 replica at least 0.3x SQLite's steps/s.

#[path = "../tests/common/postgres.rs"]
#[allow(dead_code)]
mod postgres;

use std::sync::Arc;
use std::time::{Duration, Instant};

use vectorstep::clock::SystemClock;
use vectorstep::config::Config;
use vectorstep::executor::Executors;
use vectorstep::run::context::Normalised;
use vectorstep::runner::leases::LeaseBook;
use vectorstep::runner::{adopt, sweep, Created, DriveMode, Engine, RunEnd};
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

/// An engine on `store`; on a shared store it leases its runs like a `serve`
/// replica (a lease book of its own).
fn engine_on(config: &Arc<Config>, store: &Store, pdir: &std::path::Path) -> Arc<Engine> {
    let (set, diags) = vectorstep::pipeline::load(&[pdir.to_path_buf()], config);
    let set = set.unwrap_or_else(|| panic!("{diags}"));
    let engine = Engine::new(
        config.clone(),
        set,
        store.clone(),
        Executors::standard(config),
        Arc::new(SystemClock),
    );
    if store.is_shared() {
        let id = vectorstep::runner::replica::new_id();
        engine.lease_runs_as(Arc::new(LeaseBook::new(&id, 30_000)));
    }
    engine
}

const CONCURRENT: usize = 300;

/// One round on `stores` (one engine each): (steps/s of one 100-step run on the
/// first, seconds for [`CONCURRENT`] concurrent 5-step runs spread over all).
fn round(config: &Arc<Config>, stores: &[Store], pdir: &std::path::Path) -> (f64, Duration) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let engines: Vec<Arc<Engine>> = stores.iter().map(|s| engine_on(config, s, pdir)).collect();
        for e in &engines {
            run_one(e, "short").await;
        }
        let t = Instant::now();
        assert_eq!(run_one(&engines[0], "long").await, "completed");
        let single = 100.0 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        let handles: Vec<_> = (0..CONCURRENT)
            .map(|i| {
                let e = engines[i % engines.len()].clone();
                tokio::spawn(async move { run_one(&e, "short").await })
            })
            .collect();
        for h in handles {
            assert_eq!(h.await.expect("join"), "completed");
        }
        (single, t.elapsed())
    })
}

/// A replica records 200 runs and dies before driving them (its leases run out at
/// once); another adopts them in one orphan sweep. Returns the ms from the start
/// of the sweep to each run's `run_resumed` (claim to start), sorted.
fn adoption(
    config: &Arc<Config>,
    dead: &Store,
    adopter: &Store,
    pdir: &std::path::Path,
) -> Vec<f64> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let corpse = engine_on(config, dead, pdir);
        corpse.lease_runs_as(Arc::new(LeaseBook::new("dead", 1)));
        let p = corpse.pipeline("short").expect("pipeline");
        let trigger = Normalised {
            source: "bench".into(),
            pipeline: Some("short".into()),
            ..Default::default()
        };
        let mut ids = Vec::new();
        for _ in 0..200 {
            match corpse
                .create_run(&p, &trigger, &serde_json::json!({}), None, None)
                .await
            {
                Ok(Created::Inserted(id)) => ids.push(id),
                other => panic!("run not created: {other:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let engine = engine_on(config, adopter, pdir);
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let runs = adopt::claim_orphans(&engine, adopt::SweepCause::Heartbeat)
            .await
            .expect("orphan sweep");
        assert_eq!(runs.len(), 200, "every orphan claimed");
        sweep::resume_all(&engine, runs).await;
        let mut latencies = Vec::new();
        for id in &ids {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let run = adopter.run(id).expect("read").expect("run");
                if run.status != vectorstep::domain::RunStatus::Running {
                    break;
                }
                assert!(Instant::now() < deadline, "{id} not finished");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let resumed = adopter
                .events(id)
                .expect("events")
                .into_iter()
                .find(|e| e.event == "run_resumed")
                .expect("run_resumed");
            latencies.push((resumed.ts - start) as f64);
        }
        latencies.sort_by(f64::total_cmp);
        latencies
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
    let lite = [Store::open(&lite_config.database_path).expect("SQLite store")];
    let one = [Store::open_postgres(&url, 16).expect("PostgreSQL store")];
    let three: Vec<Store> = (0..3)
        .map(|_| Store::open_postgres(&url, 6).expect("PostgreSQL store"))
        .collect();

    let rounds = 3;
    let mut results: [(Vec<f64>, Vec<f64>); 3] = Default::default();
    for _ in 0..rounds {
        for (i, stores) in [&lite[..], &one[..], &three[..]].into_iter().enumerate() {
            let config = if i == 0 { &lite_config } else { &pg_config };
            let (s, m) = round(config, stores, &pdir);
            results[i].0.push(s);
            results[i].1.push((CONCURRENT * 5) as f64 / m.as_secs_f64());
        }
    }
    let [(ls, lm), (ps, pm), (ts, tm)] = results.map(|(s, m)| (median(s), median(m)));
    println!("medians of {rounds} alternating rounds ({CONCURRENT} concurrent 5-step runs):");
    for (what, single, many) in [
        ("SQLite:               ", ls, lm),
        ("PostgreSQL, 1 replica:", ps, pm),
        ("PostgreSQL, 3 replicas:", ts, tm),
    ] {
        println!("  {what} one 100-step run {single:.0} steps/s; concurrent {many:.0} step transitions/s, {:.0} runs/s", many / 5.0);
    }
    println!(
        "  1 replica / SQLite: {:.2}x one run, {:.2}x concurrent (target >= 0.3x); 1 replica: {:.0} runs/s, {pm:.0} transitions/s",
        ps / ls,
        pm / lm,
        pm / 5.0
    );
    println!(
        "  3 replicas / 1 replica: {:.2}x runs/s (target >= 0.8x); 3 replicas: {:.0} runs/s (target >= 150), {tm:.0} transitions/s (target >= 750)",
        tm / pm,
        tm / 5.0
    );
    let latencies = adoption(&pg_config, &one[0], &three[0], &pdir);
    let p = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    println!(
        "  adoption of 200 runs of a dead replica: claim to start p50 {:.0} ms, p99 {:.0} ms",
        p(0.5),
        p(0.99)
    );
    let stats = one[0].stats();
    println!(
        "  PostgreSQL writer (1 replica): {} batches in {} transactions ({:.1} batches per commit)",
        stats.batches_committed,
        stats.transactions_committed,
        stats.batches_committed as f64 / stats.transactions_committed.max(1) as f64
    );
}
