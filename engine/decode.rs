//! Typed reading of [`yaml::Node`] trees with every problem reported, not just the first.
//!
//! Validation of `config.yaml` and pipeline files goes through [`Obj`]: it checks a
//! mapping's keys against the known set (unknown keys get a "did you mean" hint),
//! and its getters report wrong types at the value's own position. A getter that
//! fails records a diagnostic and returns `None`, so callers keep going and the
//! operator sees every mistake in one run.

use crate::diag::{did_you_mean, Diagnostics, Span};
use crate::yaml::{Node, Value};

/// Joins a field path: `steps[2]` + `retry` -> `steps[2].retry`.
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// A validated mapping node.
pub struct Obj<'a> {
    pub node: &'a Node,
    pub path: String,
    /// Known keys suggested for misspelled ones: their absence is not reported
    /// again as "missing", the misspelling already explains it.
    suggested: Vec<&'static str>,
}

/// Keys that belong to VectorStep features this engine does not implement: they
/// load with a warning so existing pipeline files keep working.
pub const IGNORED_VECTORSTEP_KEYS: &[&str] = &[
    "verifier",
    "grounding",
    "deterministic_checks",
    "calibration",
    "readiness",
];

impl<'a> Obj<'a> {
    /// Checks that `node` is a mapping whose keys are all in `known`. Keys in
    /// `ignored` produce a warning instead of an error.
    pub fn new(
        node: &'a Node,
        path: &str,
        known: &[&'static str],
        ignored: &[&str],
        d: &mut Diagnostics,
    ) -> Option<Obj<'a>> {
        let Some(entries) = node.as_map() else {
            d.error(
                &node.span,
                path,
                format!("expected a mapping, found {}", node.type_name()),
            );
            return None;
        };
        let mut seen: Vec<&str> = Vec::new();
        let mut suggested = Vec::new();
        for (k, _) in entries {
            let Some(key) = k.as_str() else {
                d.error(
                    &k.span,
                    path,
                    format!("keys must be strings, found {}", k.type_name()),
                );
                continue;
            };
            if seen.contains(&key) {
                d.error(&k.span, &join(path, key), "duplicate key");
                continue;
            }
            seen.push(key);
            if known.contains(&key) {
                continue;
            }
            if ignored.contains(&key) {
                d.warning(
                    &k.span,
                    &join(path, key),
                    format!("`{key}` is a VectorStep feature this engine does not implement; it is ignored"),
                );
                continue;
            }
            let msg = format!("unknown key `{key}`");
            match did_you_mean(key, known.iter().copied()) {
                Some(s) => {
                    suggested.push(s);
                    d.error_hint(&k.span, path, msg, format!("did you mean `{s}`?"))
                }
                None => d.error_hint(
                    &k.span,
                    path,
                    msg,
                    format!("known keys here: {}", known.join(", ")),
                ),
            };
        }
        Some(Obj {
            node,
            path: path.to_string(),
            suggested,
        })
    }

    pub fn span(&self) -> &Span {
        &self.node.span
    }

    pub fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// The value of `key`; an explicit `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&'a Node> {
        self.node.get(key).filter(|n| !n.is_null())
    }

    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn wrong_type(&self, d: &mut Diagnostics, key: &str, n: &Node, expected: &str) {
        d.error(
            &n.span,
            &self.path_of(key),
            format!("expected {expected}, found {}", n.type_name()),
        );
    }

    pub fn missing(&self, d: &mut Diagnostics, key: &str) {
        if self.suggested.contains(&key) {
            return;
        }
        let msg = format!("missing required field `{key}`");
        match missing_hint(key) {
            Some(h) => d.error_hint(&self.node.span, &self.path, msg, h),
            None => d.error(&self.node.span, &self.path, msg),
        };
    }

    pub fn str(&self, d: &mut Diagnostics, key: &str) -> Option<String> {
        let n = self.get(key)?;
        match &n.value {
            Value::Str(s) => Some(s.clone()),
            _ => {
                self.wrong_type(d, key, n, "a string");
                None
            }
        }
    }

    pub fn req_str(&self, d: &mut Diagnostics, key: &str) -> Option<String> {
        if !self.has(key) {
            self.missing(d, key);
            return None;
        }
        self.str(d, key)
    }

    /// A string, or any scalar written where the original accepted text.
    pub fn text(&self, d: &mut Diagnostics, key: &str) -> Option<String> {
        let n = self.get(key)?;
        match n.scalar_text() {
            Some(s) => Some(s),
            None => {
                self.wrong_type(d, key, n, "a string");
                None
            }
        }
    }

    pub fn bool(&self, d: &mut Diagnostics, key: &str) -> Option<bool> {
        let n = self.get(key)?;
        match n.value {
            Value::Bool(b) => Some(b),
            _ => {
                self.wrong_type(d, key, n, "true or false");
                None
            }
        }
    }

    pub fn f64(&self, d: &mut Diagnostics, key: &str) -> Option<f64> {
        let n = self.get(key)?;
        match n.value {
            Value::Int(i) => Some(i as f64),
            Value::Float(f) if f.is_finite() => Some(f),
            _ => {
                self.wrong_type(d, key, n, "a number");
                None
            }
        }
    }

    /// A number within 0..=1 (confidences and thresholds).
    pub fn fraction(&self, d: &mut Diagnostics, key: &str) -> Option<f64> {
        let v = self.f64(d, key)?;
        if !(0.0..=1.0).contains(&v) {
            let n = self.get(key).unwrap_or(self.node);
            d.error_hint(
                &n.span,
                &self.path_of(key),
                format!("{v} is outside 0..1"),
                "confidences and thresholds are fractions between 0 and 1, e.g. 0.75",
            );
            return None;
        }
        Some(v)
    }

    /// A number of seconds, > 0.
    pub fn seconds(&self, d: &mut Diagnostics, key: &str) -> Option<f64> {
        let v = self.f64(d, key)?;
        if v < 0.0 {
            let n = self.get(key).unwrap_or(self.node);
            d.error(
                &n.span,
                &self.path_of(key),
                format!("{v} is negative; use a number of seconds >= 0"),
            );
            return None;
        }
        Some(v)
    }

    pub fn u64(&self, d: &mut Diagnostics, key: &str) -> Option<u64> {
        let n = self.get(key)?;
        match n.value {
            Value::Int(i) if i >= 0 => Some(i as u64),
            Value::Int(i) => {
                d.error(
                    &n.span,
                    &self.path_of(key),
                    format!("{i} is negative; expected a whole number >= 0"),
                );
                None
            }
            _ => {
                self.wrong_type(d, key, n, "a whole number");
                None
            }
        }
    }

    /// A whole number that must be at least 1 (attempts, iterations, item limits).
    pub fn at_least_one(&self, d: &mut Diagnostics, key: &str) -> Option<u64> {
        let v = self.u64(d, key)?;
        if v < 1 {
            let n = self.get(key).unwrap_or(self.node);
            d.error_hint(
                &n.span,
                &self.path_of(key),
                format!("must be at least 1, found {v}"),
                format!("`{key}: 0` would never run the step; remove the key or use 1 or more"),
            );
            return None;
        }
        Some(v)
    }

    /// One of a fixed set of words.
    pub fn choice(&self, d: &mut Diagnostics, key: &str, allowed: &[&str]) -> Option<String> {
        let n = self.get(key)?;
        let s = self.str(d, key)?;
        if allowed.contains(&s.as_str()) {
            return Some(s);
        }
        let msg = format!("`{s}` is not one of: {}", allowed.join(", "));
        match did_you_mean(&s, allowed.iter().copied()) {
            Some(m) => d.error_hint(
                &n.span,
                &self.path_of(key),
                msg,
                format!("did you mean `{m}`?"),
            ),
            None => d.error(&n.span, &self.path_of(key), msg),
        };
        None
    }

    pub fn str_list(&self, d: &mut Diagnostics, key: &str) -> Option<Vec<String>> {
        let n = self.get(key)?;
        let Some(items) = n.as_seq() else {
            self.wrong_type(d, key, n, "a list of strings");
            return None;
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match item.scalar_text() {
                Some(s) => out.push(s),
                None => {
                    d.error(
                        &item.span,
                        &format!("{}[{i}]", self.path_of(key)),
                        format!("expected a string, found {}", item.type_name()),
                    );
                }
            }
        }
        Some(out)
    }

    /// A mapping of strings to strings (labels, vars, headers).
    pub fn str_map(&self, d: &mut Diagnostics, key: &str) -> Option<Vec<(String, String)>> {
        let n = self.get(key)?;
        let Some(entries) = n.as_map() else {
            self.wrong_type(d, key, n, "a mapping of strings");
            return None;
        };
        let mut out = Vec::new();
        for (k, v) in entries {
            let Some(k) = k.scalar_text() else { continue };
            match v.scalar_text() {
                Some(s) => out.push((k, s)),
                None if v.is_null() => out.push((k, String::new())),
                None => {
                    d.error(
                        &v.span,
                        &join(&self.path_of(key), &k),
                        format!("expected a string, found {}", v.type_name()),
                    );
                }
            }
        }
        Some(out)
    }

    /// A free-form mapping kept as JSON (e.g. `executor_config`).
    pub fn json_map(&self, d: &mut Diagnostics, key: &str) -> Option<serde_json::Value> {
        let n = self.get(key)?;
        if n.as_map().is_none() {
            self.wrong_type(d, key, n, "a mapping");
            return None;
        }
        Some(n.to_json())
    }
}

/// What to write for a required field that is absent.
fn missing_hint(key: &str) -> Option<String> {
    Some(match key {
        "executor" => format!("one of: {}", crate::pipeline::ExecutorKind::NAMES.join(", ")),
        "name" => "every step, group and fan-out needs a unique `name`".into(),
        "over" => "the item list to fan out over, e.g. `over: \"{{ steps.triage.services | tojson }}\"`".into(),
        "steps" => "a list of steps, e.g. `steps: [{name: triage, executor: mock}]`".into(),
        "trigger" => "`trigger: {}` matches every alert; add `match:` conditions to narrow it".into(),
        "template" => "the message text, a Jinja template such as `\"{{ pipeline_name }} escalated: {{ step_summary }}\"`".into(),
        _ => return None,
    })
}
