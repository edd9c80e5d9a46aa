//! Delivery of approval requests: team routes to a chat webhook, a Bot API that
//! fails or hangs, and text Telegram refuses as HTML. None of it may lose an
//! approval: the page keeps deciding while the message is retried.

use std::time::Duration;

use serde_json::json;

use super::approve;
use crate::approvals_support::{gate, Harness, APPROVER};
use crate::crash_support::{HoldingPeer, Reply};
use crate::telegram_fake::Failure;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_server_errors_delay_the_message_but_never_lose_the_approval() {
    let h = Harness::start(&[("gate", gate("gate", "production", 300.0))], "").await;
    h.tg.fail_next("sendMessage", 2, Failure::ServerError);
    h.tg.fail_next("getUpdates", 2, Failure::ServerError);
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    let sent = h.tg.wait_calls("sendMessage", 3).await;
    assert!(sent
        .iter()
        .all(
            |c| c.params["reply_markup"]["inline_keyboard"][0][0]["callback_data"]
                == approve(&a.token)
        ));
    let (chat, msg) = h.delivered(&a.token).await;
    let press = h.tg.press(APPROVER, chat, msg, &approve(&a.token));
    assert_eq!(h.tg.answer_to(press).await, "Approved");
    assert_eq!(h.svc.wait_terminal(&run).await["status"], "completed");
    assert_eq!(h.tg.count("sendMessage"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_telegram_leaves_the_page_working() {
    let h = Harness::start(&[("gate", gate("gate", "production", 300.0))], "").await;
    h.tg.fail_next("sendMessage", 1, Failure::Hang);
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    h.tg.wait_calls("sendMessage", 1).await;
    assert_eq!(h.decide(&a.token, "approve").await, 200);
    assert_eq!(h.svc.wait_terminal(&run).await["status"], "completed");
    // The hung send times out after 10 s; the approval is decided, so it is not retried.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(h.tg.count("sendMessage"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_route_posts_to_its_webhook_and_cancelling_closes_the_chat_message() {
    let hook = HoldingPeer::answering(Reply::ok()).await;
    let auth = "auth: {teams: [{name: db, token: dbtok}, {name: sre, token: sretok}], operators: [{name: ops, token: optok}]}\n";
    let teams = format!(
        "approvers: []\n  teams:\n    db: {{channel: webhook, url: \"{}/hook\"}}\n",
        hook.url()
    );
    let mut h =
        Harness::start_with(&[("gate", gate("gate", "production", 120.0))], auth, &teams).await;
    // Reading and cancelling runs are operator routes.
    h.svc.bearer = Some("optok".into());
    let post = |token: &'static str| {
        h.http
            .post(h.svc.url("/pipelines/gate/run"))
            .bearer_auth(token)
            .json(&json!({}))
            .send()
    };
    let db: serde_json::Value = post("dbtok").await.unwrap().json().await.unwrap();
    let db_run = db["run_id"].as_str().unwrap().to_string();
    let a = h.approval(&db_run, "approve").await;
    hook.wait_for_path("/hook", 1).await;
    let seen = &hook.for_path("/hook")[0];
    assert_eq!(seen.key(), a.token);
    let body: serde_json::Value = serde_json::from_str(&seen.body).unwrap();
    let page = format!("http://vs.example/approvals/{}", a.token);
    assert_eq!(body["url"], page.as_str());
    assert!(body["text"]
        .as_str()
        .unwrap()
        .ends_with(&format!("Approve or reject: {page}")));

    // The other team falls through to notifications.telegram; anyone in the chat may
    // decide (no approvers), but here the run is cancelled instead.
    let sre: serde_json::Value = post("sretok").await.unwrap().json().await.unwrap();
    let sre_run = sre["run_id"].as_str().unwrap().to_string();
    let b = h.approval(&sre_run, "approve").await;
    h.delivered(&b.token).await;
    let cancel = h
        .http
        .post(h.svc.url(&format!("/runs/{sre_run}/cancel")))
        .bearer_auth("optok")
        .send()
        .await
        .unwrap();
    assert!(cancel.status().is_success());
    let done = h.svc.wait_terminal(&sre_run).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    let edit = h.tg.wait_calls("editMessageText", 1).await;
    assert!(
        edit[0].params["text"]
            .as_str()
            .unwrap_or("")
            .contains("Closed"),
        "{edit:?}"
    );
    assert_eq!(
        h.tg.count("sendMessage"),
        1,
        "the db team's request went to its webhook only"
    );
    assert_eq!(h.decide(&a.token, "reject").await, 200);
    assert_eq!(h.svc.wait_terminal(&db_run).await["status"], "escalated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_telegram_cannot_parse_as_html_is_sent_as_plain_text() {
    let yaml =
        gate("odd", "production", 120.0).replace("<b>Restart the web tier?</b>", "Owner: <none>");
    let h = Harness::start(&[("odd", yaml)], "").await;
    let run = h.svc.post_run("odd", json!({})).await;
    let a = h.approval(&run, "approve").await;
    let (chat, msg) = h.delivered(&a.token).await;
    let sent = h.tg.calls_of("sendMessage");
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[0].params["parse_mode"], "HTML");
    assert!(sent[1].params.get("parse_mode").is_none_or(|m| m.is_null()));
    assert_eq!(sent[1].params["text"], "Owner: <none> (odd)");
    let press = h.tg.press(APPROVER, chat, msg, &approve(&a.token));
    assert_eq!(h.tg.answer_to(press).await, "Approved");
    assert_eq!(h.svc.wait_terminal(&run).await["status"], "completed");
    // The edit falls back the same way.
    let edits = h.tg.wait_calls("editMessageText", 2).await;
    assert!(edits[1].params["text"]
        .as_str()
        .unwrap_or("")
        .contains("Approved by"));
}
