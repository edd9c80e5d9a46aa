//! Declared tools (`tools:`) and the tool settings of agents (`agents.<a>.tools`,
//! `delegates`, `max_turns`, `approval_timeout_seconds`), SPEC section 10.
//!
//! Decoded here, beside the rest of `config.yaml`, so every mistake is reported at
//! its own line with the others. The checks that need the whole file (a tool an
//! agent names exists, a delegate is an agent) run once both maps are decoded.
//! MCP server names are not checked here: [`check_mcp_refs`] does that against
//! whatever set of servers the caller knows.

use crate::domain::ToolEffect;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::unset::Unset;
use super::{Agent, Config, UnsetSecret};
use crate::decode::Obj;
use crate::diag::{did_you_mean, Diagnostics, Span};
use crate::yaml;

/// `approval_timeout_seconds` when an agent does not set it (SPEC 10).
pub const DEFAULT_APPROVAL_TIMEOUT_SECONDS: u64 = 900;
/// `max_turns` when an agent does not set it (SPEC 10.5).
pub const DEFAULT_MAX_TURNS: u32 = 10;
/// The built-in tool an agent with `delegates` gets; no declared tool may take it.
pub const DELEGATE_TOOL: &str = "delegate";

/// One entry of `tools:`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredTool {
    pub name: String,
    pub description: String,
    /// A JSON Schema object (`type: object`), checked when the config loads.
    pub parameters: Value,
    pub run: ToolRun,
    pub effect: ToolEffect,
    pub approval: ApprovalRule,
    /// Where the tool is declared, for messages about it.
    pub span: Span,
}

/// How a declared tool is run: exactly one of `webhook` and `shell`.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolRun {
    Webhook(WebhookTool),
    Shell(ShellTool),
}

/// `webhook: {url, headers, timeout_seconds}`: the arguments are POSTed as JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookTool {
    pub url: String,
    /// Values are `${VAR}`-expanded when the config loads, like every string.
    pub headers: Vec<(String, String)>,
    pub timeout_seconds: Option<f64>,
}

/// `shell: {command, timeout_seconds}`: an argv list of templates over `args`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShellTool {
    /// Each element a minijinja template, compiled once at load to catch syntax
    /// errors; each renders to exactly one argv entry.
    pub command: Vec<String>,
    pub timeout_seconds: Option<f64>,
}

/// Whether a human must approve each call before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalRule {
    None,
    Required,
}

impl ApprovalRule {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalRule::None => "none",
            ApprovalRule::Required => "required",
        }
    }
}

/// One entry of an agent's `tools:` list.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentTool {
    /// The name of a declared tool.
    Declared { name: String, span: Span },
    /// `{mcp: SERVER, only: [tool, ...]}`; `only: None` means every tool of the server.
    Mcp {
        server: String,
        only: Option<Vec<String>>,
        span: Span,
    },
}

/// The keys of one `tools:` entry.
pub const TOOL_KEYS: &[&str] = &[
    "description",
    "parameters",
    "webhook",
    "shell",
    "effect",
    "approval",
];
/// The words of a tool's `effect`; the last is the default.
pub const TOOL_EFFECTS: &[&str] = &["read", "write"];
/// The words of a tool's `approval`; the first is the default.
pub const TOOL_APPROVALS: &[&str] = &["none", "required"];
pub const WEBHOOK_TOOL_KEYS: &[&str] = &["url", "headers", "timeout_seconds"];
pub const SHELL_TOOL_KEYS: &[&str] = &["command", "timeout_seconds"];
/// The mapping form of an entry of an agent's `tools:` list.
pub const AGENT_MCP_TOOL_KEYS: &[&str] = &["mcp", "only"];

/// `tools:`, every entry decoded and checked.
///
/// A webhook header built from a `${VAR}` (no default) that expanded empty is
/// recorded in `secrets`, so `serve` refuses to start instead of sending
/// `Authorization: Bearer ` (SPEC 3).
pub(super) fn decode_tools(
    top: &Obj<'_>,
    unset: &Unset,
    secrets: &mut Vec<UnsetSecret>,
    d: &mut Diagnostics,
) -> BTreeMap<String, DeclaredTool> {
    let mut out = BTreeMap::new();
    let Some(n) = top.get("tools") else {
        return out;
    };
    let Some(entries) = n.as_map() else {
        d.error(
            &n.span,
            "tools",
            format!("expected a mapping of tool names, found {}", n.type_name()),
        );
        return out;
    };
    for (k, v) in entries {
        let Some(name) = k.scalar_text() else {
            continue;
        };
        let path = crate::decode::join("tools", &name);
        if let Some(t) = decode_tool(&name, &path, &k.span, v, (unset, secrets), d) {
            out.insert(name, t);
        }
    }
    out
}

fn decode_tool(
    name: &str,
    path: &str,
    key_span: &Span,
    n: &yaml::Node,
    secrets: (&Unset, &mut Vec<UnsetSecret>),
    d: &mut Diagnostics,
) -> Option<DeclaredTool> {
    check_tool_name(name, key_span, path, d);
    let o = Obj::new(n, path, TOOL_KEYS, &[], d)?;
    let description = o.req_str(d, "description");
    let parameters = decode_parameters(&o, d);
    let effect = match o.choice(d, "effect", TOOL_EFFECTS).as_deref() {
        Some("read") => ToolEffect::Read,
        _ => ToolEffect::Write,
    };
    let approval = match o.choice(d, "approval", TOOL_APPROVALS).as_deref() {
        Some("required") => ApprovalRule::Required,
        _ => ApprovalRule::None,
    };
    let run = match (o.get("webhook"), o.get("shell")) {
        (Some(w), None) => {
            decode_webhook(w, &o.path_of("webhook"), secrets, d).map(ToolRun::Webhook)
        }
        (None, Some(s)) => decode_shell(s, &o.path_of("shell"), d).map(ToolRun::Shell),
        (Some(_), Some(_)) => {
            d.error_hint(
                o.span(),
                path,
                format!("tool `{name}` has both `webhook` and `shell`"),
                "a declared tool runs one way: keep exactly one of them",
            );
            None
        }
        (None, None) => {
            d.error_hint(
                o.span(),
                path,
                format!("tool `{name}` has neither `webhook` nor `shell`"),
                "add `webhook: {url: ...}` or `shell: {command: [...]}`",
            );
            None
        }
    };
    Some(DeclaredTool {
        name: name.to_string(),
        description: description?,
        parameters: parameters?,
        run: run?,
        effect,
        approval,
        span: n.span.clone(),
    })
}

/// OpenAI accepts function names of 1 to 64 letters, digits, `_` and `-`; the
/// built-in `delegate` is taken.
fn check_tool_name(name: &str, span: &Span, path: &str, d: &mut Diagnostics) {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if name.is_empty() || name.len() > 64 || !ok_chars {
        d.error_hint(
            span,
            path,
            format!("`{name}` is not a valid tool name"),
            "use 1 to 64 letters, digits, `_` or `-` (the function names models accept)",
        );
    }
    if name == DELEGATE_TOOL {
        d.error_hint(
            span,
            path,
            "`delegate` is the built-in tool of agents with `delegates`",
            "give the declared tool another name",
        );
    }
}

fn decode_parameters(o: &Obj<'_>, d: &mut Diagnostics) -> Option<Value> {
    let Some(n) = o.get("parameters") else {
        d.error_hint(
            o.span(),
            &o.path,
            "missing required field `parameters`",
            "a JSON Schema object, e.g. `parameters: {type: object, properties: {service: {type: string}}, required: [service]}`",
        );
        return None;
    };
    let path = o.path_of("parameters");
    if n.as_map().is_none() {
        d.error(
            &n.span,
            &path,
            format!("expected a JSON Schema mapping, found {}", n.type_name()),
        );
        return None;
    }
    let schema = n.to_json();
    if let Err(e) = crate::agent::schema::check_parameters(&schema) {
        d.error_hint(
            &n.span,
            &path,
            e,
            "`parameters` is a JSON Schema with `type: object` at the top",
        );
        return None;
    }
    Some(schema)
}

fn decode_webhook(
    n: &yaml::Node,
    path: &str,
    (unset, secrets): (&Unset, &mut Vec<UnsetSecret>),
    d: &mut Diagnostics,
) -> Option<WebhookTool> {
    let o = Obj::new(n, path, WEBHOOK_TOOL_KEYS, &[], d)?;
    for (k, v) in o.get("headers").and_then(yaml::Node::as_map).unwrap_or(&[]) {
        if let (Some(name), Some(var)) = (k.scalar_text(), unset.empty_variable_at(&v.span)) {
            secrets.push(UnsetSecret {
                key: crate::decode::join(&o.path_of("headers"), &name),
                variable: var.to_string(),
                span: v.span.clone(),
            });
        }
    }
    let url = o.req_str(d, "url")?;
    if reqwest::Url::parse(&url).is_err() {
        let at = o.get("url").map_or(o.span(), |u| &u.span);
        d.error(at, &o.path_of("url"), "not a valid URL");
        return None;
    }
    Some(WebhookTool {
        url,
        headers: o.str_map(d, "headers").unwrap_or_default(),
        timeout_seconds: positive_seconds(&o, "timeout_seconds", d),
    })
}

fn decode_shell(n: &yaml::Node, path: &str, d: &mut Diagnostics) -> Option<ShellTool> {
    let o = Obj::new(n, path, SHELL_TOOL_KEYS, &[], d)?;
    if !o.has("command") {
        o.missing(d, "command");
        return None;
    }
    let command = o.str_list(d, "command")?;
    let list = o.get("command")?;
    if command.is_empty() {
        d.error(&list.span, &o.path_of("command"), "the argv list is empty");
        return None;
    }
    let env = minijinja::Environment::new();
    let mut ok = true;
    for (i, (item, node)) in command.iter().zip(list.as_seq().unwrap_or(&[])).enumerate() {
        if let Err(e) = env.template_from_str(item) {
            ok = false;
            d.error(
                &node.span,
                &format!("{}[{i}]", o.path_of("command")),
                format!("template error: {e}"),
            );
        }
    }
    ok.then(|| ShellTool {
        command,
        timeout_seconds: positive_seconds(&o, "timeout_seconds", d),
    })
}

fn positive_seconds(o: &Obj<'_>, key: &str, d: &mut Diagnostics) -> Option<f64> {
    match o.seconds(d, key) {
        Some(v) if v > 0.0 => Some(v),
        Some(_) => {
            let at = o.get(key).map_or(o.span(), |n| &n.span);
            d.error(at, &o.path_of(key), "must be more than 0 seconds");
            None
        }
        None => None,
    }
}

/// What [`decode_agent_tools`] reads from one agent.
#[derive(Debug, Clone)]
pub(super) struct AgentToolSettings {
    pub tools: Vec<AgentTool>,
    pub delegates: Vec<(String, Span)>,
    pub max_turns: u32,
    pub approval_timeout_seconds: u64,
}

/// The tool settings of one agent. References are checked later, in
/// [`check_references`], once every tool and agent is known.
pub(super) fn decode_agent_tools(o: &Obj<'_>, d: &mut Diagnostics) -> AgentToolSettings {
    let mut s = AgentToolSettings {
        tools: Vec::new(),
        delegates: Vec::new(),
        max_turns: DEFAULT_MAX_TURNS,
        approval_timeout_seconds: DEFAULT_APPROVAL_TIMEOUT_SECONDS,
    };
    if let Some(v) = o.at_least_one(d, "max_turns") {
        s.max_turns = v.min(u32::MAX as u64) as u32;
    }
    if let Some(v) = o.at_least_one(d, "approval_timeout_seconds") {
        s.approval_timeout_seconds = v;
    }
    if let Some(n) = o.get("tools") {
        s.tools = decode_tool_list(n, &o.path_of("tools"), d);
    }
    if let Some(n) = o.get("delegates") {
        let path = o.path_of("delegates");
        match n.as_seq() {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    match item.as_str() {
                        Some(name) => s.delegates.push((name.to_string(), item.span.clone())),
                        None => {
                            d.error(
                                &item.span,
                                &format!("{path}[{i}]"),
                                format!("expected an agent name, found {}", item.type_name()),
                            );
                        }
                    }
                }
            }
            None => {
                d.error(
                    &n.span,
                    &path,
                    format!("expected a list of agent names, found {}", n.type_name()),
                );
            }
        }
    }
    s
}

fn decode_tool_list(n: &yaml::Node, path: &str, d: &mut Diagnostics) -> Vec<AgentTool> {
    let Some(items) = n.as_seq() else {
        d.error_hint(
            &n.span,
            path,
            format!("expected a list, found {}", n.type_name()),
            "e.g. `tools: [restart_service, {mcp: k8s, only: [pods_list]}]`",
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("{path}[{i}]");
        if let Some(name) = item.as_str() {
            out.push(AgentTool::Declared {
                name: name.to_string(),
                span: item.span.clone(),
            });
            continue;
        }
        if item.as_map().is_none() {
            d.error_hint(
                &item.span,
                &path,
                format!(
                    "expected a tool name or `{{mcp: SERVER}}`, found {}",
                    item.type_name()
                ),
                "a declared tool is named by its key under `tools:`",
            );
            continue;
        }
        let Some(o) = Obj::new(item, &path, AGENT_MCP_TOOL_KEYS, &[], d) else {
            continue;
        };
        let Some(server) = o.req_str(d, "mcp") else {
            continue;
        };
        let only = o.str_list(d, "only");
        if let (Some(list), Some(node)) = (&only, o.get("only")) {
            if list.is_empty() {
                d.error_hint(
                    &node.span,
                    &o.path_of("only"),
                    "`only: []` allows no tool of the server",
                    "list the tools to allow, or remove `only` to allow all of them",
                );
                continue;
            }
        }
        out.push(AgentTool::Mcp {
            server,
            only,
            span: item.span.clone(),
        });
    }
    out
}

/// Every agent's declared tools and delegates refer to something that exists.
///
/// A tool or agent written in the file but invalid (already reported) still
/// counts as existing here, so one mistake is not reported twice.
pub(super) fn check_references(
    top: &Obj<'_>,
    agents: &BTreeMap<String, Agent>,
    delegate_spans: &BTreeMap<String, Vec<(String, Span)>>,
    d: &mut Diagnostics,
) {
    let tools = written_names(top, "tools");
    let agent_names = written_names(top, "agents");
    for (name, agent) in agents {
        let mut seen: BTreeSet<String> = BTreeSet::new();
        for (i, t) in agent.tools.iter().enumerate() {
            let path = format!("agents.{name}.tools[{i}]");
            let (key, span) = match t {
                AgentTool::Declared { name: tool, span } => {
                    if !tools.contains(tool) {
                        unknown(d, span, &path, "tool", tool, tools.iter(), "`tools:`");
                    }
                    (tool.clone(), span)
                }
                AgentTool::Mcp { server, span, .. } => (format!("mcp:{server}"), span),
            };
            if !seen.insert(key) {
                d.error(span, &path, "listed twice in this agent's `tools`");
            }
        }
        let spans = delegate_spans.get(name).map(Vec::as_slice).unwrap_or(&[]);
        for (i, (delegate, span)) in spans.iter().enumerate() {
            let path = format!("agents.{name}.delegates[{i}]");
            if delegate == name {
                d.error_hint(
                    span,
                    &path,
                    format!("agent `{name}` delegates to itself"),
                    "a delegate is another agent that answers a sub-question",
                );
            } else if !agent_names.contains(delegate) {
                unknown(
                    d,
                    span,
                    &path,
                    "agent",
                    delegate,
                    agent_names.iter(),
                    "`agents:`",
                );
            }
        }
    }
    check_delegate_cycles(agents, delegate_spans, d);
}

/// Agents that delegate in a circle (`a` → `b` → `a`): a delegation could never
/// end. Each circle is reported once, at the delegate entry that closes it.
fn check_delegate_cycles(
    agents: &BTreeMap<String, Agent>,
    delegate_spans: &BTreeMap<String, Vec<(String, Span)>>,
    d: &mut Diagnostics,
) {
    fn visit(
        name: &str,
        agents: &BTreeMap<String, Agent>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        circles: &mut Vec<Vec<String>>,
    ) {
        if let Some(at) = path.iter().position(|p| p == name) {
            circles.push(path[at..].to_vec());
            return;
        }
        if done.contains(name) {
            return;
        }
        let Some(agent) = agents.get(name) else {
            return;
        };
        path.push(name.to_string());
        for next in &agent.delegates {
            if next != name {
                visit(next, agents, path, done, circles);
            }
        }
        path.pop();
        done.insert(name.to_string());
    }
    let mut circles = Vec::new();
    let mut done = BTreeSet::new();
    for name in agents.keys() {
        visit(name, agents, &mut Vec::new(), &mut done, &mut circles);
    }
    let mut reported: BTreeSet<Vec<String>> = BTreeSet::new();
    for circle in circles {
        let mut members = circle.clone();
        members.sort();
        if !reported.insert(members) {
            continue;
        }
        let (Some(last), Some(first)) = (circle.last(), circle.first()) else {
            continue;
        };
        let spans = delegate_spans.get(last).map(Vec::as_slice).unwrap_or(&[]);
        let Some((i, (_, span))) = spans.iter().enumerate().find(|(_, (n, _))| n == first) else {
            continue;
        };
        let mut shown = circle.clone();
        shown.push(first.clone());
        d.error_hint(
            span,
            &format!("agents.{last}.delegates[{i}]"),
            format!("agents delegate in a circle: {}", shown.join(" -> ")),
            "a delegation could never end; let one of them answer without delegating back",
        );
    }
}

/// The keys written under the top-level mapping `key`, valid or not.
fn written_names(top: &Obj<'_>, key: &str) -> BTreeSet<String> {
    top.get(key)
        .and_then(yaml::Node::as_map)
        .unwrap_or(&[])
        .iter()
        .filter_map(|(k, _)| k.scalar_text())
        .collect()
}

fn unknown<'a>(
    d: &mut Diagnostics,
    span: &Span,
    path: &str,
    what: &str,
    name: &str,
    known: impl Iterator<Item = &'a String> + Clone,
    section: &str,
) {
    let msg = format!("unknown {what} `{name}`");
    match did_you_mean(name, known.clone().map(String::as_str)) {
        Some(s) => d.error_hint(span, path, msg, format!("did you mean `{s}`?")),
        None => {
            let all: Vec<&str> = known.map(String::as_str).collect();
            let listed = if all.is_empty() {
                "none defined".to_string()
            } else {
                format!("known: {}", all.join(", "))
            };
            d.error_hint(
                span,
                path,
                msg,
                format!("define it under {section} ({listed})"),
            )
        }
    };
}

/// Every `{mcp: SERVER}` entry of every agent names a server in `known`: an error
/// with the entry's position for each that does not. The MCP client calls this
/// with the servers of `mcp_servers`.
pub fn check_mcp_refs(config: &Config, known: &BTreeSet<String>) -> Diagnostics {
    let mut d = Diagnostics::new();
    for (name, agent) in &config.agents {
        for (i, t) in agent.tools.iter().enumerate() {
            if let AgentTool::Mcp { server, span, .. } = t {
                if !known.contains(server) {
                    let path = format!("agents.{name}.tools[{i}].mcp");
                    unknown(
                        &mut d,
                        span,
                        &path,
                        "MCP server",
                        server,
                        known.iter(),
                        "`mcp_servers:`",
                    );
                }
            }
        }
    }
    d
}

#[cfg(test)]
mod tests;
