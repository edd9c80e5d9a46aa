//! A tool call that needs approval (`approval: required`) goes through the same
//! Telegram path as a human step: one message naming the tool and its arguments,
//! with the same buttons, and `serve` parks the run on it. These tests kill `serve`
//! with SIGKILL around the decision and check, through the fake Bot API and the fake
//! peer that plays the model and the tool, that nobody is asked twice and the tool
//! runs once.

use serde_json::json;

use crate::approvals_support::{Harness, APPROVER};
use crate::common::tool_agent::{self, MODEL, TOOL};
use crate::crash_support::{event_names, events, step, HoldingPeer};

async fn start(env: &[(&str, &str)]) -> (Harness, HoldingPeer) {
    let peer = tool_agent::peer().await;
    let h = Harness::start_env(
        &[("agent", tool_agent::pipeline("agent"))],
        &tool_agent::config(&peer.url()),
        "approvers: [\"42\"]",
        env,
    )
    .await;
    (h, peer)
}

/// Asserts the end every test wants: completed, the model asked twice (the
/// proposing turn once, the answer once), one message, one request, the tool once.
fn assert_once(h: &Harness, peer: &HoldingPeer, done: &serde_json::Value) {
    assert_eq!(done["status"], "completed", "{:?}", event_names(done));
    assert_eq!(peer.count_path(TOOL), 1, "approved once, run once");
    assert_eq!(
        peer.count_path(MODEL),
        2,
        "the proposing turn was not asked again"
    );
    assert_eq!(h.tg.count("sendMessage"), 1, "the request was sent again");
    assert_eq!(
        events(done, "tool_approval_requested").len(),
        1,
        "{:?}",
        event_names(done)
    );
    let decided = events(done, "tool_approval_decided");
    assert_eq!(decided.len(), 1, "{:?}", event_names(done));
    assert_eq!(decided[0]["approved"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_original_button_approves_a_tool_call_after_a_kill_and_the_tool_runs_once() {
    let (mut h, peer) = start(&[]).await;
    let run = h.svc.post_run("agent", json!({})).await;
    let a = h.approval(&run, "triage").await;
    let (chat, msg) = h.delivered(&a.token).await;
    h.svc.wait_step(&run, "triage", "waiting").await;

    // One message, naming the tool and its arguments (escaped: the model chose them).
    let sent = h.tg.calls_of("sendMessage");
    assert_eq!(sent.len(), 1, "{sent:?}");
    let text = sent[0].params["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(text.contains("<b>restart_service</b>"), "{text}");
    assert!(
        text.contains("api&lt;b&gt;&amp;"),
        "arguments escaped: {text}"
    );
    let row = &sent[0].params["reply_markup"]["inline_keyboard"][0];
    assert_eq!(row[0]["callback_data"], format!("approve:{}", a.token));
    assert_eq!(peer.count_path(TOOL), 0, "nothing runs before the decision");

    h.svc.kill9();
    h.svc.restart().await;
    h.svc.wait_step(&run, "triage", "waiting").await;
    // The restarted service re-armed the same request and sent nothing.
    assert_eq!(h.tg.count("sendMessage"), 1, "the request was sent again");

    let press =
        h.tg.press(APPROVER, chat, msg, &format!("approve:{}", a.token));
    assert_eq!(h.tg.answer_to(press).await, "Approved");
    let done = h.svc.wait_terminal(&run).await;
    assert_once(&h, &peer, &done);
    assert_eq!(step(&done, "triage")["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_right_after_the_decision_neither_asks_again_nor_runs_the_tool_twice() {
    // The first process stops at the tool call, right after the decision and the
    // call's `started` record are committed, and is killed there.
    let pause = vectorstep::runner::agent::PAUSE_BEFORE_TOOL_CALL;
    let (mut h, peer) = start(&[(pause, "1")]).await;
    let run = h.svc.post_run("agent", json!({})).await;
    let a = h.approval(&run, "triage").await;
    let (chat, msg) = h.delivered(&a.token).await;
    h.svc.wait_step(&run, "triage", "waiting").await;

    let press =
        h.tg.press(APPROVER, chat, msg, &format!("approve:{}", a.token));
    assert_eq!(h.tg.answer_to(press).await, "Approved");
    let store = h.dir.open_store();
    h.wait("the approved call recorded as started", || {
        let j = store.journal(&run, "triage").ok()?;
        j.calls
            .iter()
            .any(|c| c.status == vectorstep::domain::ToolCallStatus::Started)
            .then_some(())
    })
    .await;
    assert_eq!(peer.count_path(TOOL), 0, "held at the pause point");
    h.svc.kill9();
    h.svc.restart().await;

    let done = h.svc.wait_terminal(&run).await;
    assert_once(&h, &peer, &done);
    // The call was in flight (a write, `durable: true`): run again, attempt 2.
    let seen = peer.for_path(TOOL);
    assert_eq!(seen[0].attempt(), 2, "{:?}", seen[0]);
}
