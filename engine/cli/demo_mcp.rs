//! `vectorstep demo-mcp` (hidden from `--help`): a tiny MCP server on stdin/stdout
//! with ops-flavoured tools and canned answers, so the tool-using agent sample
//! (samples/agents/, docs/agents.md) runs with no cluster and no network. It is
//! rmcp's server side, the same SDK the client in engine/mcp/ uses, so the sample
//! goes through the real protocol.
//!
//! The answers are fixed text: the same call always gets the same result, which is
//! what a demo and a test need. Nothing is read or changed anywhere.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};

/// The demo cluster: one namespace, `shop`, where checkout is crash-looping after
/// a config reload timed out.
const PODS: &[(&str, &str, &str, u32)] = &[
    ("checkout-7d9f8-x2k4p", "CrashLoopBackOff", "0/1", 6),
    ("checkout-7d9f8-q8m2z", "CrashLoopBackOff", "0/1", 5),
    ("payments-5b6c4-h7t9r", "Running", "1/1", 0),
    ("frontend-66f7d-l3v8n", "Running", "1/1", 0),
];

const CHECKOUT_LOG: &[&str] = &[
    "09:14:02 INFO  loading config from /etc/checkout/config.yaml",
    "09:14:02 INFO  connecting to payments at payments.shop.svc:8080",
    "09:14:32 ERROR config reload failed: timeout after 30s waiting for vault",
    "09:14:32 ERROR readiness probe failing: config not loaded",
    "09:14:33 WARN  exiting with status 1",
];

const HEALTHY_LOG: &[&str] = &["09:14:00 INFO  serving on :8080", "09:14:30 INFO  healthy"];

pub fn serve() -> anyhow::Result<i32> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let running = DemoServer
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("MCP handshake failed: {e}"))?;
        // Ends when the client closes our stdin.
        running.waiting().await?;
        Ok(0)
    })
}

#[derive(Debug, Clone, Copy)]
struct DemoServer;

fn schema(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(JsonObject::new()),
    }
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "get_pods",
            "The pods of a namespace with their status, readiness and restart count",
            schema(json!({
                "type": "object",
                "properties": {"namespace": {"type": "string"}},
                "required": ["namespace"],
            })),
        )
        .annotate(ToolAnnotations::new().read_only(true)),
        Tool::new(
            "get_logs",
            "The last lines of a pod's log",
            schema(json!({
                "type": "object",
                "properties": {
                    "pod": {"type": "string"},
                    "lines": {"type": "integer", "minimum": 1, "maximum": 200},
                },
                "required": ["pod"],
            })),
        )
        .annotate(ToolAnnotations::new().read_only(true)),
        Tool::new(
            "scale_deployment",
            "Set the replica count of a deployment",
            schema(json!({
                "type": "object",
                "properties": {
                    "deployment": {"type": "string"},
                    "replicas": {"type": "integer", "minimum": 0, "maximum": 20},
                },
                "required": ["deployment", "replicas"],
            })),
        )
        .annotate(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(false)
                .idempotent(true),
        ),
    ]
}

/// The canned answer to one call: `Ok` is the result text, `Err` a tool-level
/// error the model reads (an unknown pod, a missing argument).
fn answer(tool: &str, args: &JsonObject) -> Result<String, String> {
    let text = |key: &str| {
        args.get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("missing string argument `{key}`"))
    };
    match tool {
        "get_pods" => {
            let ns = text("namespace")?;
            if ns != "shop" {
                return Ok(format!("No resources found in {ns} namespace."));
            }
            let mut out = String::from("NAME                   STATUS            READY  RESTARTS");
            for (name, status, ready, restarts) in PODS {
                out.push_str(&format!("\n{name:<22} {status:<17} {ready:<6} {restarts}"));
            }
            Ok(out)
        }
        "get_logs" => {
            let pod = text("pod")?;
            let lines = args
                .get("lines")
                .and_then(Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(20);
            let log = match PODS.iter().find(|p| p.0 == pod) {
                Some(p) if p.0.starts_with("checkout") => CHECKOUT_LOG,
                Some(_) => HEALTHY_LOG,
                None => return Err(format!("pods \"{pod}\" not found in namespace shop")),
            };
            let skip = log.len().saturating_sub(lines);
            Ok(log[skip..].join("\n"))
        }
        "scale_deployment" => {
            let deployment = text("deployment")?;
            let replicas = args
                .get("replicas")
                .and_then(Value::as_u64)
                .ok_or("missing integer argument `replicas`")?;
            Ok(format!(
                "deployment.apps/{deployment} scaled to {replicas} (demo: nothing was changed)"
            ))
        }
        other => Err(format!("no tool `{other}`")),
    }
}

impl ServerHandler for DemoServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions("A demo Kubernetes cluster with canned answers; nothing is real.")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let result = match answer(&request.name, &args) {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(text) => CallToolResult::error(vec![ContentBlock::text(text)]),
        };
        Ok(result.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> JsonObject {
        match v {
            Value::Object(m) => m,
            _ => JsonObject::new(),
        }
    }

    #[test]
    fn answers_are_canned_and_errors_name_the_problem() {
        let pods = answer("get_pods", &args(json!({"namespace": "shop"}))).expect("pods");
        assert!(
            pods.contains("checkout-7d9f8-x2k4p   CrashLoopBackOff"),
            "{pods}"
        );
        let logs = answer(
            "get_logs",
            &args(json!({"pod": "checkout-7d9f8-x2k4p", "lines": 2})),
        )
        .expect("logs");
        assert_eq!(logs.lines().count(), 2, "{logs}");
        assert!(logs.contains("readiness probe failing"), "{logs}");
        assert_eq!(
            answer("get_logs", &args(json!({"pod": "nope"}))),
            Err("pods \"nope\" not found in namespace shop".to_string())
        );
        assert_eq!(
            answer("get_pods", &args(json!({}))),
            Err("missing string argument `namespace`".to_string())
        );
    }
}
