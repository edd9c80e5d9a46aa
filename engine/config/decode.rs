//! Decoding a parsed `config.yaml` into [`Config`], every problem reported.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::decode::Obj;
use crate::diag::Diagnostics;
use crate::yaml;

/// Expands variables in every string. An unquoted value is typed after expansion,
/// so `port: ${PORT:-8000}` is a number, as it would be written out.
pub(super) fn expand_tree(
    node: &mut yaml::Node,
    lookup: &dyn Fn(&str) -> Option<String>,
    missing: &mut Vec<String>,
) {
    match &mut node.value {
        yaml::Value::Str(s) if s.contains("${") => {
            let expanded = expand_env(s, lookup, missing);
            node.value = if node.style == yaml::ScalarStyle::Plain {
                yaml::plain_scalar(&expanded)
            } else {
                yaml::Value::Str(expanded)
            };
        }
        yaml::Value::Seq(items) => items
            .iter_mut()
            .for_each(|n| expand_tree(n, lookup, missing)),
        yaml::Value::Map(entries) => entries
            .iter_mut()
            .for_each(|(_, v)| expand_tree(v, lookup, missing)),
        _ => {}
    }
}

const TOP_KEYS: &[&str] = &[
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
    "pricing",
    "notifications",
    "human_approval",
    "logging",
    "retention",
];

fn resolve(base: &Path, p: String) -> PathBuf {
    let p = PathBuf::from(p);
    if p.is_absolute() || base.as_os_str().is_empty() {
        p
    } else {
        base.join(p)
    }
}

pub(super) fn decode(root: &yaml::Node, base: &Path, d: &mut Diagnostics) -> Option<Config> {
    let mut c = Config::default();
    if root.is_null() {
        return Some(c);
    }
    let top = Obj::new(root, "", TOP_KEYS, &[], d)?;
    if let Some(n) = top.get("server") {
        if let Some(o) = Obj::new(n, "server", &["host", "port", "max_body_bytes"], &[], d) {
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
        if let Some(o) = Obj::new(n, "database", &["path"], &[], d) {
            if let Some(p) = o.str(d, "path") {
                c.database_path = resolve(base, p);
            }
        }
    }
    if let Some(n) = top.get("durability") {
        let keys = [
            "max_resume_age_seconds",
            "max_resume_attempts",
            "shutdown_grace_seconds",
        ];
        if let Some(o) = Obj::new(n, "durability", &keys, &[], d) {
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
        if let Some(o) = Obj::new(n, "dedup", &["enabled", "window_seconds"], &[], d) {
            if let Some(v) = o.bool(d, "enabled") {
                c.dedup.enabled = v;
            }
            if let Some(v) = o.u64(d, "window_seconds") {
                c.dedup.window_seconds = v;
            }
        }
    }
    if let Some(n) = top.get("concurrency") {
        if let Some(o) = Obj::new(n, "concurrency", &["max_runs"], &[], d) {
            if let Some(v) = o.at_least_one(d, "max_runs") {
                c.max_runs = v as usize;
            }
        }
    }
    if let Some(n) = top.get("auth") {
        if let Some(o) = Obj::new(n, "auth", &["teams"], &[], d) {
            if let Some(list) = o.get("teams") {
                decode_teams(list, &mut c, d);
            }
        }
    }
    if let Some(m) = decode_named(
        &top,
        "providers",
        &["base_url", "api_key", "timeout_seconds"],
        d,
        |o, d| {
            let base_url = o.req_str(d, "base_url")?;
            Some(Provider {
                base_url,
                api_key: o.str(d, "api_key").filter(|k| !k.is_empty()),
                timeout_seconds: o.seconds(d, "timeout_seconds").unwrap_or(120.0),
            })
        },
    ) {
        c.providers = m;
    }
    let agent_keys = [
        "provider",
        "model",
        "system_prompt",
        "temperature",
        "max_tokens",
    ];
    if let Some(m) = decode_named(&top, "agents", &agent_keys, d, |o, d| {
        let provider = o.req_str(d, "provider")?;
        let model = o.req_str(d, "model")?;
        Some(Agent {
            provider,
            model,
            system_prompt: o.str(d, "system_prompt").unwrap_or_default(),
            temperature: o.f64(d, "temperature"),
            max_tokens: o.u64(d, "max_tokens"),
        })
    }) {
        c.agents = m;
    }
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
    if let Some(m) = decode_named(
        &top,
        "pricing",
        &["input_per_mtok", "output_per_mtok"],
        d,
        |o, d| {
            Some(Price {
                input_per_mtok: o.f64(d, "input_per_mtok").unwrap_or(0.0),
                output_per_mtok: o.f64(d, "output_per_mtok").unwrap_or(0.0),
            })
        },
    ) {
        c.pricing = m;
    }
    if let Some(n) = top.get("notifications") {
        let keys = ["telegram", "max_age_seconds"];
        if let Some(o) = Obj::new(n, "notifications", &keys, &[], d) {
            if let Some(s) = o.u64(d, "max_age_seconds") {
                c.notification_max_age_seconds = s;
            }
            if let Some(t) = o.get("telegram") {
                let keys = ["bot_token", "chat_id", "api_url"];
                if let Some(t) = Obj::new(t, "notifications.telegram", &keys, &[], d) {
                    let bot_token = t.text(d, "bot_token").unwrap_or_default();
                    let chat_id = t.text(d, "chat_id").unwrap_or_default();
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
        let keys = ["ui_base_url", "approvers", "default", "teams"];
        if let Some(o) = Obj::new(n, "human_approval", &keys, &[], d) {
            if let Some(u) = o.str(d, "ui_base_url") {
                c.human_approval.ui_base_url = u;
            }
            if let Some(a) = o.str_list(d, "approvers") {
                c.human_approval.approvers = a;
            }
            if let Some(r) = o.get("default") {
                c.human_approval.default = decode_route(r, "human_approval.default", d);
            }
            if let Some(m) = decode_named(&o, "teams", &["channel", "url", "chat_id"], d, |t, d| {
                decode_route(t.node, &t.path, d)
            }) {
                c.human_approval.teams = m;
            }
        }
    }
    if let Some(n) = top.get("logging") {
        if let Some(o) = Obj::new(n, "logging", &["level", "format"], &[], d) {
            let levels = ["trace", "debug", "info", "warn", "error"];
            if let Some(l) = o.choice(d, "level", &levels) {
                c.logging.level = l;
            }
            if let Some(f) = o.choice(d, "format", &["pretty", "json"]) {
                c.logging.json = f == "json";
            }
        }
    }
    if let Some(n) = top.get("retention") {
        if let Some(o) = Obj::new(n, "retention", &["days"], &[], d) {
            if let Some(v) = o.u64(d, "days") {
                c.retention_days = v;
            }
        }
    }
    Some(c)
}

fn decode_route(n: &yaml::Node, path: &str, d: &mut Diagnostics) -> Option<ApprovalRoute> {
    let o = Obj::new(n, path, &["channel", "url", "chat_id"], &[], d)?;
    let channel = o.choice(d, "channel", &["telegram", "webhook", "page"])?;
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

fn decode_teams(list: &yaml::Node, c: &mut Config, d: &mut Diagnostics) {
    let Some(items) = list.as_seq() else {
        d.error(
            &list.span,
            "auth.teams",
            format!("expected a list, found {}", list.type_name()),
        );
        return;
    };
    for (i, item) in items.iter().enumerate() {
        let path = format!("auth.teams[{i}]");
        let Some(o) = Obj::new(item, &path, &["name", "token"], &[], d) else {
            continue;
        };
        let (Some(name), Some(token)) = (o.req_str(d, "name"), o.text(d, "token")) else {
            continue;
        };
        if token.is_empty() {
            d.warning(
                o.span(),
                &path,
                format!("team `{name}` has an empty token and is ignored"),
            );
            continue;
        }
        c.auth_teams.push(TeamToken { name, token });
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
