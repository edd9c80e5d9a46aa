//! Human approvals end to end (SPEC 2, 6.4, 8; reference section 6): the real
//! `vectorstep serve` talks to a fake Telegram Bot API on 127.0.0.1. The fake
//! records every call, so "one message", "answered" and "never re-sent" are
//! assertions, and button presses are queued the way Telegram would hand them out.

mod common;
use common::{approvals_support, crash_support, telegram_fake};

/// Delivery: team routes, chat failures, text Telegram refuses.
#[path = "approvals_cases/delivery.rs"]
mod delivery;

/// Runs parked without a task: unparked by decisions, cancellation, deadlines.
#[path = "approvals_cases/parking.rs"]
mod parking;

/// Tool calls of agents that need approval: the same message, buttons and parking.
#[path = "approvals_cases/tool_approvals.rs"]
mod tool_approvals;

use std::time::{Duration, Instant};

use approvals_support::{fan_out_gate, gate, seconds_between, Harness, APPROVER, STRANGER};
use crash_support::{event, events, step};
use serde_json::json;
use telegram_fake::CHAT;

fn approve(token: &str) -> String {
    format!("approve:{token}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_button_completes_the_run_after_one_message_with_two_buttons() {
    let h = Harness::start(&[("gate", gate("gate", "production", 120.0))], "").await;
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    let (chat, msg) = h.delivered(&a.token).await;
    h.svc.wait_step(&run, "approve", "waiting").await;

    let sent = h.tg.calls_of("sendMessage");
    assert_eq!(sent.len(), 1, "{sent:?}");
    let p = &sent[0].params;
    assert_eq!(p["chat_id"], json!(CHAT));
    assert_eq!(p["parse_mode"], "HTML");
    assert_eq!(p["text"], "<b>Restart the web tier?</b> (gate)");
    let row = &p["reply_markup"]["inline_keyboard"][0];
    assert_eq!(row[0]["text"], "✅ Approve");
    assert_eq!(row[0]["callback_data"], approve(&a.token));
    assert_eq!(row[1]["text"], "❌ Reject");
    assert_eq!(row[1]["callback_data"], format!("reject:{}", a.token));
    assert_eq!(a.token.len(), 32, "128-bit hex token");
    assert_eq!(
        h.metric("vectorstep_human_approvals_pending", &[]).await,
        Some(1.0)
    );

    let press = h.tg.press(APPROVER, chat, msg, &approve(&a.token));
    assert_eq!(h.tg.answer_to(press).await, "Approved");
    let done = h.svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(step(&done, "approve")["output"]["approved"], true);
    assert_eq!(
        event(&done, "approval_decided")["by"],
        "@user42 (Telegram 42)"
    );
    // The message now says who decided, and its buttons are gone.
    let edits = h.tg.wait_calls("editMessageText", 1).await;
    let text = edits[0].params["text"].as_str().unwrap_or("");
    assert!(text.contains("Approved by @user42"), "{text}");
    assert_eq!(edits[0].params["message_id"], json!(msg));
    assert!(edits[0]
        .params
        .get("reply_markup")
        .is_none_or(|m| m.is_null()));
    assert_eq!(
        h.metric("vectorstep_human_approvals_pending", &[]).await,
        Some(0.0)
    );
    let approved = ["decision=\"approved\"", "pipeline=\"gate\""];
    assert_eq!(
        h.metric("vectorstep_human_approval_decisions_total", &approved)
            .await,
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_button_escalates_the_run() {
    let h = Harness::start(&[("gate", gate("gate", "production", 120.0))], "").await;
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    let (chat, msg) = h.delivered(&a.token).await;
    let press =
        h.tg.press(APPROVER, chat, msg, &format!("reject:{}", a.token));
    assert_eq!(h.tg.answer_to(press).await, "Rejected");
    let done = h.svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "escalated", "{done}");
    assert!(crash_support::step_of(&done, "after").is_none(), "{done}");
    let edits = h.tg.wait_calls("editMessageText", 1).await;
    assert!(edits[0].params["text"]
        .as_str()
        .unwrap_or("")
        .contains("Rejected by"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presses_from_outside_the_approvers_or_the_chat_decide_nothing() {
    let h = Harness::start(&[("gate", gate("gate", "production", 120.0))], "").await;
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    let (chat, msg) = h.delivered(&a.token).await;

    let stranger = h.tg.press(STRANGER, chat, msg, &approve(&a.token));
    assert!(h
        .tg
        .answer_to(stranger)
        .await
        .contains("not on the approvers list"));
    let elsewhere = h.tg.press(APPROVER, -999, msg, &approve(&a.token));
    assert!(h.tg.answer_to(elsewhere).await.contains("this chat"));
    let unknown = h.tg.press(
        APPROVER,
        chat,
        msg,
        "approve:0123456789abcdef0123456789abcdef",
    );
    assert_eq!(
        h.tg.answer_to(unknown).await,
        "Unknown or expired approval."
    );
    let junk = h.tg.press(APPROVER, chat, msg, "launch:missiles");
    assert!(!h.tg.answer_to(junk).await.is_empty());

    let row = h.dir.open_store().approval(&a.token).unwrap().unwrap();
    assert_eq!(row.status, "pending");
    assert!(events(&h.svc.get_run(&run).await, "approval_decided").is_empty());

    let ok = h.tg.press(APPROVER, chat, msg, &approve(&a.token));
    assert_eq!(h.tg.answer_to(ok).await, "Approved");
    assert_eq!(h.svc.wait_terminal(&run).await["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_quick_presses_decide_once() {
    let h = Harness::start(&[("gate", gate("gate", "production", 120.0))], "").await;
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    let (chat, msg) = h.delivered(&a.token).await;
    let first = h.tg.press(APPROVER, chat, msg, &approve(&a.token));
    let second =
        h.tg.press(APPROVER, chat, msg, &format!("reject:{}", a.token));
    assert_eq!(h.tg.answer_to(first).await, "Approved");
    assert_eq!(h.tg.answer_to(second).await, "Already decided.");
    let done = h.svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(events(&done, "approval_decided").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rearms_without_resending_and_the_original_button_still_approves() {
    let mut h = Harness::start(&[("gate", gate("gate", "production", 120.0))], "").await;
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    let (chat, msg) = h.delivered(&a.token).await;
    h.svc.kill9();
    h.svc.restart().await;

    let resumed = h.svc.wait_event(&run, "approval_rearmed").await;
    assert_eq!(
        event(&resumed, "approval_rearmed")["token"],
        a.token.as_str()
    );
    assert_eq!(
        h.metric("vectorstep_human_approvals_pending", &[]).await,
        Some(1.0)
    );
    let press = h.tg.press(APPROVER, chat, msg, &approve(&a.token));
    assert_eq!(h.tg.answer_to(press).await, "Approved");
    let done = h.svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(h.tg.count("sendMessage"), 1, "the request was sent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_survives_a_restart() {
    let mut h = Harness::start(&[("gate", gate("gate", "production", 3.0))], "").await;
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    h.delivered(&a.token).await;
    // Kill about 2 s into the 3 s wait.
    let kill_at = a.created_at + 2000;
    let now = chrono::Utc::now().timestamp_millis();
    tokio::time::sleep(Duration::from_millis((kill_at - now).max(0) as u64)).await;
    h.svc.kill9();
    h.svc.restart().await;
    let ready = Instant::now();

    let done = h.svc.wait_terminal(&run).await;
    let waited = ready.elapsed().as_secs_f64();
    assert_eq!(done["status"], "failed", "{done}");
    assert!(
        waited < 2.5,
        "the run failed {waited:.2}s after the restart: the wait started over"
    );
    let deadline = event(&done, "approval_requested")["deadline_at"]
        .as_str()
        .unwrap()
        .to_string();
    let timed_out = event(&done, "approval_timed_out");
    let late = seconds_between(&deadline, timed_out["ts"].as_str().unwrap());
    assert!(
        (-0.05..1.0).contains(&late),
        "timed out {late:.2}s after the original deadline"
    );
    assert!(step(&done, "approve")["error"]
        .as_str()
        .unwrap_or("")
        .contains("timed out"));
    let timeout = ["decision=\"timeout\""];
    assert_eq!(
        h.metric("vectorstep_human_approval_decisions_total", &timeout)
            .await,
        Some(1.0)
    );
    assert_eq!(h.tg.count("sendMessage"), 1);
    let edit = h.tg.wait_calls("editMessageText", 1).await;
    assert!(edit[0].params["text"]
        .as_str()
        .unwrap_or("")
        .contains("Timed out"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_human_step_in_a_fan_out_branch_survives_a_restart() {
    let mut h = Harness::start(&[("fan", fan_out_gate("fan", "[\"db\"]"))], "").await;
    let run = h.svc.post_run("fan", json!({})).await;
    let a = h.approval(&run, "each/0").await;
    let (chat, msg) = h.delivered(&a.token).await;
    assert_eq!(
        h.tg.calls_of("sendMessage")[0].params["text"],
        "Restart db?"
    );
    h.svc.kill9();
    h.svc.restart().await;

    let resumed = h.svc.wait_event(&run, "approval_rearmed").await;
    assert_eq!(
        event(&resumed, "approval_rearmed")["token"],
        a.token.as_str()
    );
    let press = h.tg.press(APPROVER, chat, msg, &approve(&a.token));
    assert_eq!(h.tg.answer_to(press).await, "Approved");
    let done = h.svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(h.tg.count("sendMessage"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_press_made_while_the_service_was_down_is_applied_at_start() {
    let mut h = Harness::start(&[("gate", gate("gate", "production", 120.0))], "").await;
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    let (chat, msg) = h.delivered(&a.token).await;
    h.svc.kill9();
    let press = h.tg.press(APPROVER, chat, msg, &approve(&a.token));
    h.svc.restart().await;

    let done = h.svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    h.tg.answer_to(press).await;
    // The offset moved past the press, so a later start will not see it again.
    h.tg.wait_for("the press confirmed", |_| !h.tg.unconfirmed(press))
        .await;
    assert_eq!(h.tg.count("sendMessage"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approvals_api_decides_once_and_knows_its_tokens() {
    let h = Harness::start(&[("gate", gate("gate", "production", 120.0))], "").await;
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    let (_, msg) = h.delivered(&a.token).await;
    assert_eq!(h.decide(&a.token, "approve").await, 200);
    assert_eq!(h.decide(&a.token, "reject").await, 409);
    assert_eq!(
        h.decide("0123456789abcdef0123456789abcdef", "approve")
            .await,
        404
    );
    let done = h.svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    // The chat shows a decision made on the page too.
    let edit = h.tg.wait_calls("editMessageText", 1).await;
    assert_eq!(edit[0].params["message_id"], json!(msg));
    assert!(edit[0].params["text"]
        .as_str()
        .unwrap_or("")
        .contains("Approved by alice"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testing_stage_sends_nothing_and_auto_approves_at_the_deadline() {
    let h = Harness::start(&[("trial", gate("trial", "testing", 1.0))], "").await;
    let run = h.svc.post_run("trial", json!({})).await;
    let done = h.svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(step(&done, "approve")["output"]["approved"], true);
    assert_eq!(event(&done, "approval_timed_out")["auto_approved"], true);
    assert_eq!(h.tg.count("sendMessage"), 0);
    assert_eq!(h.tg.count("editMessageText"), 0);
    let row = h.dir.open_store().approvals_of_run(&run).unwrap();
    assert_eq!(row[0].channel, None, "{row:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_timeout_asks_again_with_a_new_token() {
    let yaml = gate("retry", "production", 1.0).replace(
        "    timeout_seconds: 1\n",
        "    timeout_seconds: 1\n    retry: {attempts: 2, backoff: fixed, delay_seconds: 0}\n",
    );
    let h = Harness::start(&[("retry", yaml)], "").await;
    let run = h.svc.post_run("retry", json!({})).await;
    let sent = h.tg.wait_calls("sendMessage", 2).await;
    let data =
        |i: usize| sent[i].params["reply_markup"]["inline_keyboard"][0][0]["callback_data"].clone();
    assert_ne!(data(0), data(1), "the retry reused the timed-out request");
    let rows = h.dir.open_store().approvals_of_run(&run).unwrap();
    let second = rows
        .iter()
        .find(|a| a.status == "pending")
        .expect("a pending second request");
    let (chat, msg) = h.delivered(&second.token).await;
    let press = h.tg.press(APPROVER, chat, msg, &approve(&second.token));
    assert_eq!(h.tg.answer_to(press).await, "Approved");
    let done = h.svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(events(&done, "approval_requested").len(), 2);
}
