//! The decoding of declared tools and agents' tool settings, through
//! `Config::load` on real files: every mistake with its file:line.

use super::*;
use crate::config::{Error, ProviderKind};
use std::path::Path;

fn load(text: &str) -> Result<Config, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let p = dir.path().join("config.yaml");
    std::fs::write(&p, text).map_err(|e| e.to_string())?;
    match Config::load(&p, true) {
        Ok((c, _)) => Ok(c),
        Err(Error::Invalid(d)) => Err(d
            .to_string()
            .replace(&p.display().to_string(), "config.yaml")),
        Err(e) => Err(e.to_string()),
    }
}

const BASE: &str = "\
providers:
  local: {base_url: \"http://127.0.0.1:1/v1\"}
tools:
  restart_service:
    description: Restart one deployment
    parameters: {type: object, properties: {service: {type: string}}, required: [service]}
    webhook: {url: \"http://127.0.0.1:9000/restart\", headers: {X-Team: sre}, timeout_seconds: 5}
    approval: required
  pods_log:
    description: Logs
    parameters: {type: object}
    shell: {command: [kubectl, logs, \"{{ args.pod }}\"]}
    effect: read
";

/// The MCP servers the agents of these tests name.
const MCP: &str = "mcp_servers:\n  k8s: {command: [kubectl-mcp-server]}\n  grafana: {url: \"http://127.0.0.1:1/mcp\"}\n";

#[test]
fn tools_and_agent_settings_decode() {
    let c = load(&format!(
        "{BASE}agents:\n  a: {{provider: local, model: m, tools: [restart_service, {{mcp: k8s, only: [pods_list]}}, {{mcp: grafana}}], delegates: [b], max_turns: 12, approval_timeout_seconds: 60}}\n  b: {{provider: local, model: m}}\n{MCP}"
    ))
    .unwrap();
    let t = &c.tools["restart_service"];
    assert_eq!(
        (t.effect, t.approval),
        (ToolEffect::Write, ApprovalRule::Required)
    );
    assert_eq!(
        t.run,
        ToolRun::Webhook(WebhookTool {
            url: "http://127.0.0.1:9000/restart".into(),
            headers: vec![("X-Team".into(), "sre".into())],
            timeout_seconds: Some(5.0),
        })
    );
    let logs = &c.tools["pods_log"];
    assert_eq!(
        (logs.effect, logs.approval),
        (ToolEffect::Read, ApprovalRule::None)
    );
    assert!(
        matches!(&logs.run, ToolRun::Shell(s) if s.command.len() == 3 && s.timeout_seconds.is_none())
    );
    let a = &c.agents["a"];
    assert_eq!(a.max_turns, 12);
    assert_eq!(a.approval_timeout_seconds, 60);
    assert_eq!(a.delegates, vec!["b".to_string()]);
    let names: Vec<String> = a
        .tools
        .iter()
        .map(|t| match t {
            AgentTool::Declared { name, .. } => name.clone(),
            AgentTool::Mcp { server, only, .. } => format!("mcp:{server}:{only:?}"),
        })
        .collect();
    assert_eq!(
        names,
        [
            "restart_service",
            "mcp:k8s:Some([\"pods_list\"])",
            "mcp:grafana:None"
        ]
    );
    let declared: Vec<&str> = c
        .declared_tools("a")
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(declared, ["restart_service"]);
    assert!(c.declared_tools("nobody").is_empty());
    let b = &c.agents["b"];
    assert_eq!(b.max_turns, DEFAULT_MAX_TURNS);
    assert_eq!(b.approval_timeout_seconds, DEFAULT_APPROVAL_TIMEOUT_SECONDS);
    assert!(b.tools.is_empty() && b.delegates.is_empty());
}

/// Each case: config text after BASE, and a piece of the expected message.
fn check(tail: &str, want: &str) {
    let text = format!("{BASE}{tail}");
    match load(&text) {
        Ok(_) => panic!("expected an error for:\n{tail}"),
        Err(got) => assert!(got.contains(want), "{tail}\n got: {got}\nwant: {want}"),
    }
}

#[test]
fn mistakes_are_reported_with_their_line() {
    check(
        "agents:\n  a: {provider: local, model: m, tools: [restart_servce]}\n",
        "config.yaml:15:42: error: agents.a.tools[0]: unknown tool `restart_servce`\n    hint: did you mean `restart_service`?",
    );
    check(
        "agents:\n  a: {provider: local, model: m, tools: [nothing_like_it]}\n",
        "unknown tool `nothing_like_it`\n    hint: define it under `tools:` (known: pods_log, restart_service)",
    );
    check(
        "agents:\n  a: {provider: local, model: m, delegates: [a]}\n",
        "config.yaml:15:46: error: agents.a.delegates[0]: agent `a` delegates to itself",
    );
    // An invalid tool or agent is reported once, not again where it is used.
    let text = format!(
        "{BASE}  broken: {{description: d, parameters: {{type: object}}}}\nagents:\n  a: {{provider: local, model: m, tools: [broken], delegates: [b]}}\n  b: {{provider: local}}\n"
    );
    let got = load(&text).unwrap_err();
    assert_eq!(got.matches("error:").count(), 2, "{got}");
    assert!(got.contains("tool `broken` has neither"), "{got}");
    assert!(
        got.contains("agents.b: missing required field `model`"),
        "{got}"
    );
    check(
        "agents:\n  a: {provider: local, model: m, delegates: [log-analyst]}\n",
        "agents.a.delegates[0]: unknown agent `log-analyst`",
    );
    check(
        "agents:\n  a: {provider: local, model: m, max_turns: 0}\n",
        "agents.a.max_turns: must be at least 1, found 0",
    );
    check(
        "agents:\n  a: {provider: local, model: m, tools: [pods_log, pods_log]}\n",
        "agents.a.tools[1]: listed twice",
    );
    check(
        "agents:\n  a: {provider: local, model: m, tools: [{mcp: k8s, only: []}]}\n",
        "`only: []` allows no tool of the server",
    );
    check(
        "agents:\n  a: {provider: local, model: m, tools: [{mpc: k8s}]}\n",
        "did you mean `mcp`?",
    );
    check(
        "agents:\n  a: {provider: local, model: m, tool: [pods_log]}\n",
        "config.yaml:15:34: error: agents.a: unknown key `tool`\n    hint: did you mean `tools`?",
    );
    check(
        "  both:\n    description: d\n    parameters: {type: object}\n    webhook: {url: \"http://x\"}\n    shell: {command: [echo]}\n",
        "config.yaml:15:5: error: tools.both: tool `both` has both `webhook` and `shell`",
    );
    check(
        "  neither:\n    description: d\n    parameters: {type: object}\n",
        "tools.neither: tool `neither` has neither `webhook` nor `shell`",
    );
    check(
        "  noparams:\n    description: d\n    shell: {command: [echo]}\n",
        "tools.noparams: missing required field `parameters`",
    );
    check(
        "  badparams:\n    description: d\n    parameters: {type: object, properties: {a: {type: strng}}}\n    shell: {command: [echo]}\n",
        "config.yaml:16:17: error: tools.badparams.parameters: not a valid JSON Schema",
    );
    check(
        "  strparams:\n    description: d\n    parameters: {type: string}\n    shell: {command: [echo]}\n",
        "the top-level `type` must be \"object\"",
    );
    check(
        "  badtpl:\n    description: d\n    parameters: {type: object}\n    shell: {command: [echo, \"{{ args.x \"]}\n",
        "config.yaml:17:29: error: tools.badtpl.shell.command[1]: template error",
    );
    check(
        "  eff:\n    description: d\n    parameters: {type: object}\n    shell: {command: [echo]}\n    effect: readonly\n",
        "tools.eff.effect: `readonly` is not one of: read, write",
    );
    check(
        "  delegate:\n    description: d\n    parameters: {type: object}\n    shell: {command: [echo]}\n",
        "`delegate` is the built-in tool of agents with `delegates`",
    );
    check(
        "  \"bad name\":\n    description: d\n    parameters: {type: object}\n    shell: {command: [echo]}\n",
        "`bad name` is not a valid tool name",
    );
    check(
        "  t:\n    description: d\n    parameters: {type: object}\n    shell: {command: []}\n",
        "tools.t.shell.command: the argv list is empty",
    );
    check(
        "  t:\n    description: d\n    parameters: {type: object}\n    webhook: {url: \"not a url\"}\n",
        "tools.t.webhook.url: not a valid URL",
    );
    check(
        "  t:\n    descripton: d\n    parameters: {type: object}\n    webhook: {url: \"http://x\"}\n",
        "did you mean `description`?",
    );
}

#[test]
fn a_webhook_header_from_an_unset_variable_fails_closed() {
    let c = load(
        "tools:\n  t:\n    description: d\n    parameters: {type: object}\n    webhook:\n      url: \"http://x\"\n      headers: {Authorization: \"Bearer ${VECTORSTEP_TEST_UNSET_TOOL_TOKEN}\", X-Opt: \"${VECTORSTEP_TEST_UNSET_OPT:-}\"}\n",
    )
    .unwrap();
    assert_eq!(c.unset_secrets.len(), 1, "{:?}", c.unset_secrets);
    let s = &c.unset_secrets[0];
    assert_eq!(s.key, "tools.t.webhook.headers.Authorization");
    assert_eq!(s.variable, "VECTORSTEP_TEST_UNSET_TOOL_TOKEN");
    assert_eq!((s.span.line, s.span.col), (7, 32));
    assert!(c.require_secrets().is_err());
}

#[test]
fn providers_are_openai_or_scripted() {
    let c = load("providers:\n  demo: {kind: scripted, script: ./s.yaml}\n  local: {base_url: \"http://x/v1\"}\n").unwrap();
    let ProviderKind::Scripted { script } = &c.providers["demo"].kind else {
        panic!("expected a scripted provider");
    };
    assert!(
        script.ends_with("s.yaml") && script.is_absolute(),
        "{script:?}"
    );
    assert_eq!(c.providers["local"].kind, ProviderKind::OpenAi);
    let cases = [
        (
            "providers:\n  demo: {kind: scripted}\n",
            "providers.demo: missing required field `script`",
        ),
        (
            "providers:\n  p: {script: ./s.yaml}\n",
            "missing required field `base_url`",
        ),
        (
            "providers:\n  p: {base_url: \"http://x\", script: ./s.yaml}\n",
            "`script` belongs to a scripted provider",
        ),
        (
            "providers:\n  p: {kind: scriptd, script: ./s.yaml}\n",
            "did you mean `scripted`?",
        ),
    ];
    for (text, want) in cases {
        let got = load(text).unwrap_err();
        assert!(got.contains(want), "{text}\n got: {got}\nwant: {want}");
    }
}

#[test]
fn mcp_references_are_checked_against_the_known_servers() {
    let agents = "agents:\n  a: {provider: local, model: m, tools: [{mcp: k8s}, {mcp: grafna}]}\n";
    // Through `Config::load`: the servers of `mcp_servers` are the known ones.
    let d = load(&format!("{BASE}{agents}{MCP}")).unwrap_err();
    assert_eq!(d.lines().count(), 2, "{d}");
    assert!(
        d.contains(":15:54: error: agents.a.tools[1].mcp: unknown MCP server `grafna`"),
        "{d}"
    );
    assert!(d.contains("did you mean `grafana`?"), "{d}");
    // Without `mcp_servers`, every reference is unknown.
    let d = load(&format!("{BASE}{agents}")).unwrap_err();
    assert!(d.contains("unknown MCP server `k8s`"), "{d}");
    // The check itself, against any set of names.
    let c = load(&format!(
        "{BASE}{agents}mcp_servers:\n  k8s: {{command: [x]}}\n  grafna: {{command: [y]}}\n"
    ))
    .unwrap();
    let known: BTreeSet<String> = ["k8s".to_string(), "grafana".to_string()].into();
    assert_eq!(check_mcp_refs(&c, &known).to_string().lines().count(), 2);
}

#[test]
fn the_sample_config_loads() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/agents/config.yaml");
    let (c, d) = Config::load(&p, true).unwrap();
    assert!(!d.has_errors(), "{d}");
    assert_eq!(c.tools.len(), 3);
    assert_eq!(c.agents["sre-investigator"].tools.len(), 3);
    let ProviderKind::Scripted { script } = &c.providers["demo"].kind else {
        panic!("expected a scripted provider");
    };
    assert!(script.is_file(), "{script:?}");
}

#[test]
fn agents_delegating_in_a_circle_are_an_error_at_the_entry_that_closes_it() {
    let got = load(&format!(
        "{BASE}agents:\n  a: {{provider: local, model: m, delegates: [b]}}\n  b: {{provider: local, model: m, delegates: [c]}}\n  c: {{provider: local, model: m, delegates: [a]}}\n  d: {{provider: local, model: m, delegates: [a]}}\n"
    ))
    .unwrap_err();
    assert_eq!(got.matches("delegate in a circle").count(), 1, "{got}");
    assert!(
        got.contains("agents.c.delegates[0]: agents delegate in a circle: a -> b -> c -> a"),
        "{got}"
    );
    // No circle, no error: a chain is fine.
    assert!(load(&format!(
        "{BASE}agents:\n  a: {{provider: local, model: m, delegates: [b]}}\n  b: {{provider: local, model: m, delegates: [c]}}\n  c: {{provider: local, model: m}}\n"
    ))
    .is_ok());
}
