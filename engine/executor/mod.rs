//! Executors: one file per kind behind the [`Executor`] trait.
//!
//! The runner renders templates, records the step as `running`, then hands an
//! executor a [`Call`]. Executors never touch the store; they report an
//! [`Outcome`] or an [`Error`] and the runner decides what that means for the run.
//! Timeouts are enforced by the runner by dropping the future, so an executor that
//! owns a resource (a child process) must release it on drop.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::pipeline::{Action, ExecutorKind};
use crate::run::{StepOutput, Usage};

pub mod agent;
pub mod http;
pub mod mock;
pub mod notify;
pub mod scripted;
pub mod shell;
pub mod webhook;

/// Everything an executor needs for one attempt.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    pub run_id: &'a str,
    pub pipeline: &'a str,
    /// `triage`, `context/logs`, `per-service/2`.
    pub step_path: &'a str,
    /// `<run_id>:<step path>:<iteration>`; identical across retries and resumes.
    pub idempotency_key: &'a str,
    /// 1 for the first try; retries and re-runs after a crash count up.
    pub attempt: u32,
    pub action: &'a Action,
    /// The rendered `prompt_template` (webhook body, agent prompt, notify message).
    pub prompt: String,
    /// Rendered templates inside `executor_config`, keyed by JSON pointer
    /// (`url`, `command/0`, `output/summary`).
    pub rendered: BTreeMap<String, String>,
    pub timeout: Option<Duration>,
}

/// A successful attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub output: StepOutput,
    pub usage: Usage,
}

/// A failed attempt. The message ends up in the step record and the run log.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The executor ran and reported failure (non-2xx, exit code, `fail: true`).
    #[error("{0}")]
    Failed(String),
    /// The executor's answer broke the output contract.
    #[error("{0}")]
    BadOutput(String),
    /// The call could not be made (connection refused, spawn failed).
    #[error("{0}")]
    Transport(String),
    /// The step's configuration cannot work at run time (missing agent provider,
    /// a config of another executor kind): not retried.
    #[error("{0}")]
    Config(String),
}

impl Error {
    /// Whether another attempt may succeed. A configuration error cannot: the
    /// runner does not retry it, whatever the step's `retry` allows.
    pub fn is_retriable(&self) -> bool {
        !matches!(self, Error::Config(_))
    }
}

/// The error for an executor handed another kind's config: only a hand-built
/// [`Action`] can do that, since the loader decodes the config for its executor.
pub(crate) fn wrong_config(call: &Call<'_>, executor: &str) -> Error {
    Error::Config(format!(
        "the {executor} executor was given the executor_config of a {} step",
        call.action.config.kind().as_str()
    ))
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait Executor: Send + Sync {
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Outcome, Error>>;
}

/// The executors of one service instance, built once from the config.
#[derive(Clone)]
pub struct Executors {
    by_kind: BTreeMap<&'static str, Arc<dyn Executor>>,
    /// Set by [`Executors::scripted`]: nothing leaves this process, not even
    /// notifications, approval messages or an agent's model and tool calls.
    scripted: bool,
}

fn key(kind: ExecutorKind) -> &'static str {
    kind.as_str()
}

impl Executors {
    pub fn empty() -> Self {
        Executors {
            by_kind: BTreeMap::new(),
            scripted: false,
        }
    }

    /// `vectorstep test`: `executor` answers every step of every kind the table
    /// dispatches (agents included, without their tool loop); notifications are
    /// recorded and not sent, approval messages not delivered.
    pub fn scripted(executor: Arc<dyn Executor>) -> Self {
        let mut e = Executors::empty();
        for kind in [
            ExecutorKind::Mock,
            ExecutorKind::Shell,
            ExecutorKind::Webhook,
            ExecutorKind::Agent,
        ] {
            e.register(kind, executor.clone());
        }
        e.scripted = true;
        e
    }

    /// Whether this is the table of [`Executors::scripted`].
    pub fn is_scripted(&self) -> bool {
        self.scripted
    }

    /// The standard set for `config`. `human` and `pipeline` are driven by the
    /// runner itself, not through this table.
    pub fn standard(config: &Arc<Config>) -> Self {
        let mut e = Executors::empty();
        // One client for every HTTP executor, so connections to a peer are pooled,
        // and at most this many of them per peer.
        http::set_max_connections_per_host(config.max_connections_per_host);
        let client = http::client();
        e.register(ExecutorKind::Mock, Arc::new(mock::Mock));
        e.register(ExecutorKind::Shell, Arc::new(shell::Shell));
        e.register(
            ExecutorKind::Webhook,
            Arc::new(webhook::Webhook::new(client.clone())),
        );
        e.register(
            ExecutorKind::Agent,
            Arc::new(agent::Agent::new(client.clone(), config.clone())),
        );
        e.register(
            ExecutorKind::Notify,
            Arc::new(notify::Notify::new(client, config.clone())),
        );
        e
    }

    pub fn register(&mut self, kind: ExecutorKind, executor: Arc<dyn Executor>) {
        self.by_kind.insert(key(kind), executor);
    }

    pub fn get(&self, kind: ExecutorKind) -> Option<Arc<dyn Executor>> {
        self.by_kind.get(key(kind)).cloned()
    }
}
