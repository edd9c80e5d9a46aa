//! The step library (`use:`): named step snippets merged into pipeline entries
//! before validation, as the original does on the raw YAML.
//!
//! Merge rule (reference 1.8): start from the library step without `description`
//! and `tags`; every local key replaces the library's, except `executor_config`,
//! which merges one level deep. Inside `parallel` branches and `fan_out` blocks only
//! the keys those shapes accept are taken from the library.

use std::collections::BTreeMap;

use crate::diag::Diagnostics;
use crate::yaml::{Node, Value};

/// The key of a pipeline entry that names a library step.
pub const USE_KEY: &str = "use";

#[derive(Debug, Default, Clone)]
pub struct Library {
    pub steps: BTreeMap<String, Node>,
}

impl Library {
    /// Adds one parsed library file, named by its `name`. The loader reads the
    /// files; they are validated as steps by the caller.
    pub fn add(&mut self, node: Node, d: &mut Diagnostics) {
        let Some(name) = node.get("name").and_then(Node::as_str).map(str::to_string) else {
            d.error_hint(
                &node.span,
                "",
                "a library step needs a string `name`",
                "pipelines reference it as `- use: <name>`",
            );
            return;
        };
        self.steps.insert(name, node);
    }

    pub fn names(&self) -> Vec<&str> {
        self.steps.keys().map(String::as_str).collect()
    }

    /// Returns `entry` with its `use:` resolved, or `entry` unchanged when it has
    /// none. `accepted` limits which library keys are taken (None: all).
    pub fn resolve(
        &self,
        entry: &Node,
        accepted: Option<&[&str]>,
        path: &str,
        d: &mut Diagnostics,
    ) -> Option<Node> {
        let Some(use_node) = entry.get(USE_KEY) else {
            return Some(entry.clone());
        };
        let Some(name) = use_node.as_str() else {
            d.error(
                &use_node.span,
                &crate::decode::join(path, USE_KEY),
                format!(
                    "expected a library step name, found {}",
                    use_node.type_name()
                ),
            );
            return None;
        };
        let Some(lib) = self.steps.get(name) else {
            let available = self.names();
            let hint = if available.is_empty() {
                "the step library is empty; check `step_library_dir` in config.yaml".to_string()
            } else {
                let mut h = String::new();
                if let Some(s) = crate::diag::did_you_mean(name, available.iter().copied()) {
                    h.push_str(&format!("did you mean `{s}`? "));
                }
                h.push_str(&format!(
                    "available library steps: {}",
                    available.join(", ")
                ));
                h
            };
            d.error_hint(
                &use_node.span,
                &crate::decode::join(path, USE_KEY),
                format!("unknown library step `{name}`"),
                hint,
            );
            return None;
        };
        Some(merge(lib, entry, accepted))
    }
}

fn merge(lib: &Node, local: &Node, accepted: Option<&[&str]>) -> Node {
    let mut merged: Vec<(Node, Node)> = lib
        .as_map()
        .unwrap_or_default()
        .iter()
        .filter(|(k, _)| {
            let key = k.as_str().unwrap_or("");
            !matches!(key, "description" | "tags" | "when")
                && accepted.is_none_or(|a| a.contains(&key))
        })
        .cloned()
        .collect();
    for (k, v) in local.as_map().unwrap_or_default() {
        let key = k.as_str().unwrap_or("");
        if key == USE_KEY {
            continue;
        }
        match merged.iter_mut().find(|(mk, _)| mk.as_str() == Some(key)) {
            Some((_, existing)) if key == "executor_config" => {
                *existing = merge_one_level(existing, v);
            }
            Some(slot) => *slot = (k.clone(), v.clone()),
            None => merged.push((k.clone(), v.clone())),
        }
    }
    Node::new(Value::Map(merged), local.span.clone())
}

fn merge_one_level(base: &Node, over: &Node) -> Node {
    let (Some(b), Some(o)) = (base.as_map(), over.as_map()) else {
        return over.clone();
    };
    let mut out = b.to_vec();
    for (k, v) in o {
        match out.iter_mut().find(|(bk, _)| bk.as_str() == k.as_str()) {
            Some(slot) => *slot = (k.clone(), v.clone()),
            None => out.push((k.clone(), v.clone())),
        }
    }
    Node::new(Value::Map(out), over.span.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml;
    use std::sync::Arc;

    fn node(src: &str) -> Node {
        yaml::parse(&Arc::from("t.yaml"), src).unwrap()
    }

    #[test]
    fn local_keys_win_and_executor_config_merges_one_level() {
        let mut lib = Library::default();
        lib.steps.insert(
            "check".into(),
            node("name: check\ndescription: d\nexecutor: shell\nexecutor_config: {command: [df], env: {A: '1'}}\ntimeout_seconds: 5\n"),
        );
        let mut d = Diagnostics::new();
        let out = lib
            .resolve(
                &node("use: check\nname: mine\nexecutor_config: {env: {B: '2'}}\n"),
                None,
                "steps[0]",
                &mut d,
            )
            .unwrap();
        assert!(d.is_empty());
        assert_eq!(out.get("name").unwrap().as_str(), Some("mine"));
        assert!(out.get("description").is_none());
        let cfg = out.get("executor_config").unwrap();
        assert!(cfg.get("command").is_some());
        // Nested mappings are replaced whole, not merged.
        assert!(cfg.get("env").unwrap().get("A").is_none());
        assert!(cfg.get("env").unwrap().get("B").is_some());
    }

    #[test]
    fn unknown_name_lists_available() {
        let mut lib = Library::default();
        lib.steps.insert(
            "check-disk".into(),
            node("name: check-disk\nexecutor: mock\n"),
        );
        let mut d = Diagnostics::new();
        assert!(lib
            .resolve(&node("use: check-disc\n"), None, "steps[1]", &mut d)
            .is_none());
        let text = d.to_string();
        assert!(text.contains("unknown library step `check-disc`"), "{text}");
        assert!(text.contains("did you mean `check-disk`?"), "{text}");
    }
}
