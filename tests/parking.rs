//! Parking in-process: with parking on (as `serve` runs), a top-level human step
//! ends its run's driver once the approval is committed, and a decision drives the
//! run on; a human step that must keep state in its task (here `retry`) waits there.
//! The end-to-end side (real binary, page, cancel, bulk decisions) is in
//! `tests/approvals_cases/parking.rs`.

mod common;
use common::engine_support;

use std::time::{Duration, Instant};

use engine_support::Scratch;
use vectorstep::domain::{ApprovalStatus, RunStatus};
use vectorstep::runner::{Created, DriveMode, RunEnd};
use vectorstep::store::{Outcome, Store};

const GATE: &str = concat!(
    "name: gate\nstage: production\ndurable: true\ntrigger: {}\nsteps:\n",
    "  - name: approve\n    executor: human\n    timeout_seconds: 600\n    prompt_template: \"go?\"\n",
    "  - name: after\n    executor: mock\n",
    "    executor_config: {output: {confidence: 0.9, summary: after, next_step_context: \"\"}}\n",
);

const RETRIED: &str = concat!(
    "name: retried\nstage: production\ndurable: true\ntrigger: {}\nsteps:\n",
    "  - name: approve\n    executor: human\n    timeout_seconds: 600\n    prompt_template: \"go?\"\n",
    "    retry: {attempts: 2}\n",
);

/// An engine with parking on, as `serve` sets it up.
fn setup() -> Scratch {
    let s = engine_support::engine_with(&[("gate", GATE), ("retried", RETRIED)]);
    s.engine.enable_parking();
    s
}

async fn create(s: &Scratch, pipeline: &str) -> String {
    match engine_support::create(&s.engine, pipeline, None).await {
        Created::Inserted(id) => id,
        other => panic!("create_run: {other:?}"),
    }
}

/// A new `gate` run driven until it parks; its id and approval token.
async fn parked_run(s: &Scratch) -> (String, String) {
    let id = create(s, "gate").await;
    let end = s.engine.drive(&id, DriveMode::New).await.expect("drive");
    assert_eq!(end, RunEnd::Parked);
    let token = s.store.approvals_of_run(&id).expect("approvals")[0]
        .token
        .clone();
    (id, token)
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < Duration::from_secs(20), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn status(s: &Scratch, id: &str) -> String {
    s.store
        .run(id)
        .ok()
        .flatten()
        .map(|r| r.status.to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_level_human_step_parks_its_run_and_the_decision_drives_it_on() {
    let s = setup();
    let (id, token) = parked_run(&s).await;
    assert_eq!(s.engine.parked_runs(), 1);
    assert_eq!(s.engine.active_runs(), 0, "a parked run holds no driver");
    let steps = s.store.steps(&id).expect("steps");
    assert_eq!(steps[0].status, "waiting");

    let decided = s
        .engine
        .decide_approval(&token, true, "alice")
        .await
        .expect("decide");
    assert_eq!(decided, Outcome::ApprovalDecided);
    assert_eq!(s.engine.parked_runs(), 0);
    until("the run completes", || status(&s, &id) == "completed").await;
    let steps = s.store.steps(&id).expect("steps");
    assert_eq!(
        steps.iter().map(|r| r.status.as_str()).collect::<Vec<_>>(),
        ["completed", "completed"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_human_step_with_retry_waits_in_its_task() {
    let s = setup();
    let id = create(&s, "retried").await;
    let driver = {
        let (engine, id) = (s.engine.clone(), id.clone());
        tokio::spawn(async move { engine.drive(&id, DriveMode::New).await })
    };
    until("the approval is requested", || {
        s.store
            .approvals_of_run(&id)
            .map(|a| !a.is_empty())
            .unwrap_or(false)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.engine.parked_runs(), 0);
    assert_eq!(s.engine.active_runs(), 1, "the driver waits in its task");
    let token = s.store.approvals_of_run(&id).expect("approvals")[0]
        .token
        .clone();
    s.engine
        .decide_approval(&token, true, "alice")
        .await
        .expect("decide");
    let end = tokio::time::timeout(Duration::from_secs(20), driver)
        .await
        .expect("driver ends")
        .expect("task")
        .expect("drive");
    assert_eq!(end, RunEnd::Finished(RunStatus::Completed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_parked_run_drives_it_to_cancelled() {
    let s = setup();
    let (id, token) = parked_run(&s).await;
    assert!(s.engine.parked_runs() == 1, "parked on {token}");
    s.engine.cancel(&id);
    until("the cancelled run ends", || status(&s, &id) == "cancelled").await;
    assert_eq!(s.engine.parked_runs(), 0);
    let a = s.store.approval(&token).expect("read").expect("row");
    assert_eq!(a.status, "closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_written_by_another_process_unparks_the_run() {
    let s = setup();
    let (id, token) = parked_run(&s).await;
    // Straight into the store, as a second process on the same database would:
    // nothing in this engine is told about it.
    let other = Store::open(s.store.path().expect("a SQLite store")).expect("second handle");
    let out = other
        .commit(vec![vectorstep::store::Write::DecideApproval {
            token: token.clone(),
            status: ApprovalStatus::Approved,
            by: Some("elsewhere".into()),
            at: s.engine.now_ms(),
        }])
        .await
        .expect("decide elsewhere");
    assert_eq!(out, vec![Outcome::ApprovalDecided]);
    // The keeper's periodic check (every 5 s) finds it and drives the run on.
    until("the run completes", || status(&s, &id) == "completed").await;
    assert_eq!(s.engine.parked_runs(), 0);
}

/// An engine with parking on whose pipeline `agent` runs a tool-using agent whose
/// one tool needs approval (see `common::tool_agent`), and the agent's peer.
async fn agent_setup() -> (Scratch, common::crash_support::HoldingPeer) {
    use common::tool_agent;
    let peer = tool_agent::peer().await;
    let s = engine_support::engine_with_config(
        &[("agent", &tool_agent::pipeline("agent"))],
        &tool_agent::config(&peer.url()),
    );
    s.engine.enable_parking();
    (s, peer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_waiting_for_approval_parks_its_run_and_the_decision_drives_it_on() {
    use common::tool_agent::{MODEL, TOOL};
    let (s, peer) = agent_setup().await;
    let id = create(&s, "agent").await;
    let end = s.engine.drive(&id, DriveMode::New).await.expect("drive");
    assert_eq!(
        end,
        RunEnd::Parked,
        "the driver ends on the tool's approval"
    );
    assert_eq!(s.engine.parked_runs(), 1);
    assert_eq!(s.engine.active_runs(), 0, "a parked run holds no driver");
    assert_eq!(s.store.steps(&id).expect("steps")[0].status, "waiting");
    assert_eq!(peer.count_path(TOOL), 0, "nothing runs before the decision");
    let token = s.store.approvals_of_run(&id).expect("approvals")[0]
        .token
        .clone();

    s.engine
        .decide_approval(&token, true, "alice")
        .await
        .expect("decide");
    until("the run completes", || status(&s, &id) == "completed").await;
    assert_eq!(s.engine.parked_runs(), 0);
    assert_eq!(peer.count_path(TOOL), 1, "approved once, run once");
    assert_eq!(
        peer.count_path(MODEL),
        2,
        "the proposing turn is not asked again"
    );
    let steps = s.store.steps(&id).expect("steps");
    assert_eq!(steps[0].status, "completed");
    // To the run log the parked wait is one wait: nothing was "reused".
    let log = s.store.events(&id).expect("events");
    let names: Vec<&str> = log.iter().map(|e| e.event.as_str()).collect();
    for absent in ["agent_turn_reused", "tool_call_reused", "step_started"] {
        let n = names.iter().filter(|n| **n == absent).count();
        let allowed = usize::from(absent == "step_started");
        assert_eq!(n, allowed, "{absent} x{n} in {names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_tool_approval_that_times_out_hands_the_model_the_timeout() {
    use common::tool_agent::{MODEL, TOOL};
    let (s, peer) = agent_setup().await;
    let id = create(&s, "agent").await;
    assert_eq!(
        s.engine.drive(&id, DriveMode::New).await.expect("drive"),
        RunEnd::Parked
    );
    let token = s.store.approvals_of_run(&id).expect("approvals")[0]
        .token
        .clone();
    // Pull the deadline in, as time passing would; the keeper finds it due.
    let other = Store::open(s.store.path().expect("a SQLite store")).expect("second handle");
    other
        .commit(vec![vectorstep::store::Write::DecideApproval {
            token: token.clone(),
            status: ApprovalStatus::Timeout,
            by: None,
            at: s.engine.now_ms(),
        }])
        .await
        .expect("time out elsewhere");
    until("the run completes", || status(&s, &id) == "completed").await;
    assert_eq!(peer.count_path(TOOL), 0, "a timed-out call never runs");
    let asked = peer.for_path(MODEL);
    assert_eq!(asked.len(), 2);
    let last = asked[1].json().to_string();
    assert!(last.contains("nobody approved this call"), "{last}");
}
