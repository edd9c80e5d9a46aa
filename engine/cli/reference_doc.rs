//! docs/reference.md stays true to the code: every command, long flag, route,
//! metric, run-log event and top-level config and pipeline key the code has is
//! named on the page. Only code → page is checked: the page may already describe
//! what is still being built.

use clap::CommandFactory;

const PAGE: &str = include_str!("../../docs/reference.md");

/// Whether `needle` occurs on the page as a whole word: not followed by a letter,
/// digit, `-` or `_` (so `vectorstep run` is not found inside `vectorstep runs`).
fn on_page(needle: &str) -> bool {
    PAGE.match_indices(needle).any(|(i, _)| {
        PAGE[i + needle.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '-' || c == '_'))
    })
}

/// Every visible subcommand path (`vectorstep runs list`) and every visible long
/// flag (`--dry-run`) of the clap tree.
fn commands_and_flags() -> (Vec<String>, Vec<String>) {
    fn walk(cmd: &clap::Command, path: &str, commands: &mut Vec<String>, flags: &mut Vec<String>) {
        for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = a.get_long() {
                flags.push(format!("--{long}"));
            }
        }
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_name() == "help" {
                continue;
            }
            let name = format!("{path} {}", sub.get_name());
            commands.push(name.clone());
            walk(sub, &name, commands, flags);
        }
    }
    let (mut commands, mut flags) = (Vec::new(), Vec::new());
    walk(
        &super::Cli::command(),
        "vectorstep",
        &mut commands,
        &mut flags,
    );
    flags.sort();
    flags.dedup();
    (commands, flags)
}

/// The string items of the `&[&str]` constant `name` in a Rust source file, if
/// it declares one.
fn str_list(source: &str, name: &str) -> Option<Vec<String>> {
    let start = source.find(&format!("const {name}: &[&str] = &["))?;
    let body = &source[start..];
    let body = &body[body.find("= &[")? + 4..body.find("];")?];
    Some(
        body.split(',')
            .map(|item| item.trim().trim_matches('"').to_string())
            .filter(|item| !item.is_empty())
            .collect(),
    )
}

const CONFIG_DECODE: &str = include_str!("../config/decode.rs");
const CONFIG_MCP: &str = include_str!("../config/mcp.rs");
const CONFIG_TOOLS: &str = include_str!("../config/tools/mod.rs");

/// The key lists of config.yaml: (source, constant, how the page writes the
/// keys' parent, as in `server.host` or `agents.<a>.model`).
const CONFIG_KEY_LISTS: &[(&str, &str, &str)] = &[
    (CONFIG_DECODE, "TOP_KEYS", ""),
    (CONFIG_DECODE, "SERVER_KEYS", "server."),
    (CONFIG_DECODE, "DATABASE_KEYS", "database."),
    (CONFIG_DECODE, "REPLICA_KEYS", "replica."),
    (CONFIG_DECODE, "DURABILITY_KEYS", "durability."),
    (CONFIG_DECODE, "DEDUP_KEYS", "dedup."),
    (CONFIG_DECODE, "CONCURRENCY_KEYS", "concurrency."),
    (CONFIG_DECODE, "AUTH_KEYS", "auth."),
    (CONFIG_DECODE, "TOKEN_KEYS", "auth.<list>[]."),
    (CONFIG_DECODE, "PROVIDER_KEYS", "providers.<p>."),
    (CONFIG_DECODE, "AGENT_KEYS", "agents.<a>."),
    (CONFIG_DECODE, "PRICE_KEYS", "pricing.<model>."),
    (CONFIG_DECODE, "NOTIFICATIONS_KEYS", "notifications."),
    (CONFIG_DECODE, "TELEGRAM_KEYS", "notifications.telegram."),
    (CONFIG_DECODE, "HUMAN_APPROVAL_KEYS", "human_approval."),
    (CONFIG_DECODE, "LOGGING_KEYS", "logging."),
    (CONFIG_DECODE, "RETENTION_KEYS", "retention."),
    (CONFIG_MCP, "KEYS", "mcp_servers.<s>."),
    (CONFIG_TOOLS, "TOOL_KEYS", "tools.<t>."),
];

/// Every check at once, so one run lists everything the page lacks.
fn missing() -> Vec<String> {
    let mut missing = Vec::new();
    let (commands, flags) = commands_and_flags();
    assert!(
        commands.len() > 10,
        "the clap tree was walked: {commands:?}"
    );
    for c in commands {
        if !on_page(&format!("`{c}")) {
            missing.push(format!("command `{c}`"));
        }
    }
    for f in flags {
        if !on_page(&f) {
            missing.push(format!("flag `{f}`"));
        }
    }
    let telemetry = include_str!("../telemetry.rs");
    let mut metrics: Vec<String> = vectorstep::telemetry::DESCRIPTIONS
        .iter()
        .map(|(name, _)| name.to_string())
        .collect();
    // Metrics declared beside DESCRIPTIONS but not in it count too.
    metrics.extend(
        telemetry
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|s| s.starts_with("vectorstep_"))
            .map(str::to_string),
    );
    metrics.sort();
    metrics.dedup();
    for m in metrics {
        if !on_page(&format!("`{m}`")) {
            missing.push(format!("metric `{m}`"));
        }
    }
    for spec in vectorstep::events::CATALOGUE {
        let name = format!("`{}`", spec.name);
        if !on_page(&name) && !missing.contains(&format!("event {name}")) {
            missing.push(format!("event {name}"));
        }
    }
    for r in vectorstep::http::routes() {
        // axum's `:name` is written `{name}` on the page.
        let path: Vec<String> = r
            .path
            .split('/')
            .map(|seg| match seg.strip_prefix(':') {
                Some(p) => format!("{{{p}}}"),
                None => seg.to_string(),
            })
            .collect();
        let path = format!("`{}`", path.join("/"));
        let method = format!("`{}`", r.method);
        let row = PAGE
            .lines()
            .any(|l| l.starts_with('|') && l.contains(&method) && l.contains(&path));
        if !row {
            missing.push(format!("route {} {path} (a table row with both)", r.method));
        }
    }
    for (source, list, parent) in CONFIG_KEY_LISTS {
        let Some(keys) = str_list(source, list) else {
            missing.push(format!(
                "engine/config no longer declares `{list}`: update CONFIG_KEY_LISTS in engine/cli/reference_doc.rs"
            ));
            continue;
        };
        for key in keys {
            if !on_page(&format!("`{parent}{key}")) {
                missing.push(format!("config.yaml key `{parent}{key}`"));
            }
        }
    }
    let pipeline_keys = str_list(include_str!("../pipeline/validate.rs"), "PIPELINE_KEYS")
        .expect("engine/pipeline/validate.rs declares PIPELINE_KEYS");
    for key in pipeline_keys {
        if !on_page(&format!("`{key}`")) {
            missing.push(format!("pipeline key `{key}`"));
        }
    }
    missing
}

#[test]
fn the_reference_page_names_everything_the_code_has() {
    let missing = missing();
    assert!(
        missing.is_empty(),
        "docs/reference.md does not name these; add them to the page:\n{missing:#?}"
    );
}

/// The page stands on its own: it cites no specification and no numbered section.
#[test]
fn the_page_cites_no_spec() {
    let citation = regex::Regex::new(r"SPEC|§|(?i:\bsection \d)").unwrap();
    let found: Vec<&str> = PAGE.lines().filter(|l| citation.is_match(l)).collect();
    assert!(
        found.is_empty(),
        "docs/reference.md cites sections: {found:#?}"
    );
}
