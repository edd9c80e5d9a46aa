//! The engine's ports out to chat front-ends (today `telegram/`), so that the
//! runner never names one:
//! - [`ApprovalChange`]: what happened to an approval, published once it is durable;
//!   a front-end subscribes with [`Engine::approval_changes`] (to edit its messages);
//! - [`ChatChannel`]: how a human step's request reaches a chat, a trait object the
//!   front-end installs with [`Engine::set_chat_channel`] at start;
//! - [`ApprovalDesk`]: the narrow handle a front-end decides approvals through.
//!
//! The dependency points one way: `telegram/` imports this module, `runner/`
//! never imports `telegram/` (checked by `tests/ports.rs`).

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::{Decider, Engine, Error};
use crate::config::Config;
use crate::executor::BoxFuture;
use crate::store::{Outcome, Store};

/// A change to an approval, published after it is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalChange {
    /// A new request was recorded (its delivery starts in the background).
    Requested { run_id: String, token: String },
    /// The approval was decided (approved, rejected, timed out), or its request was
    /// delivered after it stopped being pending, which the message could not show
    /// yet.
    Decided { token: String },
    /// The run ended and closed its pending approvals.
    Closed { run_id: String },
}

/// Where an approval request was delivered: the `delivery_json` of its row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDelivery {
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

impl ApprovalDelivery {
    /// A message `message_id` in the Telegram chat `chat_id`.
    pub fn telegram(chat_id: i64, message_id: i32) -> ApprovalDelivery {
        ApprovalDelivery {
            channel: "telegram".into(),
            chat_id: Some(chat_id),
            message_id: Some(message_id),
            url: None,
            delivered_at: None,
        }
    }

    pub fn parse(json: &str) -> Option<ApprovalDelivery> {
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

/// A chat that takes approval requests with Approve / Reject buttons.
pub trait ChatChannel: Send + Sync {
    /// Sends `message` for approval `token` to `chat`; `Err` says why it failed
    /// (the delivery retries with backoff).
    fn send_approval<'a>(
        &'a self,
        chat: &'a str,
        message: &'a str,
        token: &'a str,
    ) -> BoxFuture<'a, Result<ApprovalDelivery, String>>;
}

/// The subscribers of [`ApprovalChange`]. Unbounded per subscriber: a subscriber
/// that falls behind (thousands of runs closed at once by the start-up sweep) must
/// not lose an edit, and with no subscriber publishing costs one lock.
#[derive(Default)]
pub(crate) struct Changes {
    subscribers: Mutex<Vec<tokio::sync::mpsc::UnboundedSender<ApprovalChange>>>,
}

impl Changes {
    pub fn subscribe(&self) -> tokio::sync::mpsc::UnboundedReceiver<ApprovalChange> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.lock().push(tx);
        rx
    }

    pub fn publish(&self, change: ApprovalChange) {
        let mut subs = self.lock();
        // A subscriber that went away is dropped here.
        subs.retain(|s| s.send(change.clone()).is_ok());
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, Vec<tokio::sync::mpsc::UnboundedSender<ApprovalChange>>> {
        match self.subscribers.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// What a chat front-end may do with the engine: decide approvals, read the store,
/// read the configuration, and learn when shutdown begins.
#[derive(Clone)]
pub struct ApprovalDesk {
    engine: Arc<Engine>,
}

impl ApprovalDesk {
    /// Decides a pending approval; the first decision wins (see
    /// [`Engine::decide_approval_by`]).
    pub async fn decide(
        &self,
        token: &str,
        approve: bool,
        decider: &Decider,
    ) -> Result<Outcome, Error> {
        self.engine
            .decide_approval_by(token, approve, decider)
            .await
    }

    pub fn store(&self) -> &Store {
        &self.engine.store
    }

    /// On a shared store: this replica's id, its lease length (ms) and its
    /// heartbeat interval, for singleton leases such as the Telegram poller's.
    pub fn replica(&self) -> Option<(String, u64, std::time::Duration)> {
        let book = self.engine.leases()?;
        let beat = super::replica::timing(&self.engine).heartbeat_ms;
        Some((
            book.replica().to_string(),
            book.lease_ms(),
            std::time::Duration::from_millis(u64::try_from(beat).unwrap_or(1_000)),
        ))
    }

    pub fn config(&self) -> &Config {
        &self.engine.config
    }

    /// A receiver that changes when shutdown begins.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.engine.shutdown_signal()
    }
}

impl Engine {
    /// The handle a chat front-end decides approvals through.
    pub fn approval_desk(self: &Arc<Self>) -> ApprovalDesk {
        ApprovalDesk {
            engine: self.clone(),
        }
    }
}
