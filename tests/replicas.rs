//! A `serve` on PostgreSQL is a replica of the shared store: it registers under an
//! id of its own for this boot before it is ready, heartbeats every
//! `replica.heartbeat_seconds` with the fingerprints of the pipelines it loaded,
//! and records that it stopped when it shuts down cleanly; one killed stops
//! heartbeating and is left as it was.

mod common;
use common::crash_support;

use std::time::{Duration, Instant};

use crash_support::{Scratch, Service};
use vectorstep::store::{ReplicaKind, ReplicaRecord, Store};

const PIPELINE: &str = "name: p\ntrigger: {match: {source: generic}}\nstage: production\nsteps:\n  - {name: a, executor: mock}\n";

fn replicas(store: &Store) -> Vec<ReplicaRecord> {
    store.replicas().expect("read the replicas")
}

fn only_new(store: &Store, known: &[String]) -> ReplicaRecord {
    let new: Vec<ReplicaRecord> = replicas(store)
        .into_iter()
        .filter(|r| !known.contains(&r.id))
        .collect();
    assert_eq!(new.len(), 1, "one replica registered: {new:?}");
    new.into_iter().next().expect("one")
}

fn by_id(store: &Store, id: &str) -> ReplicaRecord {
    replicas(store)
        .into_iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("replica {id} is listed"))
}

/// Waits until replica `id` heartbeat after `since`.
async fn heartbeat_after(store: &Store, id: &str, since: i64) -> ReplicaRecord {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = by_id(store, id);
        if r.heartbeat_at > since {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "no heartbeat after {since}: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_on_postgres_registers_heartbeats_and_says_when_it_stopped() {
    let s = Scratch::on_postgres();
    s.write_pipeline("p", PIPELINE);
    let store = s.open_store();
    let mut svc = Service::start(&s.root).await;
    svc.wait_ready().await;

    // Registered before ready, with what it loaded.
    let first = only_new(&store, &[]);
    assert_eq!(first.kind, ReplicaKind::Serve);
    assert_eq!(first.stopped_at, None);
    let run_id = svc.post_run("p", serde_json::json!({})).await;
    svc.wait_terminal(&run_id).await;
    let run = store.run(&run_id).expect("read").expect("the run");
    assert_eq!(first.fingerprints, vec![run.config_fingerprint.clone()]);

    // It goes on heartbeating (every second here), on the database's clock.
    let later = heartbeat_after(&store, &first.id, first.heartbeat_at).await;
    assert_eq!(later.started_at, first.started_at, "started once");
    assert!(later.heartbeat_at <= store.db_now_ms().expect("clock"));

    // A clean stop is recorded; the replica stays listed.
    let status = svc.sigterm(Duration::from_secs(20)).await;
    assert!(status.success(), "{status:?}");
    let stopped = by_id(&store, &first.id);
    assert!(stopped.stopped_at.is_some(), "{stopped:?}");

    // The next boot is another replica; a kill -9 records nothing and its
    // heartbeat stops.
    svc.restart().await;
    let second = only_new(&store, std::slice::from_ref(&first.id));
    assert_ne!(second.id, first.id);
    let beating = heartbeat_after(&store, &second.id, second.heartbeat_at).await;
    svc.kill9();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let dead = by_id(&store, &second.id);
    assert_eq!(dead.stopped_at, None, "a killed replica records nothing");
    let last = dead.heartbeat_at;
    assert!(last >= beating.heartbeat_at);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        by_id(&store, &second.id).heartbeat_at,
        last,
        "no heartbeat after the kill"
    );
}

const SLOW: &str = "name: slow\ntrigger: {match: {source: generic}}\nstage: production\ndurable: true\nsteps:\n  - {name: a, executor: mock, executor_config: {delay_ms: 150}}\n  - {name: b, executor: mock, executor_config: {delay_ms: 150}}\n  - {name: c, executor: mock, executor_config: {delay_ms: 150}}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_load_loses_no_acknowledged_run_and_runs_go_on() {
    let pg = common::postgres::Postgres::start();
    let s = Scratch::on(common::backend::Database::Postgres(pg.database()));
    s.write_pipeline("slow", SLOW);
    let svc = Service::start(&s.root).await;
    svc.wait_ready().await;

    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    };
    let mut restarted_at = 0;
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    // Runs before, during and after the outage, one every 50 ms.
    for i in 0..60 {
        if i == 20 {
            pg.stop_immediate();
        }
        if i == 35 {
            pg.restart();
            restarted_at = now_ms();
        }
        match svc.try_post_run("slow", serde_json::json!({"n": i})).await {
            Ok(id) => acknowledged.push((i, id)),
            Err(_) => refused += 1,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        refused > 0,
        "the outage was seen: intake refused while the store could not write"
    );
    assert!(
        acknowledged.iter().any(|(i, _)| *i < 20) && acknowledged.iter().any(|(i, _)| *i >= 35),
        "runs were acknowledged before and after the outage: {acknowledged:?}"
    );
    // Every acknowledged run, the ones in flight at the stop included, completes.
    let store = s.open_store();
    let mut spanning = 0;
    for (i, id) in &acknowledged {
        let run = svc.wait_terminal(id).await;
        assert_eq!(run["status"], "completed", "run {id}: {run}");
        let steps = store.steps(id).expect("steps");
        assert_eq!(steps.len(), 3, "run {id} ran every step: {steps:?}");
        assert!(
            steps.iter().all(|st| st.attempts == 1),
            "each step once: {steps:?}"
        );
        let record = store.run(id).expect("read").expect("the run");
        assert_eq!(record.resume_count, 0, "driven on by the same serve");
        if *i < 20 && record.completed_at.is_some_and(|t| t > restarted_at) {
            spanning += 1;
        }
    }
    assert!(
        spanning > 0,
        "some runs started before the stop finished after the restart: they waited it out"
    );
}
