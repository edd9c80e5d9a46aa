//! What `${VAR}` expansion found unset, kept per node so that a secret built from
//! an unset variable fails closed. A leaf of `config`: the decoders of the config
//! (`decode`, `mcp`, `tools`) all use it, and it uses none of them.

use super::UnsetSecret;
use crate::diag::Span;
use crate::yaml;

/// What expansion found unset: every variable without a default (for the
/// warning), and, per string node, the variables written as `${VAR}` that were
/// unset or empty, so a secret built from one fails closed (`Config::require_secrets`).
#[derive(Debug, Default)]
pub(super) struct Unset {
    /// Each variable without a default that was unset, where it was used.
    pub(super) missing: Vec<(String, Span)>,
    pub(super) by_node: Vec<(Span, String)>,
}

impl Unset {
    /// Each unset variable once, at the first place it is used.
    pub(super) fn first_uses(&self) -> Vec<(String, Span)> {
        let mut seen = std::collections::BTreeSet::new();
        self.missing
            .iter()
            .filter(|(name, _)| seen.insert(name.clone()))
            .cloned()
            .collect()
    }

    /// The first `${VAR}` without a default that expanded empty inside the node at `span`.
    pub(super) fn empty_variable_at(&self, span: &Span) -> Option<&str> {
        self.by_node
            .iter()
            .find(|(s, _)| s == span)
            .map(|(_, v)| v.as_str())
    }
}

/// Records `node` (a header or env value, at `key`) as an unset secret when a
/// `${VAR}` without a default inside it expanded empty, even if the rest of the
/// text is not empty (`"Bearer ${TOKEN}"`).
pub(super) fn secret_in(node: &yaml::Node, key: &str, unset: &Unset, sink: &mut Vec<UnsetSecret>) {
    if let Some(var) = unset.empty_variable_at(&node.span) {
        sink.push(UnsetSecret {
            key: key.to_string(),
            variable: var.to_string(),
            span: node.span.clone(),
        });
    }
}
