//! The template context: what `{{ ... }}` can see while a step runs.
//!
//! Built from the normalised trigger, the pipeline's `vars` and includes, and the
//! outputs of earlier steps. A resumed run rebuilds it from stored outputs with the
//! same function, which is what makes its templates render exactly as before.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::pipeline::Pipeline;

/// A trigger normalised into what every pipeline understands (alert, generic
/// payload, schedule, CLI). Stored with the run so a resume can rebuild context.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Normalised {
    pub source: String,
    #[serde(default)]
    pub pipeline: Option<String>,
    #[serde(default)]
    pub severity: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub summary: Option<String>,
    /// The dedup key (alert fingerprint, `idempotency_key`).
    #[serde(default)]
    pub fingerprint: Option<String>,
    #[serde(default)]
    pub team: Option<String>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// RFC 3339.
    #[serde(default)]
    pub received_at: String,
    /// An Alertmanager notification's chosen alert (shaped by
    /// `intake::alert_view`): what
    /// templates read as `alert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<Value>,
    /// Every alert of an Alertmanager notification, same shape: `alerts`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<Value>,
}

impl Normalised {
    /// An Alertmanager notification's top-level status (`firing`, `resolved`);
    /// `None` for every other source.
    pub fn notification_status(&self) -> Option<&str> {
        (self.source == "alertmanager")
            .then(|| self.metadata.get("status").and_then(Value::as_str))
            .flatten()
    }
}

/// Outputs of finished units, in the order they finished, keyed by template name
/// (`triage`, `logs` for a branch, `per-service/0` for a fan-out branch).
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    map: Map<String, Value>,
}

impl Outputs {
    pub fn insert(&mut self, key: &str, output: Value) {
        if key.contains('-') {
            self.map.insert(key.replace('-', "_"), output.clone());
        }
        self.map.insert(key.to_string(), output);
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key)
    }

    pub fn as_value(&self) -> Value {
        Value::Object(self.map.clone())
    }
}

/// Loop variables for `loop_until` steps.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopVars {
    pub iteration: u32,
    pub max_iterations: u32,
    pub prior_confidence: Option<f64>,
    pub prior_output: Option<Value>,
}

/// Per-branch variables of a fan-out.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemVars<'a> {
    pub name: &'a str,
    pub item: &'a Value,
    pub index: usize,
    pub total: usize,
}

pub struct ContextInput<'a> {
    pub pipeline: &'a Pipeline,
    pub run_id: &'a str,
    pub trigger: &'a Normalised,
    pub outputs: &'a Outputs,
    pub current_step: &'a str,
    pub loop_vars: Option<&'a LoopVars>,
    pub item: Option<ItemVars<'a>>,
    pub extra: Option<&'a Map<String, Value>>,
}

/// Resolves one `context_template.include` path against the trigger.
fn include(trigger: &Normalised, path: &str) -> Option<(String, Value)> {
    let (root, rest) = match path.split_once('.') {
        Some((r, s)) => (r, Some(s)),
        None => (path, None),
    };
    let value = match (root, rest) {
        ("severity", None) => trigger.severity.clone().map(Value::from),
        ("summary", None) => trigger.summary.clone().map(Value::from),
        ("source", None) => Some(Value::from(trigger.source.clone())),
        ("pipeline", None) => trigger.pipeline.clone().map(Value::from),
        ("received_at", None) => Some(Value::from(trigger.received_at.clone())),
        ("labels", None) => serde_json::to_value(&trigger.labels).ok(),
        ("labels", Some(k)) => trigger.labels.get(k).cloned().map(Value::from),
        ("metadata", None) => Some(Value::Object(trigger.metadata.clone())),
        ("metadata", Some(k)) => trigger.metadata.get(k).cloned(),
        _ => None,
    }?;
    if value.is_null() {
        return None;
    }
    let leaf = rest.unwrap_or(root).to_string();
    Some((leaf, value))
}

/// Builds the context as JSON (docs/pipelines.md lists every key); [`to_template_value`] turns it into what templates read.
pub fn build(input: &ContextInput<'_>) -> Map<String, Value> {
    let mut m = Map::new();
    let t = input.trigger;
    m.insert("pipeline_run_id".into(), Value::from(input.run_id));
    m.insert(
        "pipeline_name".into(),
        Value::from(input.pipeline.name.clone()),
    );
    m.insert("current_step".into(), Value::from(input.current_step));
    m.insert(
        "labels".into(),
        serde_json::to_value(&t.labels).unwrap_or_default(),
    );
    m.insert(
        "team".into(),
        t.team.clone().map(Value::from).unwrap_or(Value::Null),
    );
    if let Some(alert) = &t.alert {
        m.insert("alert".into(), alert.clone());
        m.insert("alerts".into(), Value::Array(t.alerts.clone()));
    }
    m.insert(
        "_testing".into(),
        Value::from(input.pipeline.stage == crate::pipeline::Stage::Testing),
    );
    for (k, v) in &input.pipeline.vars {
        m.insert(k.clone(), Value::from(v.clone()));
    }
    for path in &input.pipeline.context_include {
        if let Some((leaf, value)) = include(t, path) {
            if path.contains('.') {
                m.insert(path.clone(), value.clone());
            }
            m.insert(leaf, value);
        }
    }
    m.insert("steps".into(), input.outputs.as_value());
    if let Some(l) = input.loop_vars {
        m.insert(
            "loop".into(),
            serde_json::json!({
                "iteration": l.iteration,
                "max_iterations": l.max_iterations,
                "prior_confidence": l.prior_confidence,
                "prior_output": l.prior_output,
            }),
        );
    }
    if let Some(item) = &input.item {
        m.insert(item.name.to_string(), item.item.clone());
        m.insert("fan_out_index".into(), Value::from(item.index));
        m.insert("fan_out_total".into(), Value::from(item.total));
    }
    if let Some(extra) = input.extra {
        for (k, v) in extra {
            m.insert(k.clone(), v.clone());
        }
    }
    m
}

pub fn to_template_value(m: Map<String, Value>) -> minijinja::Value {
    minijinja::Value::from_serialize(Value::Object(m))
}
