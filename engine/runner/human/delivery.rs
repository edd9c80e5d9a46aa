//! Delivering an approval request to its channel. The request is already durable
//! (and decidable on the approvals page) before delivery starts, so delivery runs
//! in the background and retries with backoff until it succeeds or the approval is
//! no longer pending: a chat outage delays the message, it never loses the approval.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::super::{ApprovalChange, ApprovalDelivery, Services};
use crate::config::Config;
use crate::domain::{ApprovalStatus, Channel, SendResult};
use crate::store::{ApprovalRecord, Write};

const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Telegram {
        chat: String,
    },
    Webhook {
        url: String,
    },
    /// Only the approvals page (and API) offer the decision.
    Page,
}

impl Route {
    /// The `channel` column.
    pub fn channel(&self) -> &'static str {
        match self {
            Route::Telegram { .. } => Channel::Telegram.as_str(),
            Route::Webhook { .. } => Channel::Webhook.as_str(),
            Route::Page => Channel::Page.as_str(),
        }
    }
}

/// `human_approval.teams[team]`, else `human_approval.default`, else the
/// `notifications.telegram` chat, else the page alone.
pub fn route(config: &Config, team: Option<&str>) -> Route {
    let ha = &config.human_approval;
    let chosen = team.and_then(|t| ha.teams.get(t)).or(ha.default.as_ref());
    let Some(r) = chosen else {
        return match &config.telegram {
            Some(t) => Route::Telegram {
                chat: t.chat_id.clone(),
            },
            None => Route::Page,
        };
    };
    match Channel::parse(&r.channel) {
        Some(Channel::Telegram) => {
            let chat = r
                .chat_id
                .clone()
                .or_else(|| config.telegram.as_ref().map(|t| t.chat_id.clone()));
            match (chat, &config.telegram) {
                (Some(chat), Some(_)) if !chat.is_empty() => Route::Telegram { chat },
                _ => {
                    tracing::warn!(team, "An approval route names Telegram but notifications.telegram (bot_token, chat_id) is not configured; the approval is offered on the approvals page only.");
                    Route::Page
                }
            }
        }
        Some(Channel::Webhook) => match &r.url {
            Some(url) => Route::Webhook { url: url.clone() },
            None => Route::Page,
        },
        _ => Route::Page,
    }
}

/// Whether `a` still has to be delivered: a chat channel was chosen when it was
/// requested and no delivery has been confirmed. True after a crash between the
/// request and a successful send; the message is then sent (for the first time as
/// far as the store knows) when the wait is re-armed.
pub fn undelivered(a: &ApprovalRecord) -> bool {
    a.stage == "production"
        && a.status == ApprovalStatus::Pending
        && a.delivery_json.is_none()
        && matches!(
            a.channel.as_deref().and_then(Channel::parse),
            Some(Channel::Telegram | Channel::Webhook)
        )
}

/// Delivers `a` on a background task.
pub fn spawn(engine: &Arc<Services>, a: ApprovalRecord) {
    let route = route(&engine.config, a.team.as_deref());
    // `vectorstep test` decides approvals itself and sends no message.
    if route == Route::Page || engine.executors.is_scripted() {
        return;
    }
    // Taken here, while the run's driver is in progress, so the entry is dropped
    // with the run's other state when the run ends (see `signals`).
    let signal = engine.approval_signal(&a.run_id, &a.token);
    let engine = engine.clone();
    tokio::spawn(async move { deliver(engine, a, route, signal).await });
}

async fn deliver(
    engine: Arc<Services>,
    a: ApprovalRecord,
    route: Route,
    signal: Arc<tokio::sync::Notify>,
) {
    let channel = route.channel();
    let mut shutdown = engine.shutdown_signal();
    let mut backoff = FIRST_BACKOFF;
    loop {
        let notified = signal.notified();
        if !still_pending(&engine, &a.token) || engine.is_shutting_down() {
            // Decided, closed, or stopping: a shut-down process leaves the request
            // undelivered and the next start delivers it when it re-arms the wait.
            return;
        }
        match send(&engine, &a, &route).await {
            Ok(mut delivery) => {
                delivery.delivered_at = Some(engine.now_ms());
                crate::telemetry::notification(channel, SendResult::Sent.as_str());
                record(&engine, &a, delivery).await;
                return;
            }
            Err(e) => {
                crate::telemetry::notification(channel, SendResult::Failed.as_str());
                tracing::warn!(run_id = %a.run_id, step = %a.step_path, channel, error = %e,
                    retry_in_ms = backoff.as_millis() as u64,
                    "Cannot deliver the approval request; it stays decidable on the approvals page. Retrying.");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = notified => {}
            _ = shutdown.changed() => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn still_pending(engine: &Services, token: &str) -> bool {
    match engine.store.approval(token) {
        Ok(Some(a)) => a.status == ApprovalStatus::Pending,
        Ok(None) => false,
        // An unreadable store is not a reason to give up on the message.
        Err(_) => true,
    }
}

async fn send(
    engine: &Services,
    a: &ApprovalRecord,
    route: &Route,
) -> Result<ApprovalDelivery, String> {
    match route {
        Route::Telegram { chat } => {
            // Installed at start by the Telegram front-end (see `ports`).
            if engine.config.telegram.is_none() {
                return Err("notifications.telegram is not configured".into());
            }
            let channel = engine
                .chat_channel()
                .ok_or("no Telegram channel was attached to this engine at start")?;
            channel.send_approval(chat, &a.message, &a.token).await
        }
        Route::Webhook { url } => {
            let page = page_url(&engine.config, &a.token);
            let body = json!({
                "text": format!("{}\n\nApprove or reject: {page}", a.message),
                "token": a.token,
                "url": page,
            });
            let resp = engine
                .http
                .post(url)
                .header("Idempotency-Key", &a.token)
                .json(&body)
                .timeout(WEBHOOK_TIMEOUT)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("webhook answered HTTP {}", resp.status().as_u16()));
            }
            Ok(ApprovalDelivery {
                channel: Channel::Webhook.to_string(),
                chat_id: None,
                message_id: None,
                url: Some(url.clone()),
                delivered_at: None,
            })
        }
        Route::Page => Err("nothing to deliver".into()),
    }
}

pub fn page_url(config: &Config, token: &str) -> String {
    format!(
        "{}/approvals/{token}",
        config.human_approval.ui_base_url.trim_end_matches('/')
    )
}

async fn record(engine: &Services, a: &ApprovalRecord, delivery: ApprovalDelivery) {
    let write = Write::SetApprovalDelivery {
        token: a.token.clone(),
        delivery_json: delivery.to_json(),
    };
    if let Err(e) = engine.store.commit(vec![write]).await {
        tracing::error!(run_id = %a.run_id, token = %a.token, error = %e,
            "The approval request was delivered but where to could not be stored; its message will not show the decision.");
        return;
    }
    tracing::info!(run_id = %a.run_id, step = %a.step_path, channel = %delivery.channel, "Approval request delivered.");
    // Someone may have decided (on the page) while the message was on its way; the
    // decision could not update a message that was not recorded yet, so do it now.
    if !still_pending(engine, &a.token) {
        engine.publish(ApprovalChange::Decided {
            token: a.token.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApprovalRoute, Telegram};

    fn route_of(channel: &str, url: Option<&str>, chat: Option<&str>) -> ApprovalRoute {
        ApprovalRoute {
            channel: channel.into(),
            url: url.map(str::to_string),
            chat_id: chat.map(str::to_string),
        }
    }

    #[test]
    fn routing_order() {
        let mut c = Config::default();
        let check = |c: &Config, team: Option<&str>, expected: Route| {
            assert_eq!(route(c, team), expected, "team {team:?}");
        };
        check(&c, Some("sre"), Route::Page);
        c.telegram = Some(Telegram {
            bot_token: "1:x".into(),
            chat_id: "-1".into(),
            api_url: None,
        });
        check(&c, None, Route::Telegram { chat: "-1".into() });
        c.human_approval.default = Some(route_of("page", None, None));
        check(&c, Some("sre"), Route::Page);
        c.human_approval
            .teams
            .insert("sre".into(), route_of("telegram", None, Some("-2")));
        c.human_approval
            .teams
            .insert("db".into(), route_of("webhook", Some("http://h/x"), None));
        c.human_approval
            .teams
            .insert("net".into(), route_of("telegram", None, None));
        check(&c, Some("sre"), Route::Telegram { chat: "-2".into() });
        check(
            &c,
            Some("db"),
            Route::Webhook {
                url: "http://h/x".into(),
            },
        );
        check(&c, Some("net"), Route::Telegram { chat: "-1".into() });
        check(&c, Some("other"), Route::Page);
        c.telegram = None;
        check(&c, Some("sre"), Route::Page);
    }
}
