//! `config.yaml`: the service's settings (SPEC section 3).
//!
//! `${VAR}` and `${VAR:-default}` are expanded anywhere inside string values before
//! the file is validated, so a misspelled key is reported with its real position
//! and a missing variable is visible as a warning. Relative paths are resolved
//! against the folder holding the config file, so the service behaves the same
//! whatever directory it is started from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::decode::Obj;
use crate::diag::{Diagnostics, Span};
use crate::yaml;

#[derive(Debug, Clone)]
pub struct Config {
    /// The config file, or `None` when built-in defaults are used.
    pub file: Option<PathBuf>,
    pub server: Server,
    pub pipeline_config_dir: PathBuf,
    pub step_library_dir: PathBuf,
    pub database_path: PathBuf,
    pub durability: Durability,
    pub dedup: Dedup,
    pub max_runs: usize,
    pub auth_teams: Vec<TeamToken>,
    pub providers: BTreeMap<String, Provider>,
    pub agents: BTreeMap<String, Agent>,
    pub pricing: BTreeMap<String, Price>,
    pub telegram: Option<Telegram>,
    pub human_approval: HumanApproval,
    pub logging: Logging,
    pub retention_days: u64,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub host: String,
    pub port: u16,
    pub max_body_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct Durability {
    pub max_resume_age_seconds: u64,
    pub max_resume_attempts: u32,
    pub shutdown_grace_seconds: u64,
}

#[derive(Debug, Clone)]
pub struct Dedup {
    pub enabled: bool,
    pub window_seconds: u64,
}

#[derive(Debug, Clone)]
pub struct TeamToken {
    pub name: String,
    pub token: String,
}

#[derive(Debug, Clone)]
pub struct Provider {
    pub base_url: String,
    pub api_key: Option<String>,
    pub timeout_seconds: f64,
}

#[derive(Debug, Clone)]
pub struct Agent {
    pub provider: String,
    pub model: String,
    pub system_prompt: String,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

#[derive(Debug, Clone)]
pub struct Telegram {
    pub bot_token: String,
    pub chat_id: String,
    pub api_url: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct ApprovalRoute {
    pub channel: String,
    pub url: Option<String>,
    pub chat_id: Option<String>,
}

#[derive(Debug, Clone)]
pub struct HumanApproval {
    pub ui_base_url: String,
    pub approvers: Vec<String>,
    pub default: Option<ApprovalRoute>,
    pub teams: BTreeMap<String, ApprovalRoute>,
}

#[derive(Debug, Clone)]
pub struct Logging {
    pub level: String,
    pub json: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            file: None,
            server: Server {
                host: "127.0.0.1".into(),
                port: 8000,
                max_body_bytes: 1024 * 1024,
            },
            pipeline_config_dir: PathBuf::from("./pipelines"),
            step_library_dir: PathBuf::from("./samples/steps"),
            database_path: PathBuf::from("./data/vectorstep.db"),
            durability: Durability {
                max_resume_age_seconds: 3600,
                max_resume_attempts: 5,
                shutdown_grace_seconds: 30,
            },
            dedup: Dedup {
                enabled: true,
                window_seconds: 300,
            },
            max_runs: 100,
            auth_teams: Vec::new(),
            providers: BTreeMap::new(),
            agents: BTreeMap::new(),
            pricing: BTreeMap::new(),
            telegram: None,
            human_approval: HumanApproval {
                ui_base_url: "http://127.0.0.1:8000".into(),
                approvers: Vec::new(),
                default: None,
                teams: BTreeMap::new(),
            },
            logging: Logging {
                level: "info".into(),
                json: false,
            },
            retention_days: 30,
        }
    }
}

/// Expands `${VAR}` and `${VAR:-default}` inside `text`. Unset variables without a
/// default become empty and are reported through `missing`.
pub fn expand_env(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    missing: &mut Vec<String>,
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let inner = &after[..end];
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        match (
            lookup(name).filter(|v| !v.is_empty() || default.is_none()),
            default,
        ) {
            (Some(v), _) => out.push_str(&v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => missing.push(name.to_string()),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(Diagnostics),
}

impl Config {
    /// Loads `path`. When `path` does not exist and `explicit` is false, the built-in
    /// defaults are used (so `vectorstep validate` works in a bare checkout).
    pub fn load(path: &Path, explicit: bool) -> Result<(Config, Diagnostics), Error> {
        let source = match std::fs::read_to_string(path) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                return Ok((Config::default(), Diagnostics::new()));
            }
            Err(source) => {
                return Err(Error::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let mut d = Diagnostics::new();
        let file: Arc<str> = Arc::from(path.display().to_string());
        let mut root = match yaml::parse(&file, &source) {
            Ok(n) => n,
            Err(e) => {
                d.error(&e.span, "", e.message);
                return Err(Error::Invalid(d));
            }
        };
        let lookup = |k: &str| std::env::var(k).ok();
        let mut missing = Vec::new();
        expand_tree(&mut root, &lookup, &mut missing);
        missing.sort();
        missing.dedup();
        for name in missing {
            d.warning(
                &Span::new(file.clone(), 1, 1),
                "",
                format!("environment variable `{name}` is not set; it expands to an empty string"),
            );
        }
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let config = decode(&root, &base, &mut d);
        let mut config = match config {
            Some(c) if !d.has_errors() => c,
            _ => return Err(Error::Invalid(d)),
        };
        config.file = Some(path.to_path_buf());
        Ok((config, d))
    }

    /// The provider an agent uses, if both are configured.
    pub fn agent_provider(&self, agent: &str) -> Option<(&Agent, &Provider)> {
        let a = self.agents.get(agent)?;
        let p = self.providers.get(&a.provider)?;
        Some((a, p))
    }
}

/// Expands variables in every string. An unquoted value is typed after expansion,
/// so `port: ${PORT:-8000}` is a number, as it would be written out.
fn expand_tree(
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

fn decode(root: &yaml::Node, base: &Path, d: &mut Diagnostics) -> Option<Config> {
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
        if let Some(o) = Obj::new(n, "notifications", &["telegram"], &[], d) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        match k {
            "SET" => Some("value".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expands_anywhere_in_a_string() {
        let mut missing = Vec::new();
        let cases = [
            ("Bearer ${SET}", "Bearer value"),
            ("${UNSET:-fallback}/x", "fallback/x"),
            ("${EMPTY:-d}", "d"),
            ("a${SET}b${SET}c", "avaluebvaluec"),
            ("no vars", "no vars"),
            ("broken ${SET", "broken ${SET"),
        ];
        for (input, want) in cases {
            assert_eq!(expand_env(input, &env, &mut missing), want, "{input}");
        }
        assert!(missing.is_empty());
        assert_eq!(expand_env("x${UNSET}y", &env, &mut missing), "xy");
        assert_eq!(missing, vec!["UNSET".to_string()]);
    }

    #[test]
    fn unknown_key_is_an_error_with_position() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.yaml");
        std::fs::write(&p, "server: {host: 127.0.0.1}\ndedupe: {enabled: true}\n").unwrap();
        let Err(Error::Invalid(d)) = Config::load(&p, true) else {
            panic!("expected an invalid config");
        };
        let text = d.to_string();
        assert!(text.contains(":2:1: error: unknown key `dedupe`"), "{text}");
        assert!(text.contains("did you mean `dedup`?"), "{text}");
    }

    #[test]
    fn unquoted_variables_are_typed_after_expansion() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.yaml");
        std::fs::write(&p, "server:\n  port: ${VECTORSTEP_TEST_UNSET_PORT:-8123}\n  host: \"${VECTORSTEP_TEST_UNSET_HOST:-10.0.0.1}\"\n").unwrap();
        let (c, _) = Config::load(&p, true).unwrap();
        assert_eq!(c.server.port, 8123);
        assert_eq!(c.server.host, "10.0.0.1");
    }

    #[test]
    fn paths_resolve_against_the_config_folder() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.yaml");
        std::fs::write(
            &p,
            "database: {path: ./db/x.db}\npipeline_config_dir: /abs\n",
        )
        .unwrap();
        let (c, _) = Config::load(&p, true).unwrap();
        assert_eq!(c.database_path, dir.path().join("./db/x.db"));
        assert_eq!(c.pipeline_config_dir, PathBuf::from("/abs"));
    }
}
