//! The named entries of `config.yaml` (providers, agents, declared tools, MCP
//! servers, approval routes, tokens), from the key lists of `config::decode`,
//! `config::tools` and `config::mcp`, and the `${VAR}`-aware scalar helpers.

use serde_json::{json, Map, Value};

use super::{
    choice, default, integer, mapping, object, seconds, str_list, str_map, string, text, typed,
    with,
};
use crate::config::decode::*;
use crate::config::mcp::{self, APPROVAL_WORDS, EFFECT_WORDS};
use crate::config::tools::{
    AGENT_MCP_TOOL_KEYS, DEFAULT_APPROVAL_TIMEOUT_SECONDS, DEFAULT_MAX_TURNS, SHELL_TOOL_KEYS,
    TOOL_APPROVALS, TOOL_EFFECTS, TOOL_KEYS, WEBHOOK_TOOL_KEYS,
};

/// `schema`, or a string holding a `${VAR}` that expands to it.
pub(super) fn env(schema: Value) -> Value {
    let Value::Object(mut inner) = schema else {
        return schema;
    };
    let mut out = Map::new();
    for key in ["description", "default"] {
        if let Some(v) = inner.remove(key) {
            out.insert(key.into(), v);
        }
    }
    out.insert(
        "anyOf".into(),
        json!([inner, {"type": "string", "pattern": r"\$\{"}]),
    );
    Value::Object(out)
}

pub(super) fn int(min: u64, description: &str) -> Value {
    env(integer(min, description))
}

pub(super) fn boolean(description: &str) -> Value {
    env(typed("boolean", description))
}

pub(super) fn word(words: &[&str], description: &str) -> Value {
    env(choice(words, description))
}

/// A number of seconds > 0.
pub(super) fn positive_seconds(description: &str) -> Value {
    env(json!({"type": "number", "exclusiveMinimum": 0, "description": description}))
}

/// A mapping of names to `entry` (`decode_named`).
pub(super) fn named(description: &str, entry: Value) -> Value {
    json!({"type": "object", "description": description, "additionalProperties": entry})
}

pub(super) fn token() -> Value {
    object(
        "One named bearer token; an empty token is ignored.",
        TOKEN_KEYS,
        &[],
        TOKEN_KEYS,
        true,
        |k| {
            Some(match k {
                "name" => string("Who holds the token (a team name for `teams`)."),
                "token" => text("The token, best given as `${VAR}`."),
                _ => return None,
            })
        },
    )
}

pub(super) fn provider() -> Value {
    let p = object("One provider.", PROVIDER_KEYS, &[], &[], true, |k| {
        Some(match k {
            "kind" => default(
                word(
                    PROVIDER_KINDS,
                    "An OpenAI-compatible endpoint, or a scripted replay for offline demos.",
                ),
                PROVIDER_KINDS[0],
            ),
            "base_url" => string(
                "The endpoint's base URL, e.g. http://127.0.0.1:11434/v1 (required for openai).",
            ),
            "api_key" => text("The API key, best given as `${VAR}`."),
            "timeout_seconds" => default(
                env(seconds("How long one completion may take.")),
                DEFAULT_PROVIDER_TIMEOUT_SECONDS,
            ),
            "script" => {
                string("The YAML file a scripted provider replays (required for scripted).")
            }
            _ => return None,
        })
    });
    let p = with(
        p,
        "if",
        json!({"properties": {"kind": {"const": "scripted"}}, "required": ["kind"]}),
    );
    let p = with(p, "then", json!({"required": ["script"]}));
    with(
        p,
        "else",
        json!({"required": ["base_url"], "not": {"required": ["script"]}}),
    )
}

pub(super) fn agent() -> Value {
    let mcp_entry = object(
        "The tools of one MCP server.",
        AGENT_MCP_TOOL_KEYS,
        &[],
        &["mcp"],
        true,
        |k| {
            Some(match k {
                "mcp" => string("A name under `mcp_servers`."),
                "only" => with(
                    str_list("Only these tools of the server (default: all)."),
                    "minItems",
                    json!(1),
                ),
                _ => return None,
            })
        },
    );
    object(
        "One agent: a provider, a model and its tools.",
        AGENT_KEYS,
        &[],
        &["provider", "model"],
        true,
        move |k| {
            Some(match k {
                "provider" => string("A name under `providers`."),
                "model" => string("The model name sent to the provider."),
                "system_prompt" => string("The system prompt."),
                "temperature" => env(typed("number", "The sampling temperature.")),
                "max_tokens" => int(0, "The most tokens one completion may produce."),
                "tools" => {
                    json!({"type": "array", "description": "Declared tool names, and `{mcp: SERVER, only: [...]}` entries.", "items": {"anyOf": [{"type": "string"}, mcp_entry.clone()]}})
                }
                "delegates" => {
                    json!({"type": "array", "description": "Agents this agent may hand work to (the built-in `delegate` tool).", "items": {"type": "string"}})
                }
                "max_turns" => default(
                    int(1, "The most model turns of one step."),
                    DEFAULT_MAX_TURNS,
                ),
                "approval_timeout_seconds" => default(
                    int(1, "How long a tool call waits for a human decision."),
                    DEFAULT_APPROVAL_TIMEOUT_SECONDS,
                ),
                _ => return None,
            })
        },
    )
}

pub(super) fn tool() -> Value {
    let timeout = || positive_seconds("How long one call may take.");
    let webhook = object(
        "Runs the tool as a POST of its arguments as JSON.",
        WEBHOOK_TOOL_KEYS,
        &[],
        &["url"],
        true,
        move |k| {
            Some(match k {
                "url" => string("Where the request goes."),
                "headers" => str_map("Request headers."),
                "timeout_seconds" => timeout(),
                _ => return None,
            })
        },
    );
    let shell = object(
        "Runs the tool as an argv list, each element a template over `args`.",
        SHELL_TOOL_KEYS,
        &[],
        &["command"],
        true,
        move |k| {
            Some(match k {
                "command" => with(
                    str_list("The argv list; no shell parses it."),
                    "minItems",
                    json!(1),
                ),
                "timeout_seconds" => timeout(),
                _ => return None,
            })
        },
    );
    let t = object(
        "One declared tool: a description, its parameters and how it runs.",
        TOOL_KEYS,
        &[],
        &["description", "parameters"],
        true,
        move |k| {
            Some(match k {
                "description" => string("What the tool does, shown to the model."),
                "parameters" => mapping("A JSON Schema with `type: object` at the top."),
                "webhook" => webhook.clone(),
                "shell" => shell.clone(),
                "effect" => default(
                    word(TOOL_EFFECTS, "Whether a call changes anything."),
                    TOOL_EFFECTS[TOOL_EFFECTS.len() - 1],
                ),
                "approval" => default(
                    word(TOOL_APPROVALS, "Whether a human approves each call first."),
                    TOOL_APPROVALS[0],
                ),
                _ => return None,
            })
        },
    );
    with(
        t,
        "oneOf",
        json!([{"required": ["webhook"]}, {"required": ["shell"]}]),
    )
}

pub(super) fn route(description: &str) -> Value {
    let r = object(description, ROUTE_KEYS, &[], &[], true, |k| {
        Some(match k {
            "channel" => word(ROUTE_CHANNELS, "How the approval request is sent."),
            "url" => string("Where the webhook channel posts (required for it)."),
            "chat_id" => text("The Telegram chat of this route."),
            _ => return None,
        })
    });
    let r = with(
        r,
        "if",
        json!({"properties": {"channel": {"const": "webhook"}}, "required": ["channel"]}),
    );
    with(r, "then", json!({"required": ["url"]}))
}

pub(super) fn mcp_server() -> Value {
    let s = object(
        "One MCP server: a stdio child (`command`) or streamable HTTP (`url`).",
        mcp::KEYS,
        &[],
        &[],
        true,
        |k| {
            Some(match k {
                "command" => with(
                    str_list("The argv of a stdio server, run without a shell."),
                    "minItems",
                    json!(1),
                ),
                "env" => str_map("Environment variables added for the stdio server."),
                "url" => with(
                    string("The streamable-HTTP endpoint."),
                    "pattern",
                    json!("^https?://|\\$\\{"),
                ),
                "headers" => str_map("Headers sent on every HTTP request."),
                "timeout_seconds" => default(
                    positive_seconds("How long any request to the server may take."),
                    mcp::DEFAULT_TIMEOUT_SECONDS,
                ),
                "effects" => {
                    json!({"type": "object", "description": "The effect class of tools the server does not annotate.", "additionalProperties": {"type": "string", "enum": EFFECT_WORDS}})
                }
                "approval" => {
                    json!({"type": "object", "description": "Tools whose calls wait for a human.", "additionalProperties": {"type": "string", "enum": APPROVAL_WORDS}})
                }
                _ => return None,
            })
        },
    );
    let s = with(
        s,
        "oneOf",
        json!([{"required": ["command"]}, {"required": ["url"]}]),
    );
    with(
        s,
        "dependencies",
        json!({"headers": ["url"], "env": ["command"]}),
    )
}
