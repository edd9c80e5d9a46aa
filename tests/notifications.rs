//! Notification delivery end to end: the real `vectorstep serve` sends escalation
//! messages to a fake Telegram Bot API and `notify` steps to a fake webhook on
//! 127.0.0.1, both of which count what arrives. An outage of either keeps the
//! message queued and retried, across a restart, until it gets through once, or
//! until `notifications.max_age_seconds` has passed and `notification_failed` is
//! logged once.

mod common;
use common::{approvals_support, crash_support, telegram_fake};

use std::time::{Duration, Instant};

use approvals_support::{gate, Harness};
use crash_support::{event, events, step, Answer, HoldingPeer, Reply, Scratch, Service};
use serde_json::{json, Value};
use telegram_fake::FakeTelegram;

/// How long the chat is down in the outage tests.
const OUTAGE: Duration = Duration::from_secs(20);
/// How long a message may take to arrive once the chat is back: the retry waits
/// double up to 60 s, so after a 20 s outage the next try is at most ~32 s away.
const AFTER_OUTAGE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

/// A production pipeline whose only step is not confident enough, so every run
/// escalates and owes one Telegram message naming the run.
const ESCALATES: &str = r#"
name: esc
stage: production
trigger: {match: {source: generic}}
steps:
  - name: check
    executor: mock
    executor_config: {output: {confidence: 0.1, summary: low, next_step_context: ""}}
notifications:
  escalate:
    channel: telegram
    template: "escalated {{ pipeline_run_id }}"
"#;

/// A pipeline `name` whose `notify` step posts to `url`, followed by a mock step.
fn notifying(name: &str, url: &str) -> String {
    format!(
        r#"
name: {name}
stage: production
trigger: {{match: {{source: generic}}}}
steps:
  - name: tell
    executor: notify
    executor_config: {{channel: webhook, url: "{url}"}}
    prompt_template: "ping {{{{ pipeline_run_id }}}}"
  - name: after
    executor: mock
    executor_config: {{output: {{confidence: 0.9, summary: after, next_step_context: ""}}}}
"#
    )
}

/// A service on a fresh folder whose Telegram is `tg`.
async fn service(tg: &FakeTelegram, pipelines: &[(&str, &str)]) -> (Scratch, Service) {
    let dir = Scratch::new();
    dir.write_config(&tg.config());
    for (name, yaml) in pipelines {
        dir.write_pipeline(name, yaml);
    }
    let svc = Service::start(&dir.root).await;
    (dir, svc)
}

/// The `sendMessage` calls that got through, by run id named in their text.
fn arrived_for(tg: &FakeTelegram, run_id: &str) -> usize {
    tg.calls_of("sendMessage")
        .iter()
        .filter(|c| c.params["text"] == format!("escalated {run_id}"))
        .count()
}

async fn wait_arrived(tg: &FakeTelegram, runs: &[String]) {
    let deadline = Instant::now() + AFTER_OUTAGE;
    while !runs.iter().all(|r| arrived_for(tg, r) >= 1) {
        assert!(
            Instant::now() < deadline,
            "escalation messages did not all arrive within {AFTER_OUTAGE:?} of the outage's end: {:?}",
            tg.calls_of("sendMessage")
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Ends the outage once it has lasted [`OUTAGE`]; the length of the outage is the
/// scenario, so this is the one wait that is not for a condition.
async fn end_outage_after(tg: &FakeTelegram, began: Instant) {
    tokio::time::sleep(OUTAGE.saturating_sub(began.elapsed())).await;
    tg.set_down(false);
}

/// Three runs escalate while Telegram is down; `restart` kills the service during
/// the outage and starts it again. Each message must arrive exactly once.
async fn escalations_through_an_outage(restart: bool) {
    let tg = FakeTelegram::start().await;
    let (_dir, mut svc) = service(&tg, &[("esc", ESCALATES)]).await;
    tg.set_down(true);
    let began = Instant::now();
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(svc.post_run("esc", json!({})).await);
    }
    for r in &runs {
        let run = svc.wait_terminal(r).await;
        assert_eq!(run["status"], "escalated", "{run}");
    }
    // Every message was tried and refused, and retried at least once.
    tg.wait_refused("sendMessage", 6).await;
    if restart {
        svc.kill9();
        let refused = tg.refused("sendMessage");
        svc.restart().await;
        // The new process picks the queued messages up and keeps trying.
        tg.wait_refused("sendMessage", refused + 3).await;
    }
    for r in &runs {
        let run = svc.get_run(r).await;
        assert!(
            events(&run, "notification_failed").is_empty(),
            "a retried message is not a failure yet: {run}"
        );
        assert!(events(&run, "notification_sent").is_empty(), "{run}");
    }
    assert_eq!(
        tg.count("sendMessage"),
        0,
        "nothing gets through the outage"
    );

    end_outage_after(&tg, began).await;
    wait_arrived(&tg, &runs).await;
    for r in &runs {
        let run = svc.wait_event(r, "notification_sent").await;
        let sent = event(&run, "notification_sent");
        assert_eq!(sent["action"], "escalate", "{sent}");
        assert_eq!(sent["channel"], "telegram", "{sent}");
    }
    // One more escalation, delivered after the three were marked sent, shows that
    // the retry task went round again without sending any of them a second time.
    let later = svc.post_run("esc", json!({})).await;
    wait_arrived(&tg, std::slice::from_ref(&later)).await;
    svc.wait_event(&later, "notification_sent").await;
    for r in &runs {
        assert_eq!(
            arrived_for(&tg, r),
            1,
            "run {r}: {:?}",
            tg.calls_of("sendMessage")
        );
        let run = svc.get_run(r).await;
        assert_eq!(events(&run, "notification_sent").len(), 1, "{run}");
        assert!(events(&run, "notification_failed").is_empty(), "{run}");
    }
    assert_eq!(tg.count("sendMessage"), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalations_during_a_telegram_outage_arrive_once_each_after_it() {
    escalations_through_an_outage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalations_during_a_telegram_outage_survive_a_restart_and_arrive_once_each() {
    escalations_through_an_outage(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_step_completes_once_queued_and_is_delivered_once() {
    let peer = HoldingPeer::answering(Reply::ok()).await;
    let tg = FakeTelegram::start().await;
    let url = format!("{}/hook", peer.url());
    let (_dir, svc) = service(&tg, &[("ping", &notifying("ping", &url))]).await;
    let id = svc.post_run("ping", json!({})).await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{run}");
    let out = &step(&run, "tell")["output"];
    let key = format!("{id}:tell:1:notify");
    assert_eq!(out["queued"], true, "{out}");
    assert_eq!(out["channel"], "webhook", "{out}");
    assert_eq!(out["notification_id"], key.as_str(), "{out}");
    assert_eq!(out["summary"], "Notification queued via webhook", "{out}");

    let run = svc.wait_event(&id, "notification_sent").await;
    let sent = event(&run, "notification_sent");
    assert_eq!(sent["notification_id"], key.as_str(), "{sent}");
    assert_eq!(sent["action"], "notify_step", "{sent}");
    let got = peer.for_key(&key);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].path, "/hook");
    let body: Value = serde_json::from_str(&got[0].body).expect("JSON body");
    assert_eq!(
        body,
        json!({"text": format!("ping {id}"), "run_id": id, "step": "tell"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_that_cannot_be_delivered_within_the_max_age_fails_once() {
    // The peer is down for good: every request is answered 503.
    let peer = HoldingPeer::start(|_| Answer::Reply(Reply::json(503, json!({"down": true})))).await;
    let dir = Scratch::new();
    dir.write_config("notifications: {max_age_seconds: 3}");
    dir.write_pipeline("ping", &notifying("ping", &format!("{}/hook", peer.url())));
    let svc = Service::start(&dir.root).await;

    let first = svc.post_run("ping", json!({})).await;
    let run = svc.wait_terminal(&first).await;
    // Queued is done: the peer's outage does not fail the step or the run.
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(step(&run, "tell")["status"], "completed", "{run}");
    assert_eq!(step(&run, "tell")["output"]["queued"], true, "{run}");

    let run = svc.wait_event(&first, "notification_failed").await;
    let failed = event(&run, "notification_failed");
    let key = format!("{first}:tell:1:notify");
    assert_eq!(failed["notification_id"], key.as_str(), "{failed}");
    assert_eq!(failed["channel"], "webhook", "{failed}");
    assert!(
        failed["error"].as_str().unwrap_or("").contains("503"),
        "{failed}"
    );
    let tries = peer.for_key(&key).len();
    assert!(
        tries >= 2,
        "retried before giving up, tried {tries} time(s)"
    );

    // A second run's message fails the same way; by then the first one, given up,
    // has not been tried again and its failure is logged once.
    let second = svc.post_run("ping", json!({})).await;
    svc.wait_event(&second, "notification_failed").await;
    let run = svc.get_run(&first).await;
    assert_eq!(events(&run, "notification_failed").len(), 1, "{run}");
    assert!(events(&run, "notification_sent").is_empty(), "{run}");
    assert_eq!(
        peer.for_key(&key).len(),
        tries,
        "tried again after giving up"
    );
}

/// The pending approval of `token` in `GET /approvals`.
async fn listed(h: &Harness, token: &str) -> Value {
    let v: Value = h
        .http
        .get(h.svc.url("/approvals"))
        .send()
        .await
        .expect("GET /approvals")
        .json()
        .await
        .expect("approvals JSON");
    v["approvals"]
        .as_array()
        .and_then(|l| l.iter().find(|a| a["token"] == token).cloned())
        .unwrap_or_else(|| panic!("approval {token} is not listed: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_list_shows_the_channel_and_when_it_accepted_the_request() {
    let h = Harness::start(&[("gate", gate("gate", "production", 120.0))], "").await;
    h.tg.set_down(true);
    let run = h.svc.post_run("gate", json!({})).await;
    let a = h.approval(&run, "approve").await;
    // Tried and refused twice: not delivered.
    h.tg.wait_refused("sendMessage", 2).await;
    let before = listed(&h, &a.token).await;
    assert_eq!(before["channel"], "telegram", "{before}");
    assert_eq!(before["delivered_at"], Value::Null, "{before}");

    h.tg.set_down(false);
    h.delivered(&a.token).await;
    let after = listed(&h, &a.token).await;
    assert_eq!(after["channel"], "telegram", "{after}");
    let delivered_at = after["delivered_at"]
        .as_str()
        .unwrap_or_else(|| panic!("{after}"));
    let at = chrono::DateTime::parse_from_rfc3339(delivered_at).expect("RFC 3339");
    let created = chrono::DateTime::parse_from_rfc3339(after["created_at"].as_str().unwrap())
        .expect("RFC 3339");
    assert!(at >= created, "{after}");
    assert_eq!(h.tg.count("sendMessage"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_step_of_a_testing_pipeline_goes_to_the_log() {
    let peer = HoldingPeer::answering(Reply::ok()).await;
    let tg = FakeTelegram::start().await;
    let yaml = notifying("rehearse", &format!("{}/hook", peer.url()))
        .replace("stage: production", "stage: testing");
    let (_dir, svc) = service(&tg, &[("rehearse", &yaml)]).await;
    let id = svc.post_run("rehearse", json!({})).await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{run}");
    let run = svc.wait_event(&id, "notification_sent").await;
    assert_eq!(step(&run, "tell")["output"]["channel"], "log", "{run}");
    assert_eq!(event(&run, "notification_sent")["channel"], "log", "{run}");
    assert_eq!(peer.count(), 0, "a testing pipeline posted to its webhook");
}
