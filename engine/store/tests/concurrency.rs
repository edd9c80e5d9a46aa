//! Group commit under concurrency, failure isolation, durability, and a second handle.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::*;
use crate::store::Error;

#[test]
fn a_failing_batch_fails_alone_and_the_others_are_durable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    let store = Store::open(&path).expect("open");
    commit(&store, vec![Write::InsertRun(run("r"))]);

    const THREADS: usize = 50;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let store = store.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let path = format!("s{i:02}");
                // Every tenth batch writes a step for a run that does not exist, after
                // an event that must be rolled back with it.
                let writes = if i % 10 == 0 {
                    vec![
                        Write::AppendEvent(event("r", &format!("bad {i}"))),
                        Write::UpsertStep(step("ghost", &path, 0)),
                    ]
                } else {
                    vec![
                        Write::UpsertStep(step("r", &path, i as u32)),
                        Write::AppendEvent(event("r", &format!("good {i}"))),
                    ]
                };
                barrier.wait();
                (i, store.commit_blocking(writes))
            })
        })
        .collect();
    for handle in handles {
        let (i, result) = handle.join().expect("thread");
        if i % 10 == 0 {
            match result {
                Err(Error::Write { index, write, .. }) => {
                    assert_eq!((index, write), (1, "UpsertStep"))
                }
                other => panic!("batch {i}: expected a write error, got {other:?}"),
            }
        } else {
            assert_eq!(
                result.expect("good batch"),
                [Outcome::Done, Outcome::Done],
                "batch {i}"
            );
        }
    }
    let stats = store.stats();
    assert_eq!(stats.batches_submitted, 1 + THREADS as u64);
    assert_eq!(stats.batches_committed, 1 + THREADS as u64 - 5);
    drop(store);

    let store = Store::open(&path).expect("reopen");
    let expected_steps: Vec<String> = (0..THREADS)
        .filter(|i| i % 10 != 0)
        .map(|i| format!("s{i:02}"))
        .collect();
    let steps: Vec<String> = store
        .steps("r")
        .unwrap()
        .into_iter()
        .map(|s| s.step_path)
        .collect();
    assert_eq!(steps, expected_steps);
    let events = store.events("r").unwrap();
    assert_eq!(events.len(), THREADS - 5);
    assert!(events.iter().all(|e| e.msg.starts_with("good")));
    assert!(store.steps("ghost").unwrap().is_empty());
    assert_eq!(store.integrity_check().unwrap(), "ok");
}

#[test]
fn queued_batches_share_one_transaction() {
    let (dir, store) = open_temp();
    // Hold the write lock from outside so that every batch queues up behind it.
    let blocker = raw(&dir.path().join("state.db"));
    blocker.execute_batch("BEGIN IMMEDIATE").expect("lock");

    const THREADS: u64 = 40;
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let store = store.clone();
            std::thread::spawn(move || {
                store.commit_blocking(vec![Write::InsertRun(run(&format!("r{i}")))])
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(3);
    while store.stats().batches_submitted < THREADS {
        assert!(
            Instant::now() < deadline,
            "batches were not submitted in time"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    blocker.execute_batch("COMMIT").expect("unlock");

    for handle in handles {
        assert_eq!(
            handle.join().expect("thread").expect("commit"),
            [Outcome::RunInserted]
        );
    }
    let stats = store.stats();
    assert_eq!(stats.batches_committed, THREADS);
    // The first batch may have been taken before the rest arrived; everything queued
    // while it waited for the lock must then go into one more transaction.
    assert!(
        stats.transactions_committed <= 2,
        "{THREADS} batches took {} transactions",
        stats.transactions_committed
    );
    assert_eq!(
        store.count_runs_with_status(RunStatus::Running).unwrap(),
        THREADS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_async_runs_commit_concurrently() {
    let (_dir, store) = open_temp();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let id = format!("r{i:03}");
                store
                    .commit(vec![
                        Write::InsertRun(run(&id)),
                        Write::UpsertStep(step(&id, "check", 0)),
                        Write::AppendEvent(event(&id, "started")),
                    ])
                    .await
            })
        })
        .collect();
    for task in tasks {
        let out = task.await.expect("task").expect("commit");
        assert_eq!(out, [Outcome::RunInserted, Outcome::Done, Outcome::Done]);
    }
    assert_eq!(
        store.count_runs_with_status(RunStatus::Running).unwrap(),
        200
    );
    assert_eq!(store.steps("r199").unwrap().len(), 1);
}

#[test]
fn events_keep_their_order_per_run() {
    let (_dir, store) = open_temp();
    let handles: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|run_id| {
            let store = store.clone();
            std::thread::spawn(move || {
                for n in 0..30 {
                    let e = event(run_id, &n.to_string());
                    store
                        .commit_blocking(vec![Write::AppendEvent(e)])
                        .expect("commit");
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("thread");
    }
    for run_id in ["a", "b", "c"] {
        let events = store.events(run_id).unwrap();
        let msgs: Vec<String> = events.iter().map(|e| e.msg.clone()).collect();
        let expected: Vec<String> = (0..30).map(|n| n.to_string()).collect();
        assert_eq!(msgs, expected, "run {run_id}");
        assert!(events.windows(2).all(|w| w[0].id < w[1].id));
    }
}

#[test]
fn a_second_handle_on_the_same_file_reads_and_writes() {
    let (dir, server) = open_temp();
    commit(&server, vec![Write::InsertRun(run("r1"))]);
    // Like the CLI opening the database while the server keeps running.
    let cli = Store::open(&dir.path().join("state.db")).expect("second open");
    assert_eq!(cli.run("r1").unwrap().map(|r| r.id), Some("r1".into()));

    commit(&server, vec![Write::UpsertStep(step("r1", "check", 0))]);
    assert_eq!(
        cli.steps("r1").unwrap().len(),
        1,
        "a later commit is visible"
    );

    commit(
        &cli,
        vec![Write::SetKv {
            key: "k".into(),
            value: "from cli".into(),
        }],
    );
    assert_eq!(server.kv("k").unwrap().as_deref(), Some("from cli"));
    assert_eq!(cli.integrity_check().unwrap(), "ok");
}

#[test]
fn a_batch_that_aborts_the_whole_transaction_does_not_take_the_others_down() {
    let (dir, store) = open_temp();
    let blocker = raw(&dir.path().join("state.db"));
    // RAISE(ROLLBACK) ends the entire transaction, not just the batch's savepoint, the
    // way an I/O error or a full disk would.
    blocker
        .execute_batch(
            "CREATE TRIGGER boom BEFORE INSERT ON kv WHEN NEW.key = 'boom' \
             BEGIN SELECT RAISE(ROLLBACK, 'boom'); END;
             BEGIN IMMEDIATE;",
        )
        .expect("trigger and lock");

    let handles: Vec<_> = ["a", "b", "boom", "c", "d"]
        .into_iter()
        .map(|key| {
            let store = store.clone();
            std::thread::spawn(move || {
                let write = Write::SetKv {
                    key: key.into(),
                    value: "v".into(),
                };
                (key, store.commit_blocking(vec![write]))
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(3);
    while store.stats().batches_submitted < 5 {
        assert!(
            Instant::now() < deadline,
            "batches were not submitted in time"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    blocker.execute_batch("COMMIT").expect("unlock");

    for handle in handles {
        let (key, result) = handle.join().expect("thread");
        if key == "boom" {
            match result {
                Err(Error::Write { write, .. }) => assert_eq!(write, "SetKv"),
                other => panic!("expected the boom batch to fail, got {other:?}"),
            }
        } else {
            assert_eq!(result.expect("commit"), [Outcome::Done], "batch {key}");
        }
    }
    for key in ["a", "b", "c", "d"] {
        assert_eq!(store.kv(key).unwrap().as_deref(), Some("v"), "key {key}");
    }
    assert_eq!(store.kv("boom").unwrap(), None);
    assert_eq!(store.stats().batches_committed, 4);
}
