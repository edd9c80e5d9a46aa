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

use crate::diag::{Diagnostics, Span};
use crate::yaml;

pub(crate) mod decode;
pub(crate) mod mcp;
pub(crate) mod tools;
mod unset;
pub use crate::domain::ToolEffect;
use decode::{decode, expand_tree};
pub use mcp::{McpServer, McpTransport};
pub use tools::{
    check_mcp_refs, AgentTool, ApprovalRule, DeclaredTool, ShellTool, ToolRun, WebhookTool,
    DEFAULT_APPROVAL_TIMEOUT_SECONDS, DEFAULT_MAX_TURNS, DELEGATE_TOOL,
};
#[derive(Debug, Clone)]
pub struct Config {
    /// The config file, or `None` when built-in defaults are used.
    pub file: Option<PathBuf>,
    pub server: Server,
    pub pipeline_config_dir: PathBuf,
    pub step_library_dir: PathBuf,
    /// The SQLite file (`database.path`), used when `database_url` is not set.
    pub database_path: PathBuf,
    /// `database.url`: PostgreSQL, shared by several replicas, instead of the file.
    pub database_url: Option<String>,
    /// `database.pool_size`: read connections kept open to PostgreSQL.
    pub database_pool_size: usize,
    /// `replica`: how long a run's lease lasts and how often it is renewed.
    pub replica: ReplicaTiming,
    pub durability: Durability,
    pub dedup: Dedup,
    pub max_runs: usize,
    /// Requests in flight to one outbound peer (webhook target, LLM API) at most.
    pub max_connections_per_host: usize,
    pub auth_teams: Vec<TeamToken>,
    /// May read, cancel, replay, decide and reload (the operator route class).
    pub auth_operators: Vec<TeamToken>,
    /// May read `/metrics` only, and only matters with `protect_metrics`.
    pub auth_scrapers: Vec<TeamToken>,
    pub protect_metrics: bool,
    /// Secrets written as `${VAR}` (no default) whose variable is unset or empty.
    /// Commands that act on them (`serve`, `run`) refuse to start; see
    /// [`Config::require_secrets`].
    pub unset_secrets: Vec<UnsetSecret>,
    pub providers: BTreeMap<String, Provider>,
    pub agents: BTreeMap<String, Agent>,
    /// Declared tools (`tools:`), usable by any agent that lists them (SPEC 10).
    pub tools: BTreeMap<String, DeclaredTool>,
    pub pricing: BTreeMap<String, Price>,
    pub telegram: Option<Telegram>,
    /// `notifications.max_age_seconds`: how long an undelivered notification is
    /// retried before it is given up (`notification_failed`).
    pub notification_max_age_seconds: u64,
    pub human_approval: HumanApproval,
    pub logging: Logging,
    pub retention_days: u64,
    /// `mcp_servers`: the MCP servers agents may use, by name (SPEC 10).
    pub mcp_servers: BTreeMap<String, McpServer>,
}

/// `replica: {lease_seconds, heartbeat_seconds}` (PostgreSQL only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaTiming {
    pub lease_seconds: u64,
    pub heartbeat_seconds: u64,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub host: String,
    pub port: u16,
    pub max_body_bytes: u64,
    /// Lets `serve` listen on a non-loopback address with no auth configured.
    pub allow_unauthenticated: bool,
    /// A new connection must send its request headers within this time.
    pub header_read_timeout_seconds: f64,
    /// A request body must arrive whole within this time.
    pub body_read_timeout_seconds: f64,
    /// A keep-alive connection is closed after this long without a request.
    pub idle_timeout_seconds: f64,
    /// At most this many open connections; `None`: from the open-files limit.
    pub max_connections: Option<usize>,
}

/// A secret that expanded empty from a `${VAR}` without a default.
#[derive(Debug, Clone)]
pub struct UnsetSecret {
    /// The config key, e.g. `auth.teams[0].token`.
    pub key: String,
    pub variable: String,
    pub span: Span,
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
    /// Empty for a scripted provider, which calls nothing.
    pub base_url: String,
    pub api_key: Option<String>,
    pub timeout_seconds: f64,
    pub kind: ProviderKind,
}

/// What answers an agent's turns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ProviderKind {
    /// An OpenAI-compatible chat completions API at `base_url` (the default).
    #[default]
    OpenAi,
    /// Replays the turns of a YAML script (`script:`, resolved against the config
    /// file's folder): offline demos and `vectorstep test` (SPEC 10).
    Scripted { script: PathBuf },
}

#[derive(Debug, Clone)]
pub struct Agent {
    pub provider: String,
    pub model: String,
    pub system_prompt: String,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u64>,
    /// Declared tool names and MCP servers, in the order written (SPEC 10).
    pub tools: Vec<AgentTool>,
    /// Agents the built-in `delegate` tool may ask; checked to exist, never itself.
    pub delegates: Vec<String>,
    /// The loop ends after this many turns (the last asked for a final answer).
    pub max_turns: u32,
    /// How long a tool call with `approval: required` waits for a human before the
    /// timeout is returned to the model as the tool's result.
    pub approval_timeout_seconds: u64,
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
                allow_unauthenticated: false,
                header_read_timeout_seconds: 10.0,
                body_read_timeout_seconds: 30.0,
                idle_timeout_seconds: 60.0,
                max_connections: None,
            },
            pipeline_config_dir: PathBuf::from("./pipelines"),
            step_library_dir: PathBuf::from("./samples/steps"),
            database_path: PathBuf::from("./data/vectorstep.db"),
            database_url: None,
            database_pool_size: 16,
            replica: ReplicaTiming {
                lease_seconds: 30,
                heartbeat_seconds: 5,
            },
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
            max_connections_per_host: crate::executor::http::DEFAULT_MAX_CONNECTIONS_PER_HOST,
            auth_teams: Vec::new(),
            auth_operators: Vec::new(),
            auth_scrapers: Vec::new(),
            protect_metrics: false,
            unset_secrets: Vec::new(),
            providers: BTreeMap::new(),
            agents: BTreeMap::new(),
            tools: BTreeMap::new(),
            pricing: BTreeMap::new(),
            telegram: None,
            notification_max_age_seconds: 24 * 3600,
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
            mcp_servers: BTreeMap::new(),
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
        let mut unset = unset::Unset::default();
        expand_tree(&mut root, &lookup, &mut unset);
        // At the line that uses it, so the operator sees which setting is empty.
        for (name, span) in unset.first_uses() {
            d.warning(
                &span,
                "",
                format!("environment variable `{name}` is not set; it expands to an empty string"),
            );
        }
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let config = decode(&root, &base, &unset, &mut d);
        let mut config = match config {
            Some(c) if !d.has_errors() => c,
            _ => return Err(Error::Invalid(d)),
        };
        config.file = Some(path.to_path_buf());
        Ok((config, d))
    }

    /// Whether any bearer token is configured for the API (teams or operators):
    /// then every route but the open ones needs a credential.
    pub fn auth_enabled(&self) -> bool {
        !self.auth_teams.is_empty() || !self.auth_operators.is_empty()
    }

    /// Fails closed: every secret that expanded empty from a `${VAR}` without a
    /// default is an error naming its key and variable. `${VAR:-}` and `""` mean
    /// "not configured" and pass.
    pub fn require_secrets(&self) -> Result<(), Diagnostics> {
        if self.unset_secrets.is_empty() {
            return Ok(());
        }
        let mut d = Diagnostics::new();
        for s in &self.unset_secrets {
            d.error_hint(
                &s.span,
                &s.key,
                format!(
                    "`${{{v}}}` expands to an empty string: the environment variable `{v}` is not set or empty",
                    v = s.variable
                ),
                format!(
                    "set {v} in the service's environment, or write `${{{v}:-}}` if this secret is deliberately not configured",
                    v = s.variable
                ),
            );
        }
        Err(d)
    }

    /// The declared tools `agent` lists, in its order (its MCP entries are the MCP
    /// client's). Empty for an unknown agent; names are checked at load.
    pub fn declared_tools(&self, agent: &str) -> Vec<&DeclaredTool> {
        let Some(a) = self.agents.get(agent) else {
            return Vec::new();
        };
        a.tools
            .iter()
            .filter_map(|t| match t {
                AgentTool::Declared { name, .. } => self.tools.get(name),
                AgentTool::Mcp { .. } => None,
            })
            .collect()
    }

    /// The provider an agent uses, if both are configured.
    pub fn agent_provider(&self, agent: &str) -> Option<(&Agent, &Provider)> {
        let a = self.agents.get(agent)?;
        let p = self.providers.get(&a.provider)?;
        Some((a, p))
    }
}

impl Config {
    /// Opens the store this config names: PostgreSQL when `database.url` is set,
    /// otherwise the SQLite file at `database.path`. (Here rather than in `store`,
    /// which knows nothing of the config.)
    pub fn open_store(&self) -> Result<crate::store::Store, crate::store::Error> {
        match &self.database_url {
            Some(url) => crate::store::Store::open_postgres(url, self.database_pool_size),
            None => crate::store::Store::open(&self.database_path),
        }
    }
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
