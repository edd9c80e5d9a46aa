//! The validated pipeline: what the engine runs. Built only by `validate`, so every
//! value here has already been checked (ranges, references, template syntax).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value as Json;

pub use super::executor_config::{ExecutorConfig, ExecutorKind};
use super::template::{Expr, Template, Templates};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Testing,
    Production,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Testing => "testing",
            Stage::Production => "production",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInterrupted {
    Rerun,
    Escalate,
}

impl OnInterrupted {
    pub fn as_str(self) -> &'static str {
        match self {
            OnInterrupted::Rerun => "rerun",
            OnInterrupted::Escalate => "escalate",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Durable {
    pub on_interrupted: OnInterrupted,
    pub max_resume_age_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub max_tokens: Option<u64>,
    pub max_usd: Option<f64>,
    pub include_approx_cost: bool,
}

#[derive(Debug, Clone)]
pub struct Schedule {
    pub cron: String,
    pub summary: String,
    pub severity: String,
    pub labels: BTreeMap<String, String>,
    pub team: Option<String>,
}

/// One condition of `trigger.match`.
#[derive(Debug, Clone)]
pub enum MatchOp {
    Eq(Json),
    Ne(Json),
    In(Json),
    NotIn(Json),
    Regex(regex::Regex),
    Gt(f64),
    Gte(f64),
    Lt(f64),
    Lte(f64),
}

#[derive(Debug, Clone)]
pub struct Trigger {
    pub conditions: Vec<(String, MatchOp)>,
    pub dedup_enabled: Option<bool>,
    pub dedup_window_seconds: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Notification {
    pub channel: String,
    pub template: Template,
    pub config: Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LowConfidence {
    Escalate,
    Abort,
    Proceed,
}

/// The confidence gate shared by steps, parallel groups and fan-outs.
#[derive(Debug, Clone)]
pub struct Gate {
    pub confidence_threshold: f64,
    pub on_low_confidence: LowConfidence,
    /// The `notifications:` action dispatched when this unit aborts the run.
    pub on_abort: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    Fixed,
    Exponential,
}

#[derive(Debug, Clone)]
pub struct Retry {
    pub attempts: u32,
    pub backoff: Backoff,
    pub delay_seconds: f64,
}

#[derive(Debug, Clone)]
pub struct LoopUntil {
    pub confidence: f64,
    pub max_iterations: u32,
}

#[derive(Debug, Clone)]
pub struct FailureWebhook {
    pub url: String,
    pub method: String,
    pub headers: Vec<(String, String)>,
    /// The payload with every string value compiled as a template.
    pub payload: Json,
    pub payload_templates: Vec<(String, Template)>,
    pub timeout_seconds: f64,
}

#[derive(Debug, Clone)]
pub struct OnFailure {
    pub continue_run: bool,
    pub webhook: Option<FailureWebhook>,
}

/// What runs one unit of work: shared by plain steps, branches and fan-outs.
#[derive(Debug, Clone)]
pub struct Action {
    /// The executor name as written (`gateway` stays `gateway`; it feeds the fingerprint).
    pub executor_name: String,
    pub executor: ExecutorKind,
    /// `executor_config`, decoded for `executor` at load.
    pub config: ExecutorConfig,
    /// The agent an `agent` executor names; the fingerprint covers it.
    pub agent: Option<String>,
    pub prompt: Template,
    /// Templates inside `executor_config` (shell argv elements, webhook url, ...),
    /// keyed by their JSON pointer within the config.
    pub config_templates: Vec<(String, Template)>,
    pub timeout_seconds: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub name: String,
    pub action: Action,
    pub gate: Gate,
    pub when: Option<Expr>,
    pub retry: Option<Retry>,
    pub loop_until: Option<LoopUntil>,
    pub on_failure: OnFailure,
    pub include_approx_cost: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    AllMustPass,
    AnyMustPass,
    WeightedAverage,
}

#[derive(Debug, Clone)]
pub struct Branch {
    pub name: String,
    pub action: Action,
    pub weight: f64,
}

#[derive(Debug, Clone)]
pub struct Parallel {
    pub name: String,
    pub join: Join,
    pub gate: Gate,
    pub timeout_seconds: Option<f64>,
    pub when: Option<Expr>,
    pub branches: Vec<Branch>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnEmpty {
    Complete,
    Skip,
    Abort,
}

#[derive(Debug, Clone)]
pub struct FanOut {
    pub name: String,
    pub over: Template,
    pub item_var: String,
    pub action: Action,
    pub join: Join,
    pub gate: Gate,
    pub max_items: usize,
    pub on_empty: OnEmpty,
    pub when: Option<Expr>,
}

#[derive(Debug, Clone)]
pub enum Entry {
    Step(Step),
    Parallel(Parallel),
    FanOut(FanOut),
}

impl Entry {
    /// Whether the entry asks a human: a `human` step, or a group or fan-out
    /// with one.
    pub fn asks_human(&self) -> bool {
        let human = |kind: ExecutorKind| kind == ExecutorKind::Human;
        match self {
            Entry::Step(s) => human(s.action.executor),
            Entry::Parallel(p) => p.branches.iter().any(|b| human(b.action.executor)),
            Entry::FanOut(f) => human(f.action.executor),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Entry::Step(s) => &s.name,
            Entry::Parallel(p) => &p.name,
            Entry::FanOut(f) => &f.name,
        }
    }

    pub fn when(&self) -> Option<&Expr> {
        match self {
            Entry::Step(s) => s.when.as_ref(),
            Entry::Parallel(p) => p.when.as_ref(),
            Entry::FanOut(f) => f.when.as_ref(),
        }
    }

    pub fn gate(&self) -> &Gate {
        match self {
            Entry::Step(s) => &s.gate,
            Entry::Parallel(p) => &p.gate,
            Entry::FanOut(f) => &f.gate,
        }
    }
}

#[derive(Debug)]
pub struct Pipeline {
    pub name: String,
    pub description: String,
    pub tags: Vec<String>,
    pub version: i64,
    pub stage: Stage,
    pub trigger: Trigger,
    pub vars: BTreeMap<String, String>,
    pub context_include: Vec<String>,
    pub steps: Vec<Entry>,
    pub notifications: BTreeMap<String, Vec<Notification>>,
    pub schedule: Option<Schedule>,
    pub budget: Option<Budget>,
    pub durable: Option<Durable>,
    pub file: PathBuf,
    /// SPEC 6.7: blake3 over the ordered (step path, executor, agent) list.
    pub fingerprint: String,
    /// Every template of this pipeline, compiled once at load.
    pub templates: Arc<Templates>,
}

impl Pipeline {
    pub fn is_durable(&self) -> bool {
        self.durable.is_some()
    }
}
