//! The MCP client edge (SPEC 10): the sessions to the configured `mcp_servers`,
//! through the official SDK `rmcp`.
//!
//! One [`McpServers`] per process holds at most one session per server, shared by
//! every run: it connects on first use (concurrent first users wait for the same
//! connect), and a session that died (the child exited, the transport closed, a
//! request timed out on a stdio server) is dropped so the next use connects
//! again. The agent loop calls [`McpServers::list_tools`] and
//! [`McpServers::call_tool`]; it decides effects, approvals and the journal, this
//! module only speaks MCP.
//!
//! Files: `session` (one connected session and how it ends), `stdio` (child
//! processes: own process group, death with the parent, stderr to the log),
//! `http` (rmcp's streamable-HTTP client over our reqwest 0.12).
//!
//! It is an edge, like `http/` and `telegram/`: the pure `run/` never imports it
//! (`tests/mcp.rs`: `run_does_not_import_the_mcp_edge`); the agent loop in the
//! runner calls it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, RequestMetaObject, Tool};
use rmcp::service::ServiceError;
use serde_json::{Map, Value};
use tokio::sync::Mutex;

use crate::config::McpServer;

mod http;
mod session;
mod stdio;

use session::Session;

/// The `_meta` key carrying a tool call's effect key (SPEC 10, journal rule 2).
pub const META_EFFECT_KEY: &str = "vectorstep/effect_key";
/// The `_meta` key carrying a tool call's attempt (1 first, + 1 per rerun).
pub const META_ATTEMPT: &str = "vectorstep/attempt";

/// A tool an MCP server offers, as `tools/list` described it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    pub name: String,
    pub description: String,
    /// The tool's `inputSchema` (a JSON Schema object).
    pub input_schema: Value,
    /// `annotations.readOnlyHint`; absent counts as false (a `write` tool unless
    /// `mcp_servers.<s>.effects` says otherwise).
    pub read_only: bool,
}

/// What a `tools/call` answered.
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolResult {
    /// The text parts of `content`, joined with a newline; other parts (images,
    /// resources) are left out.
    pub content_text: String,
    /// `structuredContent`, when the tool returned one.
    pub structured: Option<Value>,
    /// `isError: true`: the tool ran and failed. This is a result for the model,
    /// not a transport failure.
    pub is_error: bool,
}

/// Why an MCP request did not get a result. Every message names the server and
/// the request (`tools/list` or the tool).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The name is not under `mcp_servers` in config.yaml.
    #[error("MCP server `{server}` is not configured (known: {known})")]
    UnknownServer { server: String, known: String },
    /// Spawning the child, reaching the URL or the `initialize` handshake failed.
    #[error("MCP server `{server}`: cannot connect for {request}: {reason}")]
    Connect {
        server: String,
        request: String,
        reason: String,
    },
    /// No answer within `timeout_seconds`. A stdio server has been killed; the
    /// next request starts it again. The request may have taken effect.
    #[error("MCP server `{server}`: {request} got no answer within {seconds}s")]
    Timeout {
        server: String,
        request: String,
        seconds: f64,
    },
    /// The session broke (transport closed, unexpected answer); it has been
    /// dropped and the next request connects again.
    #[error("MCP server `{server}`: {request} failed: {reason}")]
    Protocol {
        server: String,
        request: String,
        reason: String,
    },
    /// The server answered the request with a JSON-RPC error (unknown tool, bad
    /// arguments). The session stays.
    #[error("MCP server `{server}`: {request} was refused: {message} (code {code})")]
    Tool {
        server: String,
        request: String,
        code: i32,
        message: String,
    },
}

impl Error {
    /// Whether the same request may succeed when made again: the session was
    /// dropped (or never made) and a new one may work. A refused request or an
    /// unknown server stays refused.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            Error::Connect { .. } | Error::Timeout { .. } | Error::Protocol { .. }
        )
    }
}

/// The name the brief and SPEC readers look for; the module's error type.
pub type McpError = Error;

/// The sessions of one process, one per configured server.
pub struct McpServers {
    servers: BTreeMap<String, Slot>,
    http: reqwest::Client,
}

struct Slot {
    config: McpServer,
    /// The live session, if any. Held across a connect, so concurrent first
    /// users share one.
    session: Mutex<Option<Arc<Session>>>,
}

/// What a request is, for error messages.
fn tools_list() -> String {
    "tools/list".to_string()
}

fn tool_request(tool: &str) -> String {
    format!("tools/call `{tool}`")
}

impl McpServers {
    /// The registry for `servers` (config.yaml `mcp_servers`). Connects to
    /// nothing yet. `http` is the service's shared client (its TLS setup and
    /// connection pool); per-request timeouts come from each server's
    /// `timeout_seconds`.
    pub fn new(servers: &BTreeMap<String, McpServer>, http: reqwest::Client) -> McpServers {
        let servers = servers
            .iter()
            .map(|(name, config)| {
                let slot = Slot {
                    config: config.clone(),
                    session: Mutex::new(None),
                };
                (name.clone(), slot)
            })
            .collect();
        McpServers { servers, http }
    }

    /// The configured server names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.servers.keys().map(String::as_str)
    }

    /// The tools `server` offers (every page of `tools/list`).
    pub async fn list_tools(&self, server: &str) -> Result<Vec<McpTool>, Error> {
        let (slot, session) = self.session(server, &tools_list()).await?;
        let answer = self
            .bounded(
                server,
                slot,
                &session,
                tools_list(),
                session.peer().list_all_tools(),
            )
            .await?;
        Ok(answer.into_iter().map(tool_of).collect())
    }

    /// Calls `tool` on `server` with `arguments`. The request's `params._meta`
    /// carries `vectorstep/effect_key` and `vectorstep/attempt`, so a server can
    /// recognise a rerun of a call it already performed.
    pub async fn call_tool(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
        effect_key: &str,
        attempt: u32,
    ) -> Result<McpToolResult, Error> {
        let request = tool_request(tool);
        let (slot, session) = self.session(server, &request).await?;
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = Some(arguments);
        params.meta = Some(RequestMetaObject::from(call_meta(effect_key, attempt)));
        let answer = self
            .bounded(
                server,
                slot,
                &session,
                request,
                session.peer().call_tool(params),
            )
            .await?;
        Ok(result_of(answer))
    }

    /// Closes every session and kills every stdio server's process group. Later
    /// requests connect again.
    pub async fn shutdown(&self) {
        let mut ending = Vec::new();
        for slot in self.servers.values() {
            if let Some(s) = slot.session.lock().await.take() {
                ending.push(s);
            }
        }
        futures::future::join_all(ending.iter().map(|s| s.close())).await;
    }

    /// The live session of `server`, connecting when there is none or it died.
    async fn session(&self, server: &str, request: &str) -> Result<(&Slot, Arc<Session>), Error> {
        let Some(slot) = self.servers.get(server) else {
            return Err(Error::UnknownServer {
                server: server.to_string(),
                known: self.names().collect::<Vec<_>>().join(", "),
            });
        };
        let mut current = slot.session.lock().await;
        if let Some(s) = current.as_ref() {
            if s.is_alive() {
                return Ok((slot, s.clone()));
            }
            tracing::info!(server = %server, "MCP session ended; connecting again.");
            if let Some(dead) = current.take() {
                dead.close().await;
            }
        }
        let limit = timeout_of(&slot.config);
        let session = match Session::connect(server, &slot.config, &self.http, limit).await {
            Ok(s) => Arc::new(s),
            Err(session::Failure::Failed(reason)) => {
                return Err(Error::Connect {
                    server: server.to_string(),
                    request: request.to_string(),
                    reason,
                })
            }
            Err(session::Failure::TimedOut) => {
                return Err(Error::Timeout {
                    server: server.to_string(),
                    request: request.to_string(),
                    seconds: slot.config.timeout_seconds,
                })
            }
        };
        *current = Some(session.clone());
        Ok((slot, session))
    }

    /// Runs one request of `session` under the server's timeout and maps its
    /// failure; a session that broke or timed out (stdio) is dropped.
    async fn bounded<T>(
        &self,
        server: &str,
        slot: &Slot,
        session: &Arc<Session>,
        request: String,
        fut: impl std::future::Future<Output = Result<T, ServiceError>>,
    ) -> Result<T, Error> {
        let limit = timeout_of(&slot.config);
        match tokio::time::timeout(limit, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(ServiceError::McpError(e))) => Err(Error::Tool {
                server: server.to_string(),
                request,
                code: e.code.0,
                message: e.message.to_string(),
            }),
            Ok(Err(e)) => {
                retire(slot, session).await;
                Err(Error::Protocol {
                    server: server.to_string(),
                    request,
                    reason: e.to_string(),
                })
            }
            Err(_) => {
                tracing::warn!(
                    server = %server,
                    request = %request,
                    timeout_seconds = slot.config.timeout_seconds,
                    "MCP request timed out."
                );
                if session.is_stdio() {
                    retire(slot, session).await;
                }
                Err(Error::Timeout {
                    server: server.to_string(),
                    request,
                    seconds: slot.config.timeout_seconds,
                })
            }
        }
    }
}

/// Drops `session` from its slot (if it is still the current one) and ends it:
/// a stdio server's group is killed first, so a hung server cannot delay this.
async fn retire(slot: &Slot, session: &Arc<Session>) {
    {
        let mut current = slot.session.lock().await;
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, session)) {
            *current = None;
        }
    }
    session.kill();
    session.close().await;
}

fn timeout_of(config: &McpServer) -> Duration {
    Duration::try_from_secs_f64(config.timeout_seconds).unwrap_or(Duration::from_secs(60))
}

/// `params._meta` of a `tools/call`.
fn call_meta(effect_key: &str, attempt: u32) -> Map<String, Value> {
    let mut meta = Map::new();
    meta.insert(META_EFFECT_KEY.into(), Value::from(effect_key));
    meta.insert(META_ATTEMPT.into(), Value::from(attempt));
    meta
}

fn tool_of(t: Tool) -> McpTool {
    McpTool {
        name: t.name.to_string(),
        description: t.description.map(|d| d.to_string()).unwrap_or_default(),
        input_schema: Value::Object((*t.input_schema).clone()),
        read_only: t
            .annotations
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false),
    }
}

fn result_of(r: CallToolResult) -> McpToolResult {
    let texts: Vec<&str> = r
        .content
        .iter()
        .filter_map(|c| c.as_text())
        .map(|t| t.text.as_str())
        .collect();
    McpToolResult {
        content_text: texts.join("\n"),
        structured: r.structured_content,
        is_error: r.is_error.unwrap_or(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_meta_carries_key_and_attempt() {
        let m = call_meta("run-1:triage:1:2:1", 3);
        assert_eq!(
            Value::Object(m),
            serde_json::json!({"vectorstep/effect_key": "run-1:triage:1:2:1", "vectorstep/attempt": 3})
        );
    }

    #[test]
    fn text_parts_are_joined_and_is_error_kept() {
        let r: CallToolResult = serde_json::from_value(serde_json::json!({
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image", "data": "AA==", "mimeType": "image/png"},
                {"type": "text", "text": "b"}
            ],
            "structuredContent": {"n": 1},
            "isError": true
        }))
        .unwrap();
        assert_eq!(
            result_of(r),
            McpToolResult {
                content_text: "a\nb".into(),
                structured: Some(serde_json::json!({"n": 1})),
                is_error: true,
            }
        );
    }

    #[test]
    fn read_only_comes_from_the_annotation() {
        let check = |tool: Value, want: bool| {
            let t: Tool = serde_json::from_value(tool.clone()).unwrap();
            assert_eq!(tool_of(t).read_only, want, "{tool}");
        };
        let schema = serde_json::json!({"type": "object"});
        check(
            serde_json::json!({"name": "a", "inputSchema": schema}),
            false,
        );
        check(
            serde_json::json!({"name": "b", "inputSchema": schema, "annotations": {"readOnlyHint": true}}),
            true,
        );
        check(
            serde_json::json!({"name": "c", "inputSchema": schema, "annotations": {"readOnlyHint": false}}),
            false,
        );
    }

    #[tokio::test]
    async fn an_unknown_server_is_named_with_the_known_ones() {
        let servers = McpServers::new(&BTreeMap::new(), reqwest::Client::new());
        let err = servers.list_tools("nope").await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "MCP server `nope` is not configured (known: )"
        );
        assert!(!err.is_retriable());
    }
}
