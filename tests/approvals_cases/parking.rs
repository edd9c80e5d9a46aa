//! `serve` parks runs that wait for a human (engine/runner/park.rs): the driver
//! ends once the approval is committed, and the run is driven again by the
//! decision, the deadline or a cancellation. These tests check that, from the
//! outside, a parked wait is one uninterrupted wait, and that every way out of it
//! drives the run exactly once.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::approvals_support::{gate, seconds_between, Harness};
use crate::crash_support::{event_names, events, step};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_wait_reads_as_one_wait_and_counts_as_in_progress() {
    let h = Harness::start(&[("gate", gate("gate", "production", 120.0))], "").await;
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    h.svc.wait_step(&run, "approve", "waiting").await;
    // The run holds no task, but it is still a run in progress.
    wait_metric(&h, "vectorstep_runs_in_progress", 1.0).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;

    assert_eq!(h.decide(&a.token, "approve").await, 200);
    let done = h.svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    // Unparking logs nothing about restarts and does not start the step again.
    let names = event_names(&done);
    for absent in ["run_resumed", "approval_rearmed"] {
        assert!(!names.iter().any(|n| n == absent), "{absent} in {names:?}");
    }
    let started: Vec<_> = events(&done, "step_started")
        .into_iter()
        .filter(|e| e["step"] == "approve")
        .collect();
    assert_eq!(started.len(), 1, "{names:?}");
    // The step's record spans the whole wait, from the original start.
    let s = step(&done, "approve");
    assert_eq!(s["status"], "completed", "{s}");
    let waited = seconds_between(
        s["started_at"].as_str().unwrap_or(""),
        s["finished_at"].as_str().unwrap_or(""),
    );
    assert!(waited >= 1.0, "the step lasted {waited}s: {s}");
    assert_eq!(step(&done, "after")["status"], "completed");
    assert_eq!(done["resume_count"], 0, "{done}");
    wait_metric(&h, "vectorstep_runs_in_progress", 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parked_run_ends_it_now_and_closes_its_approval() {
    let h = Harness::start(&[("gate", gate("gate", "production", 600.0))], "").await;
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    h.svc.wait_step(&run, "approve", "waiting").await;
    let t = Instant::now();
    let cancel = h
        .http
        .post(h.svc.url(&format!("/runs/{run}/cancel")))
        .send()
        .await
        .expect("cancel");
    assert!(cancel.status().is_success());
    let done = h.svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "not woken by the cancel"
    );
    assert_eq!(h.decide(&a.token, "approve").await, 409);
    assert!(
        crate::crash_support::step_of(&done, "after").is_none(),
        "{done}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_parked_runs_decided_at_once_each_continue_exactly_once() {
    let h = Harness::start(&[("gate", gate("gate", "production", 120.0))], "").await;
    let mut runs = Vec::new();
    for i in 0..12 {
        runs.push(h.svc.post_run("gate", json!({"n": i})).await);
    }
    let mut tokens = Vec::new();
    for run in &runs {
        tokens.push(h.approval(run, "approve").await.token);
        h.svc.wait_step(run, "approve", "waiting").await;
    }
    // Every decision at once, half of them twice: the first wins, the run goes on once.
    let mut presses = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let copies = if i % 2 == 0 { 2 } else { 1 };
        for _ in 0..copies {
            let (http, url) = (h.http.clone(), h.svc.url(&format!("/approvals/{token}")));
            presses.push(tokio::spawn(async move {
                http.post(url)
                    .json(&json!({"decision": "approve", "by": "bulk"}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            }));
        }
    }
    let mut codes = Vec::new();
    for p in presses {
        codes.push(p.await.expect("press"));
    }
    assert_eq!(
        codes.iter().filter(|c| **c == 200).count(),
        runs.len(),
        "{codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|c| **c == 409).count(),
        runs.len() / 2,
        "{codes:?}"
    );
    for run in &runs {
        let done = h.svc.wait_terminal(run).await;
        assert_eq!(done["status"], "completed", "{done}");
        let names = event_names(&done);
        for once in ["approval_decided", "run_finished"] {
            assert_eq!(
                names.iter().filter(|n| *n == once).count(),
                1,
                "{once}: {names:?}"
            );
        }
        let after_started = events(&done, "step_started")
            .into_iter()
            .filter(|e| e["step"] == "after")
            .count();
        assert_eq!(after_started, 1, "{names:?}");
    }
}

/// Polls `/metrics` until the unlabelled series `name` reads `want`.
async fn wait_metric(h: &Harness, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = h.metric(name, &[]).await;
        if got == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{name} is {got:?}, never {want}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
