//! `executor_config`, decoded at load into one typed value per executor kind.
//!
//! Each kind has its own file with a decoder and a `FIELDS` table (name, type,
//! default, one-line doc). The table is the single description of a kind's keys:
//! the decoder reads exactly those keys, every key it did not read is reported as
//! unknown, and a later tool can render the same table as a JSON Schema. Decoders
//! check shape only and return the template sites they found; compiling templates
//! and checking references across files is the validator's job (`action.rs`).
//!
//! Nothing here imports the rest of `pipeline/`, so `model` can depend on it
//! without a cycle.

use std::sync::Arc;

use serde_json::Value as Json;

use crate::diag::{Diagnostics, Span};
use crate::yaml::Node;

pub mod agent;
mod fields;
pub mod human;
pub mod mock;
pub mod notify;
pub mod pipeline;
pub mod shell;
pub mod webhook;

pub use agent::AgentConfig;
pub use fields::{choice_name, template_sites, Choice, Fields};
use fields::{json_to_node, number};
pub use mock::{MockConfig, MockFail, MockUsage};
pub use notify::{Channel, NotifyConfig};
pub use pipeline::PipelineConfig;
pub use shell::ShellConfig;
pub use webhook::WebhookConfig;

/// One key of an executor's `executor_config`, described as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldSpec {
    pub name: &'static str,
    /// The authored type, as the docs write it (`string`, `template`, `mapping`, ...).
    pub ty: &'static str,
    /// The default as the docs write it; `required` when there is none.
    pub default: &'static str,
    pub doc: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorKind {
    Agent,
    Webhook,
    Shell,
    Human,
    Notify,
    Pipeline,
    Mock,
}

impl ExecutorKind {
    pub const NAMES: &'static [&'static str] = &[
        "agent", "gateway", "openclaw", "webhook", "shell", "human", "notify", "pipeline", "mock",
    ];

    pub fn parse(name: &str) -> Option<ExecutorKind> {
        Some(match name {
            "agent" | "gateway" | "openclaw" => ExecutorKind::Agent,
            "webhook" => ExecutorKind::Webhook,
            "shell" => ExecutorKind::Shell,
            "human" => ExecutorKind::Human,
            "notify" => ExecutorKind::Notify,
            "pipeline" => ExecutorKind::Pipeline,
            "mock" => ExecutorKind::Mock,
            _ => return None,
        })
    }

    /// The canonical name (`gateway` and `openclaw` are `agent`).
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutorKind::Agent => "agent",
            ExecutorKind::Webhook => "webhook",
            ExecutorKind::Shell => "shell",
            ExecutorKind::Human => "human",
            ExecutorKind::Notify => "notify",
            ExecutorKind::Pipeline => "pipeline",
            ExecutorKind::Mock => "mock",
        }
    }

    /// Whether a call can change the world outside vectorstep.
    pub fn has_side_effects(self) -> bool {
        !matches!(self, ExecutorKind::Mock | ExecutorKind::Pipeline)
    }

    /// The keys this kind's `executor_config` accepts.
    pub fn fields(self) -> &'static [FieldSpec] {
        match self {
            ExecutorKind::Agent => agent::FIELDS,
            ExecutorKind::Webhook => webhook::FIELDS,
            ExecutorKind::Shell => shell::FIELDS,
            ExecutorKind::Human => human::FIELDS,
            ExecutorKind::Notify => notify::FIELDS,
            ExecutorKind::Pipeline => pipeline::FIELDS,
            ExecutorKind::Mock => mock::FIELDS,
        }
    }
}

/// A unit's `executor_config`, checked for its executor kind.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecutorConfig {
    Agent(AgentConfig),
    Webhook(WebhookConfig),
    Shell(ShellConfig),
    Human,
    Notify(NotifyConfig),
    Pipeline(PipelineConfig),
    Mock(MockConfig),
}

impl ExecutorConfig {
    pub fn kind(&self) -> ExecutorKind {
        match self {
            ExecutorConfig::Agent(_) => ExecutorKind::Agent,
            ExecutorConfig::Webhook(_) => ExecutorKind::Webhook,
            ExecutorConfig::Shell(_) => ExecutorKind::Shell,
            ExecutorConfig::Human => ExecutorKind::Human,
            ExecutorConfig::Notify(_) => ExecutorKind::Notify,
            ExecutorConfig::Pipeline(_) => ExecutorKind::Pipeline,
            ExecutorConfig::Mock(_) => ExecutorKind::Mock,
        }
    }

    /// Decodes a config written as JSON, for callers that build an action by hand
    /// (tests, tools). Templates are not compiled and agents are not looked up:
    /// only the loader knows the pipeline and `config.yaml`.
    pub fn from_json(kind: ExecutorKind, config: &Json) -> Result<ExecutorConfig, Diagnostics> {
        let span = Span::new(Arc::from("<executor_config>"), 1, 1);
        let node = json_to_node(config, &span);
        let mut d = Diagnostics::new();
        let decoded = decode(kind, Some(&node), &span, "executor_config", None, &mut d);
        match decoded {
            Some(x) if !d.has_errors() => Ok(x.config),
            _ => Err(d),
        }
    }
}

/// A string inside `executor_config` to compile as a template, keyed by its JSON
/// pointer within the config (`url`, `command/0`, `output/summary`).
#[derive(Debug, Clone)]
pub struct TemplateSite {
    pub pointer: String,
    pub node: Node,
    pub path: String,
}

/// What a decoder found: the typed config and the templates to compile.
#[derive(Debug)]
pub struct Decoded {
    pub config: ExecutorConfig,
    pub templates: Vec<TemplateSite>,
}

/// Decodes `node` (the `executor_config` mapping, `None` when absent) for `kind`.
/// `agents` are the agent names of config.yaml, when known. Returns `None` when
/// a required key is missing or has the wrong type; every problem is in `d`.
pub fn decode(
    kind: ExecutorKind,
    node: Option<&Node>,
    span: &Span,
    path: &str,
    agents: Option<&[&str]>,
    d: &mut Diagnostics,
) -> Option<Decoded> {
    let mut f = Fields::new(
        node.filter(|n| n.as_map().is_some()),
        node.map(|n| &n.span).unwrap_or(span).clone(),
        path,
        kind,
        agents,
    );
    let config = match kind {
        ExecutorKind::Agent => agent::decode(&mut f, d).map(ExecutorConfig::Agent),
        ExecutorKind::Webhook => webhook::decode(&mut f, d).map(ExecutorConfig::Webhook),
        ExecutorKind::Shell => shell::decode(&mut f, d).map(ExecutorConfig::Shell),
        ExecutorKind::Human => Some(ExecutorConfig::Human),
        ExecutorKind::Notify => notify::decode(&mut f, d).map(ExecutorConfig::Notify),
        ExecutorKind::Pipeline => pipeline::decode(&mut f, d).map(ExecutorConfig::Pipeline),
        ExecutorKind::Mock => mock::decode(&mut f, d).map(ExecutorConfig::Mock),
    };
    let templates = f.finish(d);
    Some(Decoded {
        config: config?,
        templates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KINDS: &[ExecutorKind] = &[
        ExecutorKind::Agent,
        ExecutorKind::Webhook,
        ExecutorKind::Shell,
        ExecutorKind::Human,
        ExecutorKind::Notify,
        ExecutorKind::Pipeline,
        ExecutorKind::Mock,
    ];

    /// The keys a decoder read, for `config`.
    fn read_keys(kind: ExecutorKind, config: Json) -> Vec<&'static str> {
        let span = Span::new(Arc::from("t"), 1, 1);
        let node = json_to_node(&config, &span);
        let mut f = Fields::new(Some(&node), span.clone(), "executor_config", kind, None);
        let mut d = Diagnostics::new();
        match kind {
            ExecutorKind::Agent => drop(agent::decode(&mut f, &mut d)),
            ExecutorKind::Webhook => drop(webhook::decode(&mut f, &mut d)),
            ExecutorKind::Shell => drop(shell::decode(&mut f, &mut d)),
            ExecutorKind::Human => {}
            ExecutorKind::Notify => drop(notify::decode(&mut f, &mut d)),
            ExecutorKind::Pipeline => drop(pipeline::decode(&mut f, &mut d)),
            ExecutorKind::Mock => drop(mock::decode(&mut f, &mut d)),
        }
        let mut keys = f.read().to_vec();
        keys.sort_unstable();
        keys
    }

    /// Every key a decoder reads is declared in its `FIELDS`, and every declared
    /// key is read, whatever the config holds (empty, or a full valid one).
    #[test]
    fn decoders_read_exactly_their_declared_fields() {
        let full = |kind| match kind {
            ExecutorKind::Agent => json!({"agent": "a"}),
            ExecutorKind::Webhook => {
                json!({"url": "http://x", "method": "PUT", "headers": {"A": "b"}, "timeout_seconds": 3})
            }
            ExecutorKind::Shell => json!({"command": ["true"], "env": {"A": "b"}, "cwd": "/"}),
            ExecutorKind::Human => json!({}),
            ExecutorKind::Notify => {
                json!({"channel": "webhook", "url": "http://x", "method": "POST", "headers": {}})
            }
            ExecutorKind::Pipeline => json!({"pipeline": "p", "context": {"summary": "s"}}),
            ExecutorKind::Mock => json!({
                "output": {"confidence": 1.0, "summary": "s"}, "delay_ms": 1,
                "usage": {"input_tokens": 1, "output_tokens": 2, "cost_usd": 0.1}, "fail": false
            }),
        };
        for &kind in KINDS {
            let mut declared: Vec<&str> = kind.fields().iter().map(|f| f.name).collect();
            declared.sort_unstable();
            assert_eq!(
                read_keys(kind, json!({})),
                declared,
                "{kind:?}, empty config"
            );
            assert_eq!(
                read_keys(kind, full(kind)),
                declared,
                "{kind:?}, full config"
            );
            assert!(
                ExecutorConfig::from_json(kind, &full(kind)).is_ok(),
                "{kind:?}: the full example decodes"
            );
        }
    }

    #[test]
    fn every_field_has_a_type_a_default_and_a_doc() {
        for &kind in KINDS {
            for f in kind.fields() {
                assert!(
                    !f.ty.is_empty() && !f.default.is_empty() && f.doc.ends_with('.'),
                    "{kind:?}.{}: {f:?}",
                    f.name
                );
            }
        }
    }

    fn warnings(kind: ExecutorKind, config: Json) -> Vec<String> {
        let span = Span::new(Arc::from("t"), 1, 1);
        let node = json_to_node(&config, &span);
        let mut d = Diagnostics::new();
        decode(
            kind,
            Some(&node),
            &span,
            "steps[0].executor_config",
            None,
            &mut d,
        );
        assert!(!d.has_errors(), "{d:?}");
        d.warnings()
            .map(|w| {
                format!(
                    "{}: {} ({})",
                    w.path,
                    w.message,
                    w.hint.clone().unwrap_or_default()
                )
            })
            .collect()
    }

    #[test]
    fn unknown_keys_are_reported_with_a_suggestion() {
        assert_eq!(
            warnings(ExecutorKind::Webhook, json!({"url": "http://x", "methd": "PUT"})),
            ["steps[0].executor_config.methd: unknown key `methd` for the webhook executor; it is ignored (did you mean `method`?)"]
        );
        assert_eq!(
            warnings(ExecutorKind::Human, json!({"channel": "x"})),
            ["steps[0].executor_config.channel: unknown key `channel` for the human executor; it is ignored (the human executor takes no `executor_config` keys)"]
        );
        assert!(warnings(ExecutorKind::Shell, json!({"command": ["df"], "env": {}})).is_empty());
    }

    #[test]
    fn from_json_builds_the_typed_config() {
        let c = ExecutorConfig::from_json(ExecutorKind::Notify, &json!({"channel": "telegram"}));
        assert_eq!(
            c.ok(),
            Some(ExecutorConfig::Notify(NotifyConfig {
                channel: Channel::Telegram,
                url: None
            }))
        );
        let bad = ExecutorConfig::from_json(ExecutorKind::Notify, &json!({"channel": "sms"}));
        let msg = bad
            .err()
            .map(|d| d.errors().map(|e| e.message.clone()).collect::<Vec<_>>());
        assert_eq!(msg, Some(vec!["unknown notify channel".to_string()]));
    }
}
