//! Decoding a parsed `config.yaml` into [`Config`], every problem reported.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::tools;
use super::unset::Unset;
use super::*;
use crate::decode::Obj;
use crate::diag::Diagnostics;
use crate::yaml;

/// The variables written `${VAR}` (no default) in `text` that are unset or empty.
fn defaultless_empty(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        let inner = &after[..end];
        if !inner.contains(":-") && lookup(inner).is_none_or(|v| v.is_empty()) {
            out.push(inner.to_string());
        }
        rest = &after[end + 1..];
    }
    out
}

/// Expands variables in every string. An unquoted value is typed after expansion,
/// so `port: ${PORT:-8000}` is a number, as it would be written out.
pub(super) fn expand_tree(
    node: &mut yaml::Node,
    lookup: &dyn Fn(&str) -> Option<String>,
    unset: &mut Unset,
) {
    match &mut node.value {
        yaml::Value::Str(s) if s.contains("${") => {
            for name in defaultless_empty(s, lookup) {
                unset.by_node.push((node.span.clone(), name));
            }
            let mut names = Vec::new();
            let expanded = expand_env(s, lookup, &mut names);
            unset
                .missing
                .extend(names.into_iter().map(|n| (n, node.span.clone())));
            node.value = if node.style == yaml::ScalarStyle::Plain {
                yaml::plain_scalar(&expanded)
            } else {
                yaml::Value::Str(expanded)
            };
        }
        yaml::Value::Seq(items) => items.iter_mut().for_each(|n| expand_tree(n, lookup, unset)),
        yaml::Value::Map(entries) => entries
            .iter_mut()
            .for_each(|(_, v)| expand_tree(v, lookup, unset)),
        _ => {}
    }
}

/// Reads a secret: its text, and when it expanded empty from a `${VAR}` without a
/// default, a record of that for [`Config::require_secrets`]. Empty means "not
/// configured" to the caller either way.
fn secret(
    o: &Obj<'_>,
    key: &str,
    unset: &Unset,
    sink: &mut Vec<UnsetSecret>,
    d: &mut Diagnostics,
) -> String {
    let value = o.text(d, key).unwrap_or_default();
    if value.is_empty() {
        if let Some(node) = o.get(key) {
            if let Some(var) = unset.empty_variable_at(&node.span) {
                sink.push(UnsetSecret {
                    key: o.path_of(key),
                    variable: var.to_string(),
                    span: node.span.clone(),
                });
            }
        }
    }
    value
}

/// The top-level keys of config.yaml.
pub const TOP_KEYS: &[&str] = &[
    "server",
    "pipeline_config_dir",
    "step_library_dir",
    "database",
    "durability",
    "dedup",
    "concurrency",
    "auth",
    "providers",
    "agents",
    "tools",
    "pricing",
    "notifications",
    "human_approval",
    "logging",
    "retention",
    "mcp_servers",
    "replica",
];
pub const SERVER_KEYS: &[&str] = &[
    "host",
    "port",
    "max_body_bytes",
    "allow_unauthenticated",
    "header_read_timeout_seconds",
    "body_read_timeout_seconds",
    "idle_timeout_seconds",
    "max_connections",
];
pub const DATABASE_KEYS: &[&str] = &["path", "url", "pool_size"];
pub const REPLICA_KEYS: &[&str] = &["lease_seconds", "heartbeat_seconds"];
pub const DURABILITY_KEYS: &[&str] = &[
    "max_resume_age_seconds",
    "max_resume_attempts",
    "shutdown_grace_seconds",
];
pub const DEDUP_KEYS: &[&str] = &["enabled", "window_seconds"];
pub const CONCURRENCY_KEYS: &[&str] = &["max_runs", "max_connections_per_host"];
pub const AUTH_KEYS: &[&str] = &["teams", "operators", "scrapers", "protect_metrics"];
/// The keys of `auth` that hold lists of named tokens.
pub const AUTH_TOKEN_LISTS: [&str; 3] = ["teams", "operators", "scrapers"];
pub const TOKEN_KEYS: &[&str] = &["name", "token"];
pub const PROVIDER_KEYS: &[&str] = &["kind", "base_url", "api_key", "timeout_seconds", "script"];
/// The words of a provider's `kind`; the first is the default.
pub const PROVIDER_KINDS: &[&str] = &["openai", "scripted"];
pub const DEFAULT_PROVIDER_TIMEOUT_SECONDS: f64 = 120.0;
pub const AGENT_KEYS: &[&str] = &[
    "provider",
    "model",
    "system_prompt",
    "temperature",
    "max_tokens",
    "tools",
    "delegates",
    "max_turns",
    "approval_timeout_seconds",
];
pub const PRICE_KEYS: &[&str] = &["input_per_mtok", "output_per_mtok"];
pub const NOTIFICATIONS_KEYS: &[&str] = &["telegram", "max_age_seconds"];
pub const TELEGRAM_KEYS: &[&str] = &["bot_token", "chat_id", "api_url"];
pub const HUMAN_APPROVAL_KEYS: &[&str] = &["ui_base_url", "approvers", "default", "teams"];
/// Where an approval request goes (`human_approval.default` and each team).
pub const ROUTE_KEYS: &[&str] = &["channel", "url", "chat_id"];
pub const ROUTE_CHANNELS: &[&str] = &["telegram", "webhook", "page"];
pub const LOGGING_KEYS: &[&str] = &["level", "format"];
pub const LOG_LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error"];
pub const LOG_FORMATS: &[&str] = &["pretty", "json"];
pub const RETENTION_KEYS: &[&str] = &["days"];

fn resolve(base: &Path, p: String) -> PathBuf {
    let p = PathBuf::from(p);
    if p.is_absolute() || base.as_os_str().is_empty() {
        p
    } else {
        base.join(p)
    }
}

pub(super) fn decode(
    root: &yaml::Node,
    base: &Path,
    unset: &Unset,
    d: &mut Diagnostics,
) -> Option<Config> {
    let mut c = Config::default();
    if root.is_null() {
        return Some(c);
    }
    let top = Obj::new(root, "", TOP_KEYS, &[], d)?;
    if let Some(n) = top.get("server") {
        if let Some(o) = Obj::new(n, "server", SERVER_KEYS, &[], d) {
            for (key, slot) in [
                (
                    "header_read_timeout_seconds",
                    &mut c.server.header_read_timeout_seconds,
                ),
                (
                    "body_read_timeout_seconds",
                    &mut c.server.body_read_timeout_seconds,
                ),
                ("idle_timeout_seconds", &mut c.server.idle_timeout_seconds),
            ] {
                match o.seconds(d, key) {
                    Some(v) if v > 0.0 => *slot = v,
                    Some(_) => {
                        d.error(o.span(), &o.path_of(key), "must be more than 0 seconds");
                    }
                    None => {}
                }
            }
            if let Some(v) = o.at_least_one(d, "max_connections") {
                c.server.max_connections = Some(v as usize);
            }
            if let Some(b) = o.bool(d, "allow_unauthenticated") {
                c.server.allow_unauthenticated = b;
            }
            if let Some(h) = o.str(d, "host") {
                c.server.host = h;
            }
            if let Some(p) = o.u64(d, "port") {
                match u16::try_from(p) {
                    Ok(p) => c.server.port = p,
                    Err(_) => {
                        d.error(
                            o.span(),
                            "server.port",
                            format!("{p} is not a TCP port (0..65535)"),
                        );
                    }
                }
            }
            if let Some(b) = o.at_least_one(d, "max_body_bytes") {
                c.server.max_body_bytes = b;
            }
        }
    }
    c.pipeline_config_dir = resolve(
        base,
        top.str(d, "pipeline_config_dir")
            .unwrap_or_else(|| "./pipelines".into()),
    );
    c.step_library_dir = resolve(
        base,
        top.str(d, "step_library_dir")
            .unwrap_or_else(|| "./samples/steps".into()),
    );
    c.database_path = resolve(base, "./data/vectorstep.db".into());
    if let Some(n) = top.get("database") {
        if let Some(o) = Obj::new(n, "database", DATABASE_KEYS, &[], d) {
            let path = o.str(d, "path");
            if let Some(p) = &path {
                c.database_path = resolve(base, p.clone());
            }
            if let Some(url) = o.str(d, "url") {
                let node = o.get("url").map_or(o.span(), |n| &n.span);
                if path.is_some() {
                    d.error_hint(
                        node,
                        "database.url",
                        "both `database.path` and `database.url` are set",
                        "keep `path` for one server on SQLite, or `url` for PostgreSQL shared by several replicas",
                    );
                } else if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                    d.error_hint(
                        node,
                        "database.url",
                        format!("`{}` is not a PostgreSQL URL", crate::store::redact_url(&url)),
                        "write it as postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE (a password is best given as ${VAR})",
                    );
                } else {
                    c.database_url = Some(url);
                }
            }
            if let Some(n) = o.at_least_one(d, "pool_size") {
                c.database_pool_size = usize::try_from(n.min(1024)).unwrap_or(1024);
            }
        }
    }
    if let Some(n) = top.get("replica") {
        if let Some(o) = Obj::new(n, "replica", REPLICA_KEYS, &[], d) {
            let lease = o.at_least_one(d, "lease_seconds");
            let heartbeat = o.at_least_one(d, "heartbeat_seconds");
            let lease = lease.unwrap_or(c.replica.lease_seconds);
            let heartbeat = heartbeat.unwrap_or(c.replica.heartbeat_seconds);
            match crate::run::lease::check_timing(lease, heartbeat) {
                Ok(_) => {
                    c.replica.lease_seconds = lease;
                    c.replica.heartbeat_seconds = heartbeat;
                }
                Err(why) => {
                    d.error_hint(
                        o.span(),
                        "replica",
                        why,
                        "a replica renews its leases every heartbeat and stops driving a run one heartbeat before its lease could lapse; keep lease_seconds at least twice heartbeat_seconds plus one (default 30 and 5)",
                    );
                }
            }
        }
    }
    if let Some(n) = top.get("durability") {
        if let Some(o) = Obj::new(n, "durability", DURABILITY_KEYS, &[], d) {
            if let Some(v) = o.u64(d, "max_resume_age_seconds") {
                c.durability.max_resume_age_seconds = v;
            }
            if let Some(v) = o.at_least_one(d, "max_resume_attempts") {
                c.durability.max_resume_attempts = v.min(u32::MAX as u64) as u32;
            }
            if let Some(v) = o.u64(d, "shutdown_grace_seconds") {
                c.durability.shutdown_grace_seconds = v;
            }
        }
    }
    if let Some(n) = top.get("dedup") {
        if let Some(o) = Obj::new(n, "dedup", DEDUP_KEYS, &[], d) {
            if let Some(v) = o.bool(d, "enabled") {
                c.dedup.enabled = v;
            }
            if let Some(v) = o.u64(d, "window_seconds") {
                c.dedup.window_seconds = v;
            }
        }
    }
    if let Some(n) = top.get("concurrency") {
        if let Some(o) = Obj::new(n, "concurrency", CONCURRENCY_KEYS, &[], d) {
            if let Some(v) = o.at_least_one(d, "max_connections_per_host") {
                c.max_connections_per_host = v as usize;
            }
            if let Some(v) = o.at_least_one(d, "max_runs") {
                c.max_runs = v as usize;
            }
        }
    }
    if let Some(n) = top.get("auth") {
        if let Some(o) = Obj::new(n, "auth", AUTH_KEYS, &[], d) {
            for key in AUTH_TOKEN_LISTS {
                if let Some(list) = o.get(key) {
                    let tokens = decode_tokens(list, &format!("auth.{key}"), unset, &mut c, d);
                    match key {
                        "teams" => c.auth_teams = tokens,
                        "operators" => c.auth_operators = tokens,
                        _ => c.auth_scrapers = tokens,
                    }
                }
            }
            if let Some(b) = o.bool(d, "protect_metrics") {
                c.protect_metrics = b;
            }
            check_distinct_tokens(&o, &c, d);
        }
    }
    let provider_secrets = std::cell::RefCell::new(Vec::new());
    if let Some(m) = decode_named(&top, "providers", PROVIDER_KEYS, d, |o, d| {
        let kind = decode_provider_kind(o, base, d)?;
        let base_url = match kind {
            ProviderKind::OpenAi => o.req_str(d, "base_url")?,
            ProviderKind::Scripted { .. } => o.str(d, "base_url").unwrap_or_default(),
        };
        Some(Provider {
            base_url,
            api_key: Some(secret(
                o,
                "api_key",
                unset,
                &mut provider_secrets.borrow_mut(),
                d,
            ))
            .filter(|k| !k.is_empty()),
            timeout_seconds: o
                .seconds(d, "timeout_seconds")
                .unwrap_or(DEFAULT_PROVIDER_TIMEOUT_SECONDS),
            kind,
        })
    }) {
        c.providers = m;
    }
    c.unset_secrets.extend(provider_secrets.into_inner());
    let delegate_spans = std::cell::RefCell::new(BTreeMap::new());
    if let Some(m) = decode_named(&top, "agents", AGENT_KEYS, d, |o, d| {
        let settings = tools::decode_agent_tools(o, d);
        let provider = o.req_str(d, "provider")?;
        let model = o.req_str(d, "model")?;
        let name = o
            .path
            .strip_prefix("agents.")
            .unwrap_or(&o.path)
            .to_string();
        let delegates = settings.delegates.iter().map(|(n, _)| n.clone()).collect();
        delegate_spans.borrow_mut().insert(name, settings.delegates);
        Some(Agent {
            provider,
            model,
            system_prompt: o.str(d, "system_prompt").unwrap_or_default(),
            temperature: o.f64(d, "temperature"),
            max_tokens: o.u64(d, "max_tokens"),
            tools: settings.tools,
            delegates,
            max_turns: settings.max_turns,
            approval_timeout_seconds: settings.approval_timeout_seconds,
        })
    }) {
        c.agents = m;
    }
    c.tools = tools::decode_tools(&top, unset, &mut c.unset_secrets, d);
    tools::check_references(&top, &c.agents, &delegate_spans.into_inner(), d);
    for (name, agent) in &c.agents {
        if !c.providers.contains_key(&agent.provider) {
            let node = top.get("agents").and_then(|a| a.get(name)).unwrap_or(root);
            let known: Vec<&str> = c.providers.keys().map(String::as_str).collect();
            d.error_hint(
                &node.span,
                &format!("agents.{name}.provider"),
                format!("unknown provider `{}`", agent.provider),
                format!("define it under `providers:` (known: {})", known.join(", ")),
            );
        }
    }
    let mcp_secrets = std::cell::RefCell::new(Vec::new());
    let servers = decode_named(&top, "mcp_servers", super::mcp::KEYS, d, |o, d| {
        super::mcp::decode_server(o, unset, &mut mcp_secrets.borrow_mut(), d)
    });
    // Agents' `{mcp: SERVER}` entries name a server of `mcp_servers`, unless that
    // block itself is broken (already reported; its names are not known).
    if servers.is_some() || top.get("mcp_servers").is_none() {
        c.mcp_servers = servers.unwrap_or_default();
        let known = c.mcp_servers.keys().cloned().collect();
        d.extend(tools::check_mcp_refs(&c, &known));
    }
    c.unset_secrets.extend(mcp_secrets.into_inner());
    if let Some(m) = decode_named(&top, "pricing", PRICE_KEYS, d, |o, d| {
        Some(Price {
            input_per_mtok: o.f64(d, "input_per_mtok").unwrap_or(0.0),
            output_per_mtok: o.f64(d, "output_per_mtok").unwrap_or(0.0),
        })
    }) {
        c.pricing = m;
    }
    if let Some(n) = top.get("notifications") {
        if let Some(o) = Obj::new(n, "notifications", NOTIFICATIONS_KEYS, &[], d) {
            if let Some(s) = o.u64(d, "max_age_seconds") {
                c.notification_max_age_seconds = s;
            }
            if let Some(t) = o.get("telegram") {
                if let Some(t) = Obj::new(t, "notifications.telegram", TELEGRAM_KEYS, &[], d) {
                    let bot_token = secret(&t, "bot_token", unset, &mut c.unset_secrets, d);
                    let chat_id = secret(&t, "chat_id", unset, &mut c.unset_secrets, d);
                    if !bot_token.is_empty() && !chat_id.is_empty() {
                        c.telegram = Some(Telegram {
                            bot_token,
                            chat_id,
                            api_url: t.str(d, "api_url").filter(|s| !s.is_empty()),
                        });
                    }
                }
            }
        }
    }
    if let Some(n) = top.get("human_approval") {
        if let Some(o) = Obj::new(n, "human_approval", HUMAN_APPROVAL_KEYS, &[], d) {
            if let Some(u) = o.str(d, "ui_base_url") {
                c.human_approval.ui_base_url = u;
            }
            if let Some(a) = o.str_list(d, "approvers") {
                c.human_approval.approvers = a;
            }
            if let Some(r) = o.get("default") {
                c.human_approval.default = decode_route(r, "human_approval.default", d);
            }
            if let Some(m) = decode_named(&o, "teams", ROUTE_KEYS, d, |t, d| {
                decode_route(t.node, &t.path, d)
            }) {
                c.human_approval.teams = m;
            }
        }
    }
    if let Some(n) = top.get("logging") {
        if let Some(o) = Obj::new(n, "logging", LOGGING_KEYS, &[], d) {
            if let Some(l) = o.choice(d, "level", LOG_LEVELS) {
                c.logging.level = l;
            }
            if let Some(f) = o.choice(d, "format", LOG_FORMATS) {
                c.logging.json = f == "json";
            }
        }
    }
    if let Some(n) = top.get("retention") {
        if let Some(o) = Obj::new(n, "retention", RETENTION_KEYS, &[], d) {
            if let Some(v) = o.u64(d, "days") {
                c.retention_days = v;
            }
        }
    }
    Some(c)
}

/// `kind: openai` (the default) or `kind: scripted` with `script: PATH`.
fn decode_provider_kind(o: &Obj<'_>, base: &Path, d: &mut Diagnostics) -> Option<ProviderKind> {
    let kind = o
        .choice(d, "kind", PROVIDER_KINDS)
        .unwrap_or_else(|| "openai".into());
    if kind == "openai" {
        if let Some(n) = o.get("script") {
            d.error_hint(
                &n.span,
                &o.path_of("script"),
                "`script` belongs to a scripted provider",
                "add `kind: scripted`, or remove `script`",
            );
        }
        return Some(ProviderKind::OpenAi);
    }
    if !o.has("script") {
        d.error_hint(
            o.span(),
            &o.path,
            "missing required field `script`",
            "a scripted provider replays a YAML file, e.g. `script: ./samples/agents/demo-script.yaml`",
        );
        return None;
    }
    let script = o.str(d, "script")?;
    Some(ProviderKind::Scripted {
        script: resolve(base, script),
    })
}

fn decode_route(n: &yaml::Node, path: &str, d: &mut Diagnostics) -> Option<ApprovalRoute> {
    let o = Obj::new(n, path, ROUTE_KEYS, &[], d)?;
    let channel = o.choice(d, "channel", ROUTE_CHANNELS)?;
    let url = o.str(d, "url");
    if channel == "webhook" && url.is_none() {
        o.missing(d, "url");
    }
    Some(ApprovalRoute {
        channel,
        url,
        chat_id: o.text(d, "chat_id"),
    })
}

/// One list of named bearer tokens (`auth.teams`, `auth.operators`, `auth.scrapers`).
/// An entry whose token is empty is not configured and is skipped with a warning;
/// one built from an unset `${VAR}` is also recorded to fail the start.
fn decode_tokens(
    list: &yaml::Node,
    path: &str,
    unset: &Unset,
    c: &mut Config,
    d: &mut Diagnostics,
) -> Vec<TeamToken> {
    let Some(items) = list.as_seq() else {
        d.error(
            &list.span,
            path,
            format!("expected a list, found {}", list.type_name()),
        );
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = format!("{path}[{i}]");
        let Some(o) = Obj::new(item, &path, TOKEN_KEYS, &[], d) else {
            continue;
        };
        let Some(name) = o.req_str(d, "name") else {
            continue;
        };
        if !o.has("token") {
            o.missing(d, "token");
            continue;
        }
        let token = secret(&o, "token", unset, &mut c.unset_secrets, d);
        if token.is_empty() {
            d.warning(
                o.span(),
                &path,
                format!("`{name}` has an empty token and is ignored"),
            );
            continue;
        }
        out.push(TeamToken { name, token });
    }
    out
}

/// A token that appears in two lists would make its holder's class depend on
/// list order: refuse it.
fn check_distinct_tokens(o: &Obj<'_>, c: &Config, d: &mut Diagnostics) {
    let all = c
        .auth_teams
        .iter()
        .map(|t| ("auth.teams", t))
        .chain(c.auth_operators.iter().map(|t| ("auth.operators", t)))
        .chain(c.auth_scrapers.iter().map(|t| ("auth.scrapers", t)));
    let mut seen: Vec<(&str, &TeamToken)> = Vec::new();
    for (list, t) in all {
        if let Some((other, first)) = seen.iter().find(|(_, s)| s.token == t.token) {
            d.error_hint(
                o.span(),
                "auth",
                format!(
                    "`{}` in {list} and `{}` in {other} have the same token",
                    t.name, first.name
                ),
                "give every team, operator and scraper a token of its own",
            );
        }
        seen.push((list, t));
    }
}

fn decode_named<T>(
    parent: &Obj<'_>,
    key: &str,
    fields: &[&'static str],
    d: &mut Diagnostics,
    f: impl Fn(&Obj<'_>, &mut Diagnostics) -> Option<T>,
) -> Option<BTreeMap<String, T>> {
    let n = parent.get(key)?;
    let path = parent.path_of(key);
    let Some(entries) = n.as_map() else {
        d.error(
            &n.span,
            &path,
            format!("expected a mapping, found {}", n.type_name()),
        );
        return None;
    };
    let mut out = BTreeMap::new();
    for (k, v) in entries {
        let Some(name) = k.scalar_text() else {
            continue;
        };
        let p = crate::decode::join(&path, &name);
        if let Some(o) = Obj::new(v, &p, fields, &[], d) {
            if let Some(t) = f(&o, d) {
                out.insert(name, t);
            }
        }
    }
    Some(out)
}
