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

use crate::decode::join;
use crate::diag::{did_you_mean, Diagnostics, Span};
use crate::yaml::{Node, Value};

pub mod agent;
pub mod human;
pub mod mock;
pub mod notify;
pub mod pipeline;
pub mod shell;
pub mod webhook;

pub use agent::AgentConfig;
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
    let mut f = Fields {
        node: node.filter(|n| n.as_map().is_some()),
        span: node.map(|n| &n.span).unwrap_or(span).clone(),
        path: path.to_string(),
        kind,
        read: Vec::new(),
        templates: Vec::new(),
        agents,
    };
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

/// Reads the keys of one `executor_config` and remembers which were read, so the
/// rest can be reported as unknown.
pub struct Fields<'a> {
    node: Option<&'a Node>,
    /// The config's own position, or the unit's when the config is absent.
    span: Span,
    path: String,
    kind: ExecutorKind,
    read: Vec<&'static str>,
    templates: Vec<TemplateSite>,
    agents: Option<&'a [&'a str]>,
}

impl<'a> Fields<'a> {
    /// The value of `key`; an explicit `null` counts as absent.
    pub fn get(&mut self, key: &'static str) -> Option<&'a Node> {
        if !self.read.contains(&key) {
            self.read.push(key);
        }
        self.node.and_then(|n| n.get(key)).filter(|n| !n.is_null())
    }

    pub fn span(&self) -> &Span {
        &self.span
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// The agents of config.yaml, when the caller knows them.
    pub fn agents(&self) -> Option<&'a [&'a str]> {
        self.agents
    }

    /// Reports `n` (at `path`) as not being `expected`.
    pub fn wrong_type(&self, d: &mut Diagnostics, n: &Node, path: &str, expected: &str) {
        d.error(
            &n.span,
            path,
            format!("expected {expected}, found {}", n.type_name()),
        );
    }

    /// A string value of `key`; any other type is reported as not `expected`.
    pub fn string(
        &mut self,
        d: &mut Diagnostics,
        key: &'static str,
        expected: &str,
    ) -> Option<String> {
        let n = self.get(key)?;
        match n.as_str() {
            Some(s) => Some(s.to_string()),
            None => {
                self.wrong_type(d, n, &self.path_of(key), expected);
                None
            }
        }
    }

    /// A number (integer or float) of `key`.
    pub fn number(&mut self, d: &mut Diagnostics, key: &'static str) -> Option<f64> {
        let n = self.get(key)?;
        number(n).or_else(|| {
            self.wrong_type(d, n, &self.path_of(key), "a number");
            None
        })
    }

    /// A mapping of scalars (headers, env): each value as text.
    pub fn scalar_map(
        &mut self,
        d: &mut Diagnostics,
        key: &'static str,
    ) -> Option<Vec<(String, String)>> {
        let n = self.get(key)?;
        let path = self.path_of(key);
        let Some(entries) = n.as_map() else {
            self.wrong_type(d, n, &path, "a mapping");
            return None;
        };
        let mut out = Vec::with_capacity(entries.len());
        for (k, v) in entries {
            let k = k.scalar_text().unwrap_or_default();
            match v.scalar_text() {
                Some(s) => out.push((k, s)),
                None => self.wrong_type(d, v, &join(&path, &k), "a string"),
            }
        }
        Some(out)
    }

    /// One of the names of `T`, through its [`Choice`] table.
    pub fn choice<T: Choice>(&mut self, d: &mut Diagnostics, key: &'static str) -> Option<T> {
        let n = self.get(key)?;
        if let Some(v) = n.as_str().and_then(T::parse) {
            return Some(v);
        }
        let mut hint = String::new();
        if let Some(s) = n.as_str().and_then(|s| did_you_mean(s, T::names())) {
            hint.push_str(&format!("did you mean `{s}`? "));
        }
        hint.push_str(&format!(
            "{}: {}",
            T::PLURAL,
            T::names().collect::<Vec<_>>().join(", ")
        ));
        d.error_hint(
            &n.span,
            &self.path_of(key),
            format!("unknown {}", T::WHAT),
            hint,
        );
        None
    }

    /// A string that is compiled as a template at `pointer`.
    pub fn template(&mut self, pointer: String, node: Node, path: String) {
        self.templates.push(TemplateSite {
            pointer,
            node,
            path,
        });
    }

    /// Every string inside `n` that looks like a template.
    pub fn string_templates(&mut self, n: &Node, pointer: &str, path: &str) {
        template_sites(n, pointer, path, &mut self.templates);
    }

    /// Reports every key that no decoder read, and hands back the template sites.
    /// Unknown keys are warnings: an executor has always ignored keys it does not
    /// use, and a pipeline that loaded before must keep loading.
    fn finish(self, d: &mut Diagnostics) -> Vec<TemplateSite> {
        let Some(entries) = self.node.and_then(Node::as_map) else {
            return self.templates;
        };
        for (k, _) in entries {
            let key = k.scalar_text().unwrap_or_default();
            if self.read.contains(&key.as_str()) {
                continue;
            }
            let kind = self.kind.as_str();
            let msg = format!("unknown key `{key}` for the {kind} executor; it is ignored");
            let hint = match did_you_mean(&key, self.read.iter().copied()) {
                Some(s) => format!("did you mean `{s}`?"),
                None if self.read.is_empty() => {
                    format!("the {kind} executor takes no `executor_config` keys")
                }
                None => format!("known keys here: {}", self.read.join(", ")),
            };
            d.warning_hint(&k.span, &self.path_of(&key), msg, hint);
        }
        self.templates
    }
}

/// An enum-valued field: its names are listed once, in `ALL`.
pub trait Choice: Copy + Sized + 'static {
    const ALL: &'static [(&'static str, Self)];
    /// What a value is, for "unknown notify channel".
    const WHAT: &'static str;
    /// What the names are, for "channels: log, webhook, telegram".
    const PLURAL: &'static str;

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == s).map(|(_, v)| *v)
    }

    fn names() -> impl Iterator<Item = &'static str> {
        Self::ALL.iter().map(|(n, _)| *n)
    }
}

/// The name `v` is listed under in `T::ALL`.
pub fn choice_name<T: Choice + PartialEq>(v: T) -> &'static str {
    T::ALL
        .iter()
        .find(|(_, x)| *x == v)
        .map(|(n, _)| *n)
        .unwrap_or("")
}

fn number(n: &Node) -> Option<f64> {
    match n.value {
        Value::Int(i) => Some(i as f64),
        Value::Float(f) => Some(f),
        _ => None,
    }
}

/// Collects every string inside `n` that contains `{{` or `{%`, keyed by pointer.
pub fn template_sites(n: &Node, pointer: &str, path: &str, out: &mut Vec<TemplateSite>) {
    match &n.value {
        Value::Str(s) if s.contains("{{") || s.contains("{%") => out.push(TemplateSite {
            pointer: pointer.to_string(),
            node: n.clone(),
            path: path.to_string(),
        }),
        Value::Map(entries) => {
            for (k, v) in entries {
                let key = k.scalar_text().unwrap_or_default();
                template_sites(v, &format!("{pointer}/{key}"), &join(path, &key), out);
            }
        }
        Value::Seq(items) => {
            for (i, v) in items.iter().enumerate() {
                template_sites(v, &format!("{pointer}/{i}"), &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn json_to_node(v: &Json, span: &Span) -> Node {
    let value = match v {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::Str(s.clone()),
        Json::Array(items) => Value::Seq(items.iter().map(|x| json_to_node(x, span)).collect()),
        Json::Object(m) => Value::Map(
            m.iter()
                .map(|(k, x)| {
                    (
                        Node::new(Value::Str(k.clone()), span.clone()),
                        json_to_node(x, span),
                    )
                })
                .collect(),
        ),
    };
    Node::new(value, span.clone())
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
        let mut f = Fields {
            node: Some(&node),
            span: span.clone(),
            path: "executor_config".into(),
            kind,
            read: Vec::new(),
            templates: Vec::new(),
            agents: None,
        };
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
        let mut keys = f.read;
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
