//! The reader every decoder uses: typed getters that report problems at the value's
//! position and remember which keys were read, so [`Fields::finish`] can report
//! the rest as unknown; the [`Choice`] helper for enum-valued fields; and the walk
//! that finds template strings.

use serde_json::Value as Json;

use super::{ExecutorKind, TemplateSite};
use crate::decode::join;
use crate::diag::{did_you_mean, Diagnostics, Span};
use crate::yaml::{Node, Value};

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
    /// A reader for `node` (the `executor_config` mapping, `None` when absent or
    /// not a mapping); `span` is where to report a missing required key.
    pub(super) fn new(
        node: Option<&'a Node>,
        span: Span,
        path: &str,
        kind: ExecutorKind,
        agents: Option<&'a [&'a str]>,
    ) -> Self {
        Fields {
            node,
            span,
            path: path.to_string(),
            kind,
            read: Vec::new(),
            templates: Vec::new(),
            agents,
        }
    }

    /// The keys read so far, in the order they were first read.
    #[cfg(test)]
    pub(super) fn read(&self) -> &[&'static str] {
        &self.read
    }

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
    pub(super) fn finish(self, d: &mut Diagnostics) -> Vec<TemplateSite> {
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

pub(super) fn number(n: &Node) -> Option<f64> {
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

pub(super) fn json_to_node(v: &Json, span: &Span) -> Node {
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
