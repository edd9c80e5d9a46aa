//! `mcp_servers`: the MCP servers agents may use (SPEC sections 3 and 10).
//!
//! Each entry is either a stdio server (`command` argv, optional `env`) or a
//! streamable-HTTP server (`url`, optional `headers`), never both. `effects` and
//! `approval` classify single tools for servers that publish no annotations; the
//! agent loop reads them, `engine/mcp/` only connects.

use super::tools::ApprovalRule;
use crate::domain::ToolEffect;
use std::collections::BTreeMap;

use super::unset::{secret_in, Unset};
use super::UnsetSecret;
use crate::decode::Obj;
use crate::diag::Diagnostics;

/// One configured MCP server.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServer {
    pub transport: McpTransport,
    /// Every request to the server (connect, `tools/list`, `tools/call`) must be
    /// answered within this time; default 60.
    pub timeout_seconds: f64,
    /// `effects: {tool: read|write}`: the effect class of tools the server does
    /// not annotate (`readOnlyHint`).
    pub effects: BTreeMap<String, ToolEffect>,
    /// `approval: {tool: required|none}`: tools whose calls wait for a human.
    pub approval: BTreeMap<String, ApprovalRule>,
}

impl McpServer {
    /// The effect class of `tool` (SPEC 10): what `effects` says about it, else
    /// `read` when the server annotated it `readOnlyHint: true`, else `write`.
    /// The operator's word wins over the server's hint in both directions.
    pub fn effect_of(&self, tool: &str, read_only_hint: bool) -> ToolEffect {
        match self.effects.get(tool) {
            Some(e) => *e,
            None if read_only_hint => ToolEffect::Read,
            None => ToolEffect::Write,
        }
    }

    /// Whether calls of `tool` wait for a human (`approval`; default none).
    pub fn approval_of(&self, tool: &str) -> ApprovalRule {
        self.approval
            .get(tool)
            .copied()
            .unwrap_or(ApprovalRule::None)
    }
}

/// How the server is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum McpTransport {
    /// A child process speaking JSON-RPC on its stdin and stdout. `command` is an
    /// argv list run without a shell; `env` is added to the service's environment.
    Stdio {
        command: Vec<String>,
        env: BTreeMap<String, String>,
    },
    /// MCP streamable HTTP at `url`, with `headers` sent on every request.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

pub const DEFAULT_TIMEOUT_SECONDS: f64 = 60.0;

/// The keys of one `mcp_servers` entry.
pub const KEYS: &[&str] = &[
    "command",
    "env",
    "url",
    "headers",
    "timeout_seconds",
    "effects",
    "approval",
];
/// The words of `effects` values and of `approval` values.
pub const EFFECT_WORDS: &[&str] = &["read", "write"];
pub const APPROVAL_WORDS: &[&str] = &["required", "none"];

/// Decodes `mcp_servers.<name>`. Header and env values are secrets: one built
/// from a `${VAR}` (no default) that is unset is recorded for
/// `Config::require_secrets`, so `serve` does not start with a header such as
/// `Authorization: "Bearer "`.
pub(super) fn decode_server(
    o: &Obj<'_>,
    unset: &Unset,
    secrets: &mut Vec<UnsetSecret>,
    d: &mut Diagnostics,
) -> Option<McpServer> {
    let command = o.str_list(d, "command");
    let url = o.str(d, "url");
    let transport = match (command, url) {
        (Some(_), Some(_)) => {
            d.error_hint(
                o.span(),
                &o.path,
                "`command` and `url` are both set",
                "a server is either a stdio child (`command`) or streamable HTTP (`url`)",
            );
            return None;
        }
        (None, None) => {
            d.error_hint(
                o.span(),
                &o.path,
                "missing `command` or `url`",
                "`command: [\"my-mcp-server\", \"--flag\"]` for a stdio server, `url: \"http://127.0.0.1:8080/mcp\"` for streamable HTTP",
            );
            return None;
        }
        (Some(command), None) => {
            if command.first().is_none_or(|c| c.is_empty()) {
                d.error(
                    o.span(),
                    &o.path_of("command"),
                    "the argv list needs at least the program",
                );
                return None;
            }
            if o.has("headers") {
                d.error(o.span(), &o.path_of("headers"), "`headers` needs `url`");
            }
            McpTransport::Stdio {
                command,
                env: secret_map(o, "env", unset, secrets, d),
            }
        }
        (None, Some(url)) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                d.error(
                    o.span(),
                    &o.path_of("url"),
                    format!("`{url}` is not an http:// or https:// URL"),
                );
            }
            if o.has("env") {
                d.error(o.span(), &o.path_of("env"), "`env` needs `command`");
            }
            McpTransport::Http {
                url,
                headers: secret_map(o, "headers", unset, secrets, d),
            }
        }
    };
    let timeout_seconds = match o.seconds(d, "timeout_seconds") {
        Some(v) if v > 0.0 => v,
        Some(_) => {
            d.error(
                o.span(),
                &o.path_of("timeout_seconds"),
                "must be more than 0 seconds",
            );
            DEFAULT_TIMEOUT_SECONDS
        }
        None => DEFAULT_TIMEOUT_SECONDS,
    };
    let effects = choice_map(o, "effects", EFFECT_WORDS, d)
        .into_iter()
        .map(|(k, v)| {
            let e = if v == "read" {
                ToolEffect::Read
            } else {
                ToolEffect::Write
            };
            (k, e)
        })
        .collect();
    let approval = choice_map(o, "approval", APPROVAL_WORDS, d)
        .into_iter()
        .map(|(k, v)| {
            let a = if v == "required" {
                ApprovalRule::Required
            } else {
                ApprovalRule::None
            };
            (k, a)
        })
        .collect();
    Some(McpServer {
        transport,
        timeout_seconds,
        effects,
        approval,
    })
}

/// A mapping of strings whose values are secrets (see [`decode_server`]).
fn secret_map(
    o: &Obj<'_>,
    key: &str,
    unset: &Unset,
    secrets: &mut Vec<UnsetSecret>,
    d: &mut Diagnostics,
) -> BTreeMap<String, String> {
    let Some(pairs) = o.str_map(d, key) else {
        return BTreeMap::new();
    };
    if let Some(n) = o.get(key) {
        for (k, v) in n.as_map().unwrap_or_default() {
            if let Some(name) = k.scalar_text() {
                secret_in(
                    v,
                    &crate::decode::join(&o.path_of(key), &name),
                    unset,
                    secrets,
                );
            }
        }
    }
    pairs.into_iter().collect()
}

/// `{tool: word}` where each word is one of `allowed`.
fn choice_map(
    o: &Obj<'_>,
    key: &str,
    allowed: &[&str],
    d: &mut Diagnostics,
) -> Vec<(String, String)> {
    let Some(pairs) = o.str_map(d, key) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (tool, word) in pairs {
        if allowed.contains(&word.as_str()) {
            out.push((tool, word));
        } else {
            let span = o
                .get(key)
                .and_then(|n| n.get(&tool))
                .map(|n| n.span.clone())
                .unwrap_or_else(|| o.span().clone());
            d.error_hint(
                &span,
                &crate::decode::join(&o.path_of(key), &tool),
                format!("unknown value `{word}`"),
                format!("one of: {}", allowed.join(", ")),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{Config, Error};
    use super::*;

    fn load(yaml: &str) -> Result<Config, String> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.yaml");
        std::fs::write(&p, yaml).unwrap();
        match Config::load(&p, true) {
            Ok((c, _)) => Ok(c),
            Err(Error::Invalid(d)) => Err(d.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn both_transports_decode_with_their_defaults() {
        let c = load(
            "mcp_servers:\n  k8s: {command: [kubectl-mcp-server, --read-only], env: {KUBECONFIG: /k}}\n  grafana:\n    url: http://127.0.0.1:8080/mcp\n    headers: {Authorization: Bearer x}\n    timeout_seconds: 5\n    effects: {search: read, annotate: write}\n    approval: {annotate: required}\n",
        )
        .unwrap();
        let k8s = &c.mcp_servers["k8s"];
        assert_eq!(
            k8s.transport,
            McpTransport::Stdio {
                command: vec!["kubectl-mcp-server".into(), "--read-only".into()],
                env: [("KUBECONFIG".to_string(), "/k".to_string())].into(),
            }
        );
        assert_eq!(k8s.timeout_seconds, 60.0);
        let g = &c.mcp_servers["grafana"];
        assert_eq!(
            g.transport,
            McpTransport::Http {
                url: "http://127.0.0.1:8080/mcp".into(),
                headers: [("Authorization".to_string(), "Bearer x".to_string())].into(),
            }
        );
        assert_eq!(g.timeout_seconds, 5.0);
        assert_eq!(g.effects["search"], ToolEffect::Read);
        assert_eq!(g.effects["annotate"], ToolEffect::Write);
        assert_eq!(g.approval["annotate"], ApprovalRule::Required);
    }

    #[test]
    fn the_operator_s_effect_wins_over_the_hint() {
        let c = load("mcp_servers:\n  g: {url: \"http://h\", effects: {a: read, b: write}, approval: {b: required}}\n").unwrap();
        let g = &c.mcp_servers["g"];
        let check = |tool: &str, hint: bool, want: ToolEffect| {
            assert_eq!(g.effect_of(tool, hint), want, "{tool} {hint}");
        };
        check("a", false, ToolEffect::Read);
        check("b", true, ToolEffect::Write);
        check("c", true, ToolEffect::Read);
        check("c", false, ToolEffect::Write);
        assert_eq!(g.approval_of("b"), ApprovalRule::Required);
        assert_eq!(g.approval_of("a"), ApprovalRule::None);
    }

    #[test]
    fn mistakes_are_reported_with_their_position() {
        let check = |yaml: &str, want: &str| {
            let err = load(yaml).unwrap_err();
            assert!(err.contains(want), "{yaml}\n---\n{err}");
        };
        check(
            "mcp_servers:\n  k8s: {command: [x], timeout_secs: 3}\n",
            ":2:23: error: mcp_servers.k8s: unknown key `timeout_secs`",
        );
        check(
            "mcp_servers:\n  k8s: {command: [x], timeout_secs: 3}\n",
            "did you mean `timeout_seconds`?",
        );
        check(
            "mcp_servers:\n  k8s: {env: {A: b}}\n",
            "missing `command` or `url`",
        );
        check(
            "mcp_servers:\n  k8s: {command: [x], url: \"http://h/mcp\"}\n",
            "`command` and `url` are both set",
        );
        check(
            "mcp_servers:\n  k8s: {command: []}\n",
            "needs at least the program",
        );
        check(
            "mcp_servers:\n  g: {url: \"ftp://h\"}\n",
            "is not an http:// or https:// URL",
        );
        check(
            "mcp_servers:\n  g: {url: \"http://h\", effects: {x: readonly}}\n",
            ":2:37: error: mcp_servers.g.effects.x: unknown value `readonly`",
        );
        check(
            "mcp_servers:\n  g: {url: \"http://h\", approval: {x: maybe}}\n",
            "one of: required, none",
        );
        check(
            "mcp_servers:\n  g: {url: \"http://h\", timeout_seconds: 0}\n",
            "must be more than 0 seconds",
        );
    }

    #[test]
    fn a_header_from_an_unset_variable_fails_closed() {
        let c = load(
            "mcp_servers:\n  g: {url: \"http://h\", headers: {Authorization: \"Bearer ${VECTORSTEP_TEST_UNSET_MCP_TOKEN}\"}}\n",
        )
        .unwrap();
        let err = c.require_secrets().unwrap_err().to_string();
        assert!(
            err.contains("mcp_servers.g.headers.Authorization")
                && err.contains("VECTORSTEP_TEST_UNSET_MCP_TOKEN"),
            "{err}"
        );
        let c = load(
            "mcp_servers:\n  g: {url: \"http://h\", headers: {Authorization: \"Bearer ${VECTORSTEP_TEST_UNSET_MCP_TOKEN:-}\"}}\n",
        )
        .unwrap();
        assert!(c.require_secrets().is_ok());
    }
}
