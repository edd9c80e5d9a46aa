//! The schema of `config.yaml`, from the key lists of `config::decode`,
//! `config::mcp` and `config::tools`; defaults from `Config::default()`.
//!
//! The file is checked as written, before `${VAR}` expansion. An unquoted value
//! is typed after expansion (`port: ${PORT:-8000}` is a number), so wherever a
//! number, a boolean or a fixed word is expected a string holding `${` is
//! accepted too.

use serde_json::{json, Map, Value};

use super::config_named::{
    agent, boolean, env, int, mcp_server, named, positive_seconds, provider, route, token, tool,
    word,
};
use super::{default, document, nullable, object, str_list, string, text, typed, with};
use crate::config::decode::*;
use crate::config::tools::DELEGATE_TOOL;
use crate::config::Config;

/// The schema of `config.yaml`.
pub fn config() -> Value {
    let root = object(
        "The vectorstep service configuration; `${VAR}` and `${VAR:-default}` are expanded in every string.",
        TOP_KEYS,
        &[],
        &[],
        true,
        top_key,
    );
    document("vectorstep config.yaml", nullable(root), Map::new())
}

fn top_key(key: &str) -> Option<Value> {
    let c = Config::default();
    let path = |p: &std::path::Path| p.display().to_string();
    Some(match key {
        "server" => object(
            "The HTTP listener for webhooks, the run API, approvals and /metrics.",
            SERVER_KEYS,
            &[],
            &[],
            true,
            |k| {
                let s = Config::default().server;
                Some(match k {
                    "host" => default(string("The address to listen on."), s.host),
                    "port" => default(
                        env(
                            json!({"type": "integer", "minimum": 0, "maximum": 65535, "description": "The TCP port to listen on."}),
                        ),
                        s.port,
                    ),
                    "max_body_bytes" => default(
                        int(1, "Larger request bodies are answered 413."),
                        s.max_body_bytes,
                    ),
                    "allow_unauthenticated" => default(
                        boolean("Allow serving without auth on a non-loopback address."),
                        s.allow_unauthenticated,
                    ),
                    "header_read_timeout_seconds" => default(
                        positive_seconds("How long a client may take to send the request headers."),
                        s.header_read_timeout_seconds,
                    ),
                    "body_read_timeout_seconds" => default(
                        positive_seconds("How long a client may take to send the request body."),
                        s.body_read_timeout_seconds,
                    ),
                    "idle_timeout_seconds" => default(
                        positive_seconds("How long an idle keep-alive connection stays open."),
                        s.idle_timeout_seconds,
                    ),
                    "max_connections" => int(
                        1,
                        "The most connections served at once (default: no limit).",
                    ),
                    _ => return None,
                })
            },
        ),
        "pipeline_config_dir" => default(
            string("The pipeline folder, relative to this file."),
            path(&c.pipeline_config_dir),
        ),
        "step_library_dir" => default(
            string("The step library `use:` entries draw from, relative to this file."),
            path(&c.step_library_dir),
        ),
        "database" => object(
            "The store: a SQLite file (`path`) or PostgreSQL shared by replicas (`url`), not both.",
            DATABASE_KEYS,
            &[],
            &[],
            true,
            |k| {
                let c = Config::default();
                Some(match k {
                    "path" => default(
                        string("The SQLite file, relative to this file."),
                        c.database_path.display().to_string(),
                    ),
                    "url" => with(
                        string(
                            "A PostgreSQL URL, postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE.",
                        ),
                        "pattern",
                        json!("^(postgres|postgresql)://|\\$\\{"),
                    ),
                    "pool_size" => default(
                        int(1, "Read connections kept open to PostgreSQL."),
                        c.database_pool_size,
                    ),
                    _ => return None,
                })
            },
        ),
        "durability" => object(
            "How runs of durable pipelines resume after a restart.",
            DURABILITY_KEYS,
            &[],
            &[],
            true,
            |k| {
                let d = Config::default().durability;
                Some(match k {
                    "max_resume_age_seconds" => default(
                        int(0, "Older running runs are interrupted, not resumed."),
                        d.max_resume_age_seconds,
                    ),
                    "max_resume_attempts" => default(
                        int(1, "A run resumed this often is interrupted."),
                        d.max_resume_attempts,
                    ),
                    "shutdown_grace_seconds" => default(
                        int(0, "How long SIGTERM waits for in-flight steps."),
                        d.shutdown_grace_seconds,
                    ),
                    _ => return None,
                })
            },
        ),
        "dedup" => object(
            "Service-wide webhook dedup; a pipeline's `trigger.dedup` overrides it.",
            DEDUP_KEYS,
            &[],
            &[],
            true,
            |k| {
                let d = Config::default().dedup;
                Some(match k {
                    "enabled" => default(
                        boolean("Whether repeated events within the window start no new run."),
                        d.enabled,
                    ),
                    "window_seconds" => default(
                        int(0, "How long an event's fingerprint suppresses repeats."),
                        d.window_seconds,
                    ),
                    _ => return None,
                })
            },
        ),
        "concurrency" => object(
            "Limits on concurrent work.",
            CONCURRENCY_KEYS,
            &[],
            &[],
            true,
            |k| {
                let c = Config::default();
                Some(match k {
                    "max_runs" => default(
                        int(1, "At most this many runs at once; more webhooks get 429."),
                        c.max_runs,
                    ),
                    "max_connections_per_host" => default(
                        int(1, "HTTP connections per host that executors keep open."),
                        c.max_connections_per_host,
                    ),
                    _ => return None,
                })
            },
        ),
        "auth" => object(
            "Bearer tokens of teams, operators and scrapers.",
            AUTH_KEYS,
            &[],
            &[],
            true,
            |k| {
                if AUTH_TOKEN_LISTS.contains(&k) {
                    return Some(
                        json!({"type": "array", "description": format!("The named tokens of the {k}."), "items": token()}),
                    );
                }
                (k == "protect_metrics").then(|| {
                    default(
                        boolean("Whether /metrics needs a scraper or operator token."),
                        Config::default().protect_metrics,
                    )
                })
            },
        ),
        "providers" => named(
            "OpenAI-compatible chat endpoints (or scripted replays), by name.",
            provider(),
        ),
        "agents" => named("Agents, by the name `executor_config.agent` uses.", agent()),
        "tools" => with(
            named("Declared tools agents may call, by name.", tool()),
            "propertyNames",
            json!({"pattern": "^[A-Za-z0-9_-]{1,64}$", "not": {"const": DELEGATE_TOOL}}),
        ),
        "pricing" => named(
            "USD per million tokens, by model name.",
            object("The price of one model.", PRICE_KEYS, &[], &[], true, |k| {
                Some(match k {
                    "input_per_mtok" => {
                        default(env(typed("number", "USD per million input tokens.")), 0.0)
                    }
                    "output_per_mtok" => {
                        default(env(typed("number", "USD per million output tokens.")), 0.0)
                    }
                    _ => return None,
                })
            }),
        ),
        "notifications" => object(
            "Notification channels.",
            NOTIFICATIONS_KEYS,
            &[],
            &[],
            true,
            |k| {
                Some(match k {
                    "max_age_seconds" => default(
                        int(0, "Notifications older than this are dropped, not sent."),
                        Config::default().notification_max_age_seconds,
                    ),
                    "telegram" => object(
                        "The Telegram bot; an empty token or chat id means not configured.",
                        TELEGRAM_KEYS,
                        &[],
                        &[],
                        true,
                        |k| {
                            Some(match k {
                                "bot_token" => text("The bot's token, best given as `${VAR}`."),
                                "chat_id" => text("The chat messages go to."),
                                "api_url" => string(
                                    "A self-hosted or fake Bot API (default: the public one).",
                                ),
                                _ => return None,
                            })
                        },
                    ),
                    _ => return None,
                })
            },
        ),
        "human_approval" => object(
            "Where `executor: human` approval requests go and who may decide them.",
            HUMAN_APPROVAL_KEYS,
            &[],
            &[],
            true,
            |k| {
                Some(match k {
                    "ui_base_url" => default(
                        string("The base URL of approval links."),
                        Config::default().human_approval.ui_base_url,
                    ),
                    "approvers" => {
                        str_list("Telegram user ids that may decide; empty: anyone in the chat.")
                    }
                    "default" => route("The route of teams without one of their own."),
                    "teams" => named("Routes per team.", route("The route of one team.")),
                    _ => return None,
                })
            },
        ),
        "logging" => object("Log level and format.", LOGGING_KEYS, &[], &[], true, |k| {
            Some(match k {
                "level" => default(
                    word(LOG_LEVELS, "The least severe level logged."),
                    Config::default().logging.level,
                ),
                "format" => default(
                    word(LOG_FORMATS, "Pretty for a terminal, json for log shipping."),
                    LOG_FORMATS[0],
                ),
                _ => return None,
            })
        }),
        "retention" => object(
            "How long finished runs are kept.",
            RETENTION_KEYS,
            &[],
            &[],
            true,
            |k| {
                (k == "days").then(|| {
                    default(
                        int(0, "Finished runs older than this are deleted."),
                        Config::default().retention_days,
                    )
                })
            },
        ),
        "mcp_servers" => named("MCP servers agents may use, by name.", mcp_server()),
        "replica" => object(
            "Lease timing of replicas sharing a PostgreSQL store.",
            REPLICA_KEYS,
            &[],
            &[],
            true,
            |k| {
                let r = Config::default().replica;
                Some(match k {
                "lease_seconds" => default(int(1, "How long a run's lease lasts; at least twice heartbeat_seconds plus one."), r.lease_seconds),
                "heartbeat_seconds" => default(int(1, "How often a replica renews its leases."), r.heartbeat_seconds),
                _ => return None,
            })
            },
        ),
        _ => return None,
    })
}
