//! `agent` (also `gateway`, `openclaw`): names an agent of config.yaml.

use super::{FieldSpec, Fields};
use crate::diag::{did_you_mean, Diagnostics};

pub const FIELDS: &[FieldSpec] = &[FieldSpec {
    name: "agent",
    ty: "string",
    default: "required",
    doc: "A key of `agents:` in config.yaml.",
}];

#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// The agent's name in config.yaml.
    pub agent: String,
}

pub(super) fn decode(f: &mut Fields<'_>, d: &mut Diagnostics) -> Option<AgentConfig> {
    let known = f.agents();
    let names = || match known {
        Some(k) if !k.is_empty() => k.join(", "),
        _ => "(none defined)".to_string(),
    };
    let Some(n) = f.get("agent") else {
        d.error_hint(
            f.span(),
            f.path(),
            "the agent executor needs `executor_config.agent`",
            format!("name one of the agents in config.yaml: {}", names()),
        );
        return None;
    };
    let path = f.path_of("agent");
    let Some(a) = n.as_str() else {
        f.wrong_type(d, n, &path, "an agent name");
        return None;
    };
    if let Some(k) = known.filter(|k| !k.contains(&a)) {
        let mut hint = String::new();
        if let Some(s) = did_you_mean(a, k.iter().copied()) {
            hint.push_str(&format!("did you mean `{s}`? "));
        }
        hint.push_str(&format!("agents defined in config.yaml: {}", names()));
        d.error_hint(&n.span, &path, format!("unknown agent `{a}`"), hint);
        return None;
    }
    Some(AgentConfig {
        agent: a.to_string(),
    })
}
