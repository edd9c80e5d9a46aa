//! Notifications a run owes (SPEC 6.2): recorded in the same transaction as the
//! run's terminal status, sent afterwards, and marked sent. A crash between the
//! two re-sends at most the one notification in flight (webhooks carry the
//! notification id as `Idempotency-Key`), and never loses one.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::drive::RunState;
use super::records::event;
use super::Engine;
use crate::pipeline::{Stage, Step};
use crate::run::context;
use crate::store::{NotificationRecord, Write};

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
        status: "pending".into(),
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
                    "log".into()
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
    status: &str,
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
        channel: "webhook".into(),
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

/// Sends every pending notification of one run.
pub async fn deliver_run(engine: &Arc<Engine>, run_id: &str) {
    match engine.store.notifications_of_run(run_id) {
        Ok(list) => {
            deliver(
                engine,
                list.into_iter().filter(|n| n.status == "pending").collect(),
            )
            .await
        }
        Err(e) => tracing::error!(run_id, error = %e, "Cannot read the notification outbox."),
    }
}

/// Sends everything left pending by an earlier process (called at start).
pub async fn deliver_all_pending(engine: &Arc<Engine>) {
    match engine.store.pending_notifications() {
        Ok(list) => deliver(engine, list).await,
        Err(e) => tracing::error!(error = %e, "Cannot read the notification outbox."),
    }
}

async fn deliver(engine: &Arc<Engine>, list: Vec<NotificationRecord>) {
    for n in list {
        let claimed = engine
            .delivering
            .lock()
            .map(|mut d| d.insert(n.id.clone()))
            .unwrap_or(false);
        if !claimed {
            continue;
        }
        deliver_one(engine, &n).await;
        if let Ok(mut d) = engine.delivering.lock() {
            d.remove(&n.id);
        }
    }
}

async fn deliver_one(engine: &Arc<Engine>, n: &NotificationRecord) {
    // Another deliverer may have finished this one between our read and our claim.
    if let Ok(Some(current)) = engine
        .store
        .notifications_of_run(&n.run_id)
        .map(|l| l.into_iter().find(|x| x.id == n.id))
    {
        if current.status != "pending" {
            return;
        }
    }
    let d: Delivery = match serde_json::from_str(&n.message) {
        Ok(d) => d,
        Err(e) => {
            mark(
                engine,
                n,
                Err(format!("unreadable outbox row: {e}")),
                "notification",
            )
            .await;
            return;
        }
    };
    let result = send(engine, &n.id, &d).await;
    mark(engine, n, result, &d.kind).await;
}

async fn mark(
    engine: &Arc<Engine>,
    n: &NotificationRecord,
    result: Result<(), String>,
    kind: &str,
) {
    let now = engine.now_ms();
    let (status, name, error) = match (&result, kind) {
        (Ok(()), "failure_webhook") => ("sent", "step_failure_webhook_sent", None),
        (Err(e), "failure_webhook") => ("failed", "step_failure_webhook_failed", Some(e.clone())),
        (Ok(()), _) => ("sent", "notification_sent", None),
        (Err(e), _) => ("failed", "notification_failed", Some(e.clone())),
    };
    crate::telemetry::notification(&n.channel, status);
    let ev = event(
        &n.run_id,
        now,
        if error.is_some() { "warn" } else { "info" },
        name,
        format!(
            "{} via {}: {}",
            n.action,
            n.channel,
            error.clone().unwrap_or_else(|| "sent".into())
        ),
        json!({"action": n.action, "channel": n.channel, "notification_id": n.id, "error": error}),
    );
    let w = Write::MarkNotification {
        id: n.id.clone(),
        status: status.into(),
        at: now,
        error,
    };
    if let Err(e) = engine.store.commit(vec![w, ev]).await {
        tracing::error!(run_id = %n.run_id, error = %e, "Cannot mark a notification as delivered.");
    }
}

async fn send(engine: &Arc<Engine>, id: &str, d: &Delivery) -> Result<(), String> {
    match d.channel.as_str() {
        "log" => {
            tracing::warn!(target: "vectorstep::notification", action = %d.action, step = %d.step, "{}", d.text);
            Ok(())
        }
        "webhook" => {
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
                    .map_err(|e| e.to_string())?;
            let mut req = engine
                .http
                .request(method, url)
                .timeout(Duration::from_secs_f64(d.timeout_seconds.unwrap_or(30.0)))
                .header("Idempotency-Key", id)
                .json(&body);
            for (k, v) in &d.headers {
                req = req.header(k, v);
            }
            let resp = req
                .send()
                .await
                .map_err(|e| format!("webhook request failed: {e}"))?;
            if resp.status().is_success() || d.kind == "failure_webhook" {
                Ok(())
            } else {
                Err(format!("webhook returned HTTP {}", resp.status().as_u16()))
            }
        }
        "telegram" => {
            let tg = engine
                .config
                .telegram
                .as_ref()
                .ok_or("telegram is not configured (notifications.telegram)")?;
            let base = tg
                .api_url
                .as_deref()
                .unwrap_or("https://api.telegram.org")
                .trim_end_matches('/');
            let url = format!("{base}/bot{}/sendMessage", tg.bot_token);
            let resp = engine
                .http
                .post(url)
                .timeout(Duration::from_secs(30))
                .json(&json!({"chat_id": tg.chat_id, "text": d.text}))
                .send()
                .await
                .map_err(|e| format!("telegram request failed: {e}"))?;
            if resp.status().is_success() {
                Ok(())
            } else {
                Err(format!("telegram returned HTTP {}", resp.status().as_u16()))
            }
        }
        other => Err(format!("unknown notification channel `{other}`")),
    }
}
