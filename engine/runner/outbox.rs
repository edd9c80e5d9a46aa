//! Notifications a run owes (SPEC 6.2): recorded in the same transaction as the
//! run's terminal status (or, for a `notify` step, committed before the step
//! completes), sent afterwards, and marked sent. A crash between the two re-sends
//! at most the one notification in flight (webhooks carry the notification id as
//! `Idempotency-Key`), and never loses one.
//!
//! In `serve` a failed delivery stays `pending` and [`start_retries`] tries it
//! again with backoff (1 s, doubling, at most 60 s apart) until it is delivered or
//! `notifications.max_age_seconds` have passed since it was recorded; only then is
//! it marked `failed` and `notification_failed` logged, once. The schedule is
//! derived from the row itself (`created_at` and the last attempt, `sent_at`), so
//! a restarted process simply carries on. An answer that cannot succeed on a later
//! try (a 4xx other than 408/425/429, a channel that is not configured) gives up at
//! once. A one-shot process (`vectorstep run`) has nobody to retry and records
//! the first failure.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::unit::CallFailure;
use super::unit::RunState;
use super::Services;
use crate::domain::{Channel, NotificationStatus, SendResult, StepStatus};
use crate::events::Event;
use crate::executor::{notify, Call, Outcome};
use crate::pipeline::{Stage, Step};
use crate::run::{context, StepOutput, Usage};
use crate::store::{NotificationRecord, Write};

/// The wait before the second attempt; each later wait doubles, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF_MS: i64 = 1_000;
const MAX_BACKOFF_MS: i64 = 60_000;
/// How often the retry task looks for notifications that are due.
const RETRY_POLL: Duration = Duration::from_secs(1);
/// Deliveries the retry task runs at once, so that a peer that hangs until its
/// timeout holds back only these and not every other notification.
const RETRY_CONCURRENCY: usize = 16;
/// Telegram rejects longer messages, so they are cut rather than retried forever.
const TELEGRAM_MAX_CHARS: usize = 4096;

/// What to send, stored as the outbox row's `message`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Delivery {
    /// `notification` or `failure_webhook`.
    pub kind: String,
    pub channel: String,
    pub action: String,
    pub step: String,
    pub text: String,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    #[serde(default)]
    pub body: Option<Value>,
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

fn insert(rs: &RunState, id: String, d: &Delivery) -> Write {
    Write::InsertNotification(NotificationRecord {
        id,
        run_id: rs.id().to_string(),
        action: d.action.clone(),
        channel: d.channel.clone(),
        message: serde_json::to_string(d).unwrap_or_default(),
        status: NotificationStatus::Pending,
        created_at: rs.now(),
        sent_at: None,
        error: None,
    })
}

/// The outbox rows for notification `action` of the pipeline, rendered now.
pub(super) fn record(
    rs: &RunState,
    action: &str,
    step: &str,
    extra: &Map<String, Value>,
) -> Vec<Write> {
    let Some(list) = rs.pipeline.notifications.get(action) else {
        return Vec::new();
    };
    let ctx = context::to_template_value(rs.context(step, None, None, Some(extra)));
    let testing = rs.pipeline.stage == Stage::Testing;
    list.iter()
        .enumerate()
        .map(|(idx, n)| {
            let text = rs
                .pipeline
                .templates
                .render(&n.template, &ctx)
                .unwrap_or_else(|e| format!("[notification template error: {e}]"));
            let d = Delivery {
                kind: "notification".into(),
                // A testing pipeline never talks to the outside world.
                channel: if testing {
                    Channel::Log.to_string()
                } else {
                    n.channel.clone()
                },
                action: action.to_string(),
                step: step.to_string(),
                text,
                url: n
                    .config
                    .get("url")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                method: n
                    .config
                    .get("method")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                headers: n
                    .config
                    .get("headers")
                    .and_then(Value::as_object)
                    .map(|h| {
                        h.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                            .collect()
                    })
                    .unwrap_or_default(),
                body: None,
                timeout_seconds: n.config.get("timeout_seconds").and_then(Value::as_f64),
            };
            insert(rs, format!("{}:{action}:{idx}", rs.id()), &d)
        })
        .collect()
}

/// The `on_failure.webhook` of a failed plain step (skipped in testing).
pub(super) fn failure_webhook(
    rs: &RunState,
    step: &Step,
    summary: &str,
    status: StepStatus,
) -> Vec<Write> {
    let Some(w) = &step.on_failure.webhook else {
        return Vec::new();
    };
    if rs.pipeline.stage == Stage::Testing {
        return Vec::new();
    }
    let mut extra = Map::new();
    extra.insert(
        "step_failure".into(),
        json!({"step": step.name, "summary": summary, "status": status}),
    );
    let ctx = context::to_template_value(rs.context(&step.name, None, None, Some(&extra)));
    let mut body = w.payload.clone();
    for (pointer, t) in &w.payload_templates {
        if let (Some(slot), Ok(text)) = (
            body.pointer_mut(pointer),
            rs.pipeline.templates.render(t, &ctx),
        ) {
            *slot = Value::String(text);
        }
    }
    let lookup = |k: &str| std::env::var(k).ok();
    let mut missing = Vec::new();
    let d = Delivery {
        kind: "failure_webhook".into(),
        channel: Channel::Webhook.to_string(),
        action: "on_failure".into(),
        step: step.name.clone(),
        text: summary.to_string(),
        url: Some(crate::config::expand_env(&w.url, &lookup, &mut missing)),
        method: Some(w.method.clone()),
        headers: w
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    crate::config::expand_env(v, &lookup, &mut missing),
                )
            })
            .collect(),
        body: Some(body),
        timeout_seconds: Some(w.timeout_seconds),
    };
    vec![insert(
        rs,
        format!("{}:on_failure:{}", rs.id(), step.name),
        &d,
    )]
}

/// Commits a `notify` step's message to the outbox and starts its delivery. The
/// step is done once the row is committed: delivery (and its retries) no longer
/// holds up the run, and a chat outage cannot fail it.
pub(super) async fn queue_step(
    engine: &Arc<Services>,
    call: &Call<'_>,
    stage: Stage,
) -> Result<Outcome, CallFailure> {
    let mut m = notify::prepare(&engine.config, call).map_err(CallFailure::from)?;
    // A testing pipeline never talks to the outside world (checked above all the
    // same, so that a broken channel shows before the pipeline is promoted).
    if stage == Stage::Testing {
        m.channel = Channel::Log.to_string();
        m.url = None;
        m.body = None;
    }
    // The step's idempotency key is the same across retries and resumes, so a step
    // re-run after a crash finds its message already queued (INSERT OR IGNORE).
    let id = format!("{}:notify", call.idempotency_key);
    let d = Delivery {
        kind: "notification".into(),
        channel: m.channel.clone(),
        action: NOTIFY_STEP.into(),
        step: call.step_path.to_string(),
        text: m.text,
        url: m.url,
        method: Some("POST".into()),
        headers: Vec::new(),
        body: m.body,
        timeout_seconds: call.timeout.map(|t| t.as_secs_f64()),
    };
    let row = NotificationRecord {
        id: id.clone(),
        run_id: call.run_id.to_string(),
        action: d.action.clone(),
        channel: d.channel.clone(),
        message: serde_json::to_string(&d).unwrap_or_default(),
        status: NotificationStatus::Pending,
        created_at: engine.now_ms(),
        sent_at: None,
        error: None,
    };
    engine
        .store
        .commit(vec![Write::InsertNotification(row.clone())])
        .await
        .map_err(|e| CallFailure::Error(format!("cannot queue the notification: {e}")))?;
    if retrying(engine) {
        let engine = engine.clone();
        tokio::spawn(async move { deliver(&engine, vec![row]).await });
    } else {
        // A one-shot process may exit right after the run: send before going on.
        deliver(engine, vec![row]).await;
    }
    let mut output = StepOutput::new(1.0, format!("Notification queued via {}", m.channel));
    output.extra.insert("queued".into(), Value::Bool(true));
    output
        .extra
        .insert("channel".into(), Value::from(m.channel));
    output
        .extra
        .insert("notification_id".into(), Value::from(id));
    Ok(Outcome {
        output,
        usage: Usage::default(),
    })
}

/// The `action` of a `notify` step's outbox row.
const NOTIFY_STEP: &str = "notify_step";

/// Sends every pending notification of one run.
pub async fn deliver_run(engine: &Arc<Services>, run_id: &str) {
    match engine.store.notifications_of_run(run_id) {
        Ok(list) => {
            deliver(
                engine,
                list.into_iter()
                    .filter(|n| n.status == NotificationStatus::Pending)
                    .collect(),
            )
            .await
        }
        Err(e) => tracing::error!(run_id, error = %e, "Cannot read the notification outbox."),
    }
}

/// Sends everything left pending by an earlier process, once.
pub async fn deliver_all_pending(engine: &Arc<Services>) {
    match engine.store.pending_notifications() {
        Ok(list) => deliver(engine, list).await,
        Err(e) => tracing::error!(error = %e, "Cannot read the notification outbox."),
    }
}

/// Makes failed deliveries stay pending and starts the task that retries them (and
/// sends what an earlier process left pending) until shutdown. Called by `serve`.
pub fn start_retries(engine: &Arc<Services>) -> tokio::task::JoinHandle<()> {
    engine.outbox_retrying.store(true, Ordering::SeqCst);
    let engine = engine.clone();
    tokio::spawn(async move { retry_loop(engine).await })
}

fn retrying(engine: &Services) -> bool {
    engine.outbox_retrying.load(Ordering::SeqCst)
}

async fn retry_loop(engine: Arc<Services>) {
    let mut shutdown = engine.shutdown_signal();
    let slots = Arc::new(tokio::sync::Semaphore::new(RETRY_CONCURRENCY));
    while !engine.is_shutting_down() {
        let max_age_ms = max_age_ms(&engine);
        match engine.store.pending_notifications() {
            Ok(list) => {
                let now = engine.now_ms();
                for n in list.into_iter().filter(|n| due_at(n, max_age_ms) <= now) {
                    if engine.is_shutting_down() {
                        return;
                    }
                    let Ok(slot) = slots.clone().acquire_owned().await else {
                        return;
                    };
                    // Claimed here, before the task starts, so the next pass cannot
                    // start a second delivery of the same row.
                    if !claim(&engine, &n.id) {
                        continue;
                    }
                    let engine = engine.clone();
                    tokio::spawn(async move {
                        deliver_one(&engine, &n).await;
                        release(&engine, &n.id);
                        drop(slot);
                    });
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "Cannot read the notification outbox; retrying.")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY_POLL) => {}
            _ = shutdown.changed() => {}
        }
    }
}

fn max_age_ms(engine: &Services) -> i64 {
    i64::try_from(engine.config.notification_max_age_seconds)
        .unwrap_or(i64::MAX / 1000)
        .saturating_mul(1000)
}

/// When `n` should next be tried: at once if it never was, then after a wait as
/// long as the time since it was recorded (so the waits double), between 1 s and
/// 60 s, and once more at its maximum age, when a failure gives up.
pub fn due_at(n: &NotificationRecord, max_age_ms: i64) -> i64 {
    let Some(last) = n.sent_at else {
        return n.created_at;
    };
    let due = last.saturating_add((last - n.created_at).clamp(FIRST_BACKOFF_MS, MAX_BACKOFF_MS));
    let give_up = n.created_at.saturating_add(max_age_ms);
    if last < give_up {
        due.min(give_up)
    } else {
        due
    }
}

/// How long one delivery attempt holds its row against the other replicas: twice
/// the 30 s a send may take, so only a sender that died mid-send lets another one
/// send again (once this runs out).
const CLAIM_MS: u64 = 60_000;

/// On a shared store, takes the row for this attempt in the store, so a replica
/// whose retry pass read it too does not send it as well; `false` if another
/// sender holds it (or it was just delivered). Within one process the
/// `delivering` set does this (see [`claim`]), so SQLite needs no write for it.
async fn claim_across_replicas(engine: &Services, id: &str) -> bool {
    let Some(book) = engine.leases() else {
        return true;
    };
    let claim = |take_from: Option<String>| Write::ClaimNotification {
        id: id.to_string(),
        claimer: book.replica().to_string(),
        claim_ms: CLAIM_MS,
        take_from,
    };
    let claimed = |w: Write| async move {
        match engine.store.commit(vec![w]).await {
            Ok(outcomes) => outcomes.first() == Some(&crate::store::Outcome::NotificationClaimed),
            Err(e) => {
                // Not sent now; the next pass tries again.
                tracing::warn!(notification_id = id, error = %e, "Cannot claim a notification for delivery; trying again later.");
                false
            }
        }
    };
    if claimed(claim(None)).await {
        return true;
    }
    // Held by a sender that died mid-send (its session ended): send it now rather
    // than once its claim runs out.
    match engine.store.notification_claimant(id) {
        Ok(Some(holder))
            if holder != book.replica() && engine.store.replica_gone(&holder).unwrap_or(false) =>
        {
            claimed(claim(Some(holder))).await
        }
        _ => false,
    }
}

fn claim(engine: &Services, id: &str) -> bool {
    engine
        .delivering
        .lock()
        .map(|mut d| d.insert(id.to_string()))
        .unwrap_or(false)
}

fn release(engine: &Services, id: &str) {
    if let Ok(mut d) = engine.delivering.lock() {
        d.remove(id);
    }
}

async fn deliver(engine: &Arc<Services>, list: Vec<NotificationRecord>) {
    for n in list {
        if !claim(engine, &n.id) {
            continue;
        }
        deliver_one(engine, &n).await;
        release(engine, &n.id);
    }
}

async fn deliver_one(engine: &Arc<Services>, n: &NotificationRecord) {
    // Another deliverer may have finished this one between our read and our claim.
    let current = match engine
        .store
        .notifications_of_run(&n.run_id)
        .map(|l| l.into_iter().find(|x| x.id == n.id))
    {
        Ok(Some(current)) if current.status != NotificationStatus::Pending => return,
        Ok(Some(current)) => current,
        _ => n.clone(),
    };
    // A list read a moment ago, or a run delivering "everything it owes", must not
    // cut a retry's wait short: the row says when it is due.
    if retrying(engine) && due_at(&current, max_age_ms(engine)) > engine.now_ms() {
        return;
    }
    if !claim_across_replicas(engine, &current.id).await {
        return;
    }
    let d: Delivery = match serde_json::from_str(&current.message) {
        Ok(d) => d,
        Err(e) => {
            let failure = Failure::permanent(format!("unreadable outbox row: {e}"));
            mark(engine, &current, Err(failure), "notification").await;
            return;
        }
    };
    let result = send(engine, &current.id, &d).await;
    mark(engine, &current, result, &d.kind).await;
}

/// Why an attempt failed, and whether a later attempt could do better.
#[derive(Debug)]
struct Failure {
    message: String,
    permanent: bool,
}

impl Failure {
    fn transient(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            permanent: false,
        }
    }

    fn permanent(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            permanent: true,
        }
    }

    /// A peer's refusal: worth retrying unless it says the request itself is wrong.
    fn http(what: &str, status: reqwest::StatusCode) -> Failure {
        let message = format!("{what} returned HTTP {}", status.as_u16());
        let retriable = !status.is_client_error() || matches!(status.as_u16(), 408 | 425 | 429);
        Failure {
            message,
            permanent: !retriable,
        }
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        Failure::permanent(message)
    }
}

async fn mark(
    engine: &Arc<Services>,
    n: &NotificationRecord,
    result: Result<(), Failure>,
    kind: &str,
) {
    let now = engine.now_ms();
    if let Err(f) = &result {
        crate::telemetry::notification(&n.channel, SendResult::Failed.as_str());
        let expired = now >= n.created_at.saturating_add(max_age_ms(engine));
        if !f.permanent && !expired && retrying(engine) {
            let retry = NotificationRecord {
                sent_at: Some(now),
                ..n.clone()
            };
            tracing::warn!(run_id = %n.run_id, notification_id = %n.id, action = %n.action,
                channel = %n.channel, error = %f.message,
                retry_in_ms = due_at(&retry, max_age_ms(engine)) - now,
                "Cannot deliver a notification; it stays queued and is retried.");
            let w = Write::MarkNotification {
                id: n.id.clone(),
                status: NotificationStatus::Pending,
                at: now,
                error: Some(f.message.clone()),
            };
            if let Err(e) = engine.store.commit(vec![w]).await {
                tracing::error!(run_id = %n.run_id, error = %e, "Cannot record a failed notification attempt.");
            }
            return;
        }
    } else {
        crate::telemetry::notification(&n.channel, SendResult::Sent.as_str());
    }
    let error = result.err().map(|f| f.message);
    let (action, channel, notification_id) = (n.action.clone(), n.channel.clone(), n.id.clone());
    let webhook = kind == "failure_webhook";
    let (status, event) = match (&error, webhook) {
        (None, true) => (
            NotificationStatus::Sent,
            Event::StepFailureWebhookSent {
                action,
                channel,
                notification_id,
                error: None,
            },
        ),
        (Some(_), true) => (
            NotificationStatus::Failed,
            Event::StepFailureWebhookFailed {
                action,
                channel,
                notification_id,
                error: error.clone(),
            },
        ),
        (None, false) => (
            NotificationStatus::Sent,
            Event::NotificationSent {
                action,
                channel,
                notification_id,
                error: None,
            },
        ),
        (Some(_), false) => (
            NotificationStatus::Failed,
            Event::NotificationFailed {
                action,
                channel,
                notification_id,
                error: error.clone(),
            },
        ),
    };
    let ev = event.write(
        &n.run_id,
        now,
        format!(
            "{} via {}: {}",
            n.action,
            n.channel,
            error
                .clone()
                .unwrap_or_else(|| SendResult::Sent.to_string())
        ),
    );
    let w = Write::MarkNotification {
        id: n.id.clone(),
        status,
        at: now,
        error,
    };
    if let Err(e) = engine.store.commit(vec![w, ev]).await {
        tracing::error!(run_id = %n.run_id, error = %e, "Cannot mark a notification as delivered.");
    }
}

async fn send(engine: &Arc<Services>, id: &str, d: &Delivery) -> Result<(), Failure> {
    if engine.executors.is_scripted() {
        // `vectorstep test`: recorded as sent, never sent.
        tracing::debug!(channel = %d.channel, step = %d.step, "Scripted run: notification not sent.");
        return Ok(());
    }
    match Channel::parse(&d.channel) {
        Some(Channel::Log) => {
            tracing::warn!(target: "vectorstep::notification", action = %d.action, step = %d.step, "{}", d.text);
            Ok(())
        }
        Some(Channel::Webhook) => {
            let url = d
                .url
                .as_deref()
                .ok_or("webhook notification without a url")?;
            let body = d
                .body
                .clone()
                .unwrap_or_else(|| json!({"text": d.text, "action": d.action, "step": d.step}));
            let method =
                reqwest::Method::from_bytes(d.method.as_deref().unwrap_or("POST").as_bytes())
                    .map_err(|e| Failure::permanent(e.to_string()))?;
            let mut req = engine
                .http
                .request(method, url)
                .timeout(Duration::from_secs_f64(d.timeout_seconds.unwrap_or(30.0)))
                .header("Idempotency-Key", id)
                .headers(crate::executor::http::replica_header())
                .json(&body);
            for (k, v) in &d.headers {
                req = req.header(k, v);
            }
            let resp = req
                .send()
                .await
                .map_err(|e| Failure::transient(format!("webhook request failed: {e}")))?;
            if resp.status().is_success() || d.kind == "failure_webhook" {
                Ok(())
            } else {
                Err(Failure::http(Channel::Webhook.as_str(), resp.status()))
            }
        }
        Some(Channel::Telegram) => {
            let tg = engine
                .config
                .telegram
                .as_ref()
                .ok_or("telegram is not configured (notifications.telegram)")?;
            let url = notify::telegram_url(&engine.config);
            let text: String = d.text.chars().take(TELEGRAM_MAX_CHARS).collect();
            let resp = engine
                .http
                .post(url)
                .timeout(Duration::from_secs(30))
                .json(&json!({"chat_id": tg.chat_id, "text": text}))
                .send()
                .await
                .map_err(|e| Failure::transient(format!("telegram request failed: {e}")))?;
            if resp.status().is_success() {
                Ok(())
            } else {
                Err(Failure::http(Channel::Telegram.as_str(), resp.status()))
            }
        }
        Some(Channel::Page) | None => Err(Failure::permanent(format!(
            "unknown notification channel `{}`",
            d.channel
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(created_at: i64, sent_at: Option<i64>) -> NotificationRecord {
        NotificationRecord {
            id: "r:escalate:0".into(),
            run_id: "r".into(),
            action: "escalate".into(),
            channel: "telegram".into(),
            message: "{}".into(),
            status: NotificationStatus::Pending,
            created_at,
            sent_at,
            error: None,
        }
    }

    #[test]
    fn retry_schedule() {
        let day = 86_400_000;
        let check = |created: i64, last: Option<i64>, max_age: i64, expected: i64| {
            assert_eq!(
                due_at(&row(created, last), max_age),
                expected,
                "created {created}, last attempt {last:?}, max age {max_age}"
            );
        };
        // Never tried (a crash right after the commit): at once.
        check(0, None, day, 0);
        // The waits double from 1 s ...
        check(0, Some(0), day, 1_000);
        check(0, Some(1_000), day, 2_000);
        check(0, Some(2_000), day, 4_000);
        check(0, Some(4_000), day, 8_000);
        // ... up to 60 s.
        check(0, Some(64_000), day, 124_000);
        check(0, Some(3_600_000), day, 3_660_000);
        // The last try is at the maximum age, where a failure gives up.
        check(0, Some(4_000), 5_000, 5_000);
        check(0, Some(day - 10), day, day);
        // Past it (an old row found after a long downtime): one more try.
        check(0, Some(day + 5), day, day + 60_005);
    }
}
