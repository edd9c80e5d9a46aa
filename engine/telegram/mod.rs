//! Telegram: approval messages with Approve / Reject buttons, the update loop that
//! turns presses into decisions, and the edits that show a decision (or why an
//! approval closed) in the chat. The only module that imports teloxide.
//!
//! It knows the engine through the ports of `runner::ports`: [`attach`] takes the
//! engine once at start to install a [`ChatChannel`] (how human steps send their
//! requests) and to subscribe to [`ApprovalChange`]s (to edit messages); the poller
//! decides through an [`ApprovalDesk`](crate::runner::ApprovalDesk). Besides those
//! it reads approval, run and `kv` rows from the store. The runner never calls into
//! this module.

use std::sync::Arc;

use crate::domain::{ApprovalStatus, RunStatus};
use crate::executor::BoxFuture;
use crate::runner::{ApprovalChange, ApprovalDelivery, ChatChannel, Engine};
use crate::store::{ApprovalRecord, Store};

mod client;
pub mod poller;

pub use client::{Client, Error, Press, Sent};

/// Connects `engine` to Telegram when `notifications.telegram` is configured:
/// human steps send their requests through it, and a background task edits each
/// message once its approval is decided or closed. Call inside the runtime, before
/// runs start. Decisions by button press need [`poller::run`] as well (`serve`).
pub fn attach(engine: &Arc<Engine>) {
    let Some(cfg) = engine.config.telegram.clone() else {
        return;
    };
    let chat = Chat {
        cfg: cfg.clone(),
        http: engine.http.clone(),
    };
    engine.set_chat_channel(Arc::new(chat));
    let changes = engine.approval_changes();
    let announcer = Announcer {
        store: engine.store.clone(),
        cfg,
        http: engine.http.clone(),
    };
    tokio::spawn(announcer.run(changes));
}

/// Where a sent request is recorded.
pub fn delivery_of(sent: Sent) -> ApprovalDelivery {
    ApprovalDelivery::telegram(sent.chat_id, sent.message_id)
}

/// The [`ChatChannel`] human steps send through. A client is built per request,
/// as before the ports existed, so a bad `api_url` fails (and retries) each send
/// instead of the start of a one-shot run.
struct Chat {
    cfg: crate::config::Telegram,
    http: reqwest::Client,
}

impl ChatChannel for Chat {
    fn send_approval<'a>(
        &'a self,
        chat: &'a str,
        message: &'a str,
        token: &'a str,
    ) -> BoxFuture<'a, Result<ApprovalDelivery, String>> {
        Box::pin(async move {
            let client = Client::new(&self.cfg, self.http.clone()).map_err(|e| e.to_string())?;
            let sent = client
                .send_approval(chat, message, token)
                .await
                .map_err(|e| e.to_string())?;
            Ok(delivery_of(sent))
        })
    }
}

/// Edits messages as approvals change.
struct Announcer {
    store: Store,
    cfg: crate::config::Telegram,
    http: reqwest::Client,
}

impl Announcer {
    /// Until the engine goes away. Each edit runs on its own task: a slow Bot API
    /// must not hold up the next change, and a failed edit is only logged because
    /// the decision itself is already recorded.
    async fn run(self, mut changes: tokio::sync::mpsc::UnboundedReceiver<ApprovalChange>) {
        while let Some(change) = changes.recv().await {
            match change {
                ApprovalChange::Requested { .. } => {}
                ApprovalChange::Decided { token } => self.decided(&token),
                ApprovalChange::Closed { run_id } => self.closed(&run_id),
            }
        }
    }

    /// Shows the outcome of a decided approval in its Telegram message, if it has one.
    fn decided(&self, token: &str) {
        match self.store.approval(token) {
            Ok(Some(a)) => self.announce(a),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "Cannot read an approval to update its Telegram message.")
            }
        }
    }

    /// Edits the Telegram messages of the approvals a finished run closed, saying why.
    fn closed(&self, run_id: &str) {
        match self.store.approvals_of_run(run_id) {
            Ok(list) => list
                .into_iter()
                .filter(|a| a.status == ApprovalStatus::Closed)
                .for_each(|a| self.announce(a)),
            Err(e) => {
                tracing::warn!(run_id, error = %e, "Cannot read approvals to update their Telegram messages.")
            }
        }
    }

    fn announce(&self, a: ApprovalRecord) {
        let Some((chat_id, message_id)) = a
            .delivery_json
            .as_deref()
            .and_then(ApprovalDelivery::parse)
            .and_then(|d| d.telegram_message())
        else {
            return;
        };
        let run_status = if a.status == ApprovalStatus::Closed {
            self.store.run(&a.run_id).ok().flatten().map(|r| r.status)
        } else {
            None
        };
        let Some(line) = outcome_line(&a, run_status.map(RunStatus::as_str)) else {
            return;
        };
        let client = match Client::new(&self.cfg, self.http.clone()) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "Cannot update the Telegram approval message.");
                return;
            }
        };
        let html = format!("{}\n\n{}", a.message, escape_html(&line));
        let plain = format!("{}\n\n{line}", a.message);
        tokio::spawn(async move {
            if let Err(e) = client.edit_text(chat_id, message_id, &html, &plain).await {
                tracing::warn!(run_id = %a.run_id, step = %a.step_path, error = %e, "Cannot update the Telegram approval message.");
            }
        });
    }
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
    crate::view::escape_html(s)
}
