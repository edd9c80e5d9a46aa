//! Telegram: approval messages with Approve / Reject buttons, the update loop that
//! turns presses into decisions, and the edits that show a decision (or why an
//! approval closed) in the chat. The only module that imports teloxide; it knows
//! the engine only through `Engine::decide_approval` and the store.

use serde::{Deserialize, Serialize};

use crate::domain::{ApprovalStatus, RunStatus};
use crate::runner::Engine;
use crate::store::ApprovalRecord;

mod client;
pub mod poller;

pub use client::{Client, Error, Press, Sent};

/// Where an approval request was delivered: the `delivery_json` of its row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// `telegram` or `webhook`.
    pub channel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// When the channel accepted the request (unix ms); `GET /approvals` shows it.
    /// Rows recorded by older versions lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at: Option<i64>,
}

impl Delivery {
    pub fn telegram(sent: Sent) -> Delivery {
        Delivery {
            channel: "telegram".into(),
            chat_id: Some(sent.chat_id),
            message_id: Some(sent.message_id),
            url: None,
            delivered_at: None,
        }
    }

    pub fn parse(json: &str) -> Option<Delivery> {
        serde_json::from_str(json).ok()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }

    /// The chat and message, when this names a Telegram message.
    pub fn telegram_message(&self) -> Option<(i64, i32)> {
        match (self.channel.as_str(), self.chat_id, self.message_id) {
            ("telegram", Some(c), Some(m)) => Some((c, m)),
            _ => None,
        }
    }
}

/// Shows the outcome of a decided approval in its Telegram message, if it has one.
/// Returns at once; the edit happens in the background and a failure is only
/// logged, because the decision itself is already recorded.
pub fn announce_decided(engine: &Engine, token: &str) {
    if engine.config.telegram.is_none() {
        return;
    }
    match engine.store.approval(token) {
        Ok(Some(a)) => announce(engine, a),
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(error = %e, "Cannot read an approval to update its Telegram message.")
        }
    }
}

/// Edits the Telegram messages of the approvals a finished run closed, saying why.
/// Called right after the run's terminal status is committed.
pub fn announce_closed(engine: &Engine, run_id: &str) {
    if engine.config.telegram.is_none() {
        return;
    }
    match engine.store.approvals_of_run(run_id) {
        Ok(list) => list
            .into_iter()
            .filter(|a| a.status == ApprovalStatus::Closed)
            .for_each(|a| announce(engine, a)),
        Err(e) => {
            tracing::warn!(run_id, error = %e, "Cannot read approvals to update their Telegram messages.")
        }
    }
}

fn announce(engine: &Engine, a: ApprovalRecord) {
    let Some((chat_id, message_id)) = a
        .delivery_json
        .as_deref()
        .and_then(Delivery::parse)
        .and_then(|d| d.telegram_message())
    else {
        return;
    };
    let (Some(cfg), Ok(rt)) = (
        engine.config.telegram.as_ref(),
        tokio::runtime::Handle::try_current(),
    ) else {
        return;
    };
    let run_status = if a.status == ApprovalStatus::Closed {
        engine.store.run(&a.run_id).ok().flatten().map(|r| r.status)
    } else {
        None
    };
    let Some(line) = outcome_line(&a, run_status.map(RunStatus::as_str)) else {
        return;
    };
    let client = match Client::new(cfg, engine.http.clone()) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "Cannot update the Telegram approval message.");
            return;
        }
    };
    let html = format!("{}\n\n{}", a.message, escape_html(&line));
    let plain = format!("{}\n\n{line}", a.message);
    rt.spawn(async move {
        if let Err(e) = client.edit_text(chat_id, message_id, &html, &plain).await {
            tracing::warn!(run_id = %a.run_id, step = %a.step_path, error = %e, "Cannot update the Telegram approval message.");
        }
    });
}

/// The line appended to the message once the approval is no longer pending.
pub fn outcome_line(a: &ApprovalRecord, run_status: Option<&str>) -> Option<String> {
    let at = a.decided_at.map(crate::clock::rfc3339).unwrap_or_default();
    let by = a.decided_by.as_deref().unwrap_or("someone");
    Some(match a.status {
        ApprovalStatus::Approved => format!("✅ Approved by {by} at {at}"),
        ApprovalStatus::Rejected => format!("❌ Rejected by {by} at {at}"),
        ApprovalStatus::Timeout => {
            format!("⌛ Timed out at {at}: nobody decided before the deadline.")
        }
        ApprovalStatus::Closed => format!(
            "⛔ Closed at {at}: the run ended ({}) before a decision.",
            run_status.unwrap_or(RunStatus::Stopped.as_str())
        ),
        ApprovalStatus::Pending => return None,
    })
}

pub fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
