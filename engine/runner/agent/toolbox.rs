//! The tools one agent step offers its model: declared tools, the tools of its MCP
//! servers (fetched at step start), each with its effect class and approval rule.
//! The list is recorded with the step's first turn (`tools_json`), so a resumed
//! step offers exactly the tools its recorded turns saw.

use serde_json::{json, Map, Value};

use crate::agent::declared::{self, CallIdentity};
use crate::agent::openai::ToolSpec;
use crate::config::{AgentTool, ApprovalRule, Config};
use crate::domain::ToolEffect;
use crate::mcp::McpServers;

/// Where a tool's calls go.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source {
    Declared,
    Mcp {
        server: String,
    },
    /// The built-in `delegate` tool: another agent answers (see `agent::delegate`).
    Delegate,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tool {
    pub spec: ToolSpec,
    pub source: Source,
    pub effect: ToolEffect,
    pub needs_approval: bool,
}

/// What a tool call returned: the text the model reads, and whether it failed.
pub(super) struct ToolResult {
    pub text: String,
    pub failed: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Toolbox {
    pub tools: Vec<Tool>,
    /// `only` entries the live server does not have, as `(server, tool)`: not
    /// offered (`vectorstep tools list` reports them).
    pub missing: Vec<(String, String)>,
}

impl Toolbox {
    /// Gathers the tools `agent` lists, asking each MCP server for its list.
    pub(crate) async fn gather(
        config: &Config,
        mcp: &McpServers,
        agent: &str,
    ) -> Result<Toolbox, String> {
        let Some(a) = config.agents.get(agent) else {
            return Err(format!("agent `{agent}` is not defined in config.yaml"));
        };
        let mut tools: Vec<Tool> = Vec::new();
        let mut missing = Vec::new();
        for entry in &a.tools {
            match entry {
                AgentTool::Declared { name, .. } => {
                    let Some(t) = config.tools.get(name) else {
                        return Err(format!(
                            "agent `{agent}` lists tool `{name}`, which is not declared"
                        ));
                    };
                    tools.push(Tool {
                        spec: ToolSpec::from(t),
                        source: Source::Declared,
                        effect: t.effect,
                        needs_approval: t.approval == ApprovalRule::Required,
                    });
                }
                AgentTool::Mcp { server, only, .. } => {
                    let Some(cfg) = config.mcp_servers.get(server) else {
                        return Err(format!(
                            "agent `{agent}` uses MCP server `{server}`, which is not configured"
                        ));
                    };
                    let listed = mcp.list_tools(server).await.map_err(|e| e.to_string())?;
                    for wanted in only.iter().flatten() {
                        if !listed.iter().any(|t| &t.name == wanted) {
                            missing.push((server.clone(), wanted.clone()));
                        }
                    }
                    for t in listed {
                        if only.as_ref().is_some_and(|o| !o.contains(&t.name)) {
                            continue;
                        }
                        tools.push(Tool {
                            effect: cfg.effect_of(&t.name, t.read_only),
                            needs_approval: cfg.approval_of(&t.name) == ApprovalRule::Required,
                            spec: ToolSpec {
                                name: t.name,
                                description: t.description,
                                parameters: t.input_schema,
                            },
                            source: Source::Mcp {
                                server: server.clone(),
                            },
                        });
                    }
                }
            }
        }
        if !a.delegates.is_empty() {
            tools.push(Tool {
                spec: crate::agent::openai::delegate_tool(&a.delegates),
                source: Source::Delegate,
                // A delegation may be asked again: its own journal keeps its effects.
                effect: ToolEffect::Read,
                needs_approval: false,
            });
        }
        // Two tools of one name cannot both be offered: the first listed wins.
        let mut seen = std::collections::HashSet::new();
        tools.retain(|t| seen.insert(t.spec.name.clone()));
        Ok(Toolbox { tools, missing })
    }

    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.spec.name == name)
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec.clone()).collect()
    }

    /// The list as recorded with the step's first turn.
    pub fn to_json(&self) -> Value {
        Value::Array(
            self.tools
                .iter()
                .map(|t| {
                    json!({
                        "name": t.spec.name,
                        "description": t.spec.description,
                        "parameters": t.spec.parameters,
                        "source": match &t.source {
                            Source::Declared => "declared".to_string(),
                            Source::Mcp { server } => format!("mcp:{server}"),
                            Source::Delegate => "delegate".to_string(),
                        },
                        "effect": t.effect.as_str(),
                        "approval": t.needs_approval,
                    })
                })
                .collect(),
        )
    }

    /// The list a step recorded; an entry this build cannot read is an error.
    pub fn from_json(v: &Value) -> Result<Toolbox, String> {
        let Some(list) = v.as_array() else {
            return Err("the recorded tool list is not a list".into());
        };
        let mut tools = Vec::new();
        for e in list {
            let text = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
            let (Some(name), Some(source), Some(effect)) =
                (text("name"), text("source"), text("effect"))
            else {
                return Err(format!("a recorded tool is incomplete: {e}"));
            };
            let source = match source.strip_prefix("mcp:") {
                Some(server) => Source::Mcp {
                    server: server.to_string(),
                },
                None if source == "declared" => Source::Declared,
                None if source == "delegate" => Source::Delegate,
                None => return Err(format!("a recorded tool has an unknown source `{source}`")),
            };
            let effect = effect
                .parse::<ToolEffect>()
                .map_err(|_| format!("a recorded tool has an unknown effect `{effect}`"))?;
            tools.push(Tool {
                spec: ToolSpec {
                    name,
                    description: text("description").unwrap_or_default(),
                    parameters: e.get("parameters").cloned().unwrap_or_else(|| json!({})),
                },
                source,
                effect,
                needs_approval: e.get("approval").and_then(Value::as_bool).unwrap_or(false),
            });
        }
        Ok(Toolbox {
            tools,
            missing: Vec::new(),
        })
    }
}

/// Runs one call of `tool`. A transport failure or a timeout is a failed result
/// the model reads (the loop goes on); the call is recorded with it.
pub(super) async fn run(
    config: &Config,
    http: &reqwest::Client,
    mcp: &McpServers,
    tool: &Tool,
    arguments: &Value,
    effect_key: &str,
    attempt: u32,
) -> ToolResult {
    match &tool.source {
        Source::Declared => {
            let Some(declared) = config.tools.get(&tool.spec.name) else {
                return ToolResult {
                    text: format!("error: tool `{}` is no longer declared", tool.spec.name),
                    failed: true,
                };
            };
            let id = CallIdentity {
                effect_key,
                attempt,
            };
            match declared::run(http, declared, arguments, id).await {
                Ok(out) => ToolResult {
                    text: out.text,
                    failed: out.failed,
                },
                Err(e) => ToolResult {
                    text: format!("error: {e}"),
                    failed: true,
                },
            }
        }
        // Run by the loop itself (it needs the journal); never reaches here.
        Source::Delegate => ToolResult {
            text: "error: delegations are run by the agent loop".into(),
            failed: true,
        },
        Source::Mcp { server } => {
            let args: Map<String, Value> = arguments.as_object().cloned().unwrap_or_default();
            match mcp
                .call_tool(server, &tool.spec.name, args, effect_key, attempt)
                .await
            {
                Ok(r) => ToolResult {
                    text: r.content_text,
                    failed: r.is_error,
                },
                Err(e) => ToolResult {
                    text: format!("error: {e}"),
                    failed: true,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_list_reads_back_as_it_was() {
        let b = Toolbox {
            missing: Vec::new(),
            tools: vec![
                Tool {
                    spec: ToolSpec {
                        name: "restart".into(),
                        description: "Restart".into(),
                        parameters: json!({"type": "object"}),
                    },
                    source: Source::Declared,
                    effect: ToolEffect::Write,
                    needs_approval: true,
                },
                Tool {
                    spec: ToolSpec {
                        name: "pods_list".into(),
                        description: "".into(),
                        parameters: json!({}),
                    },
                    source: Source::Mcp {
                        server: "k8s".into(),
                    },
                    effect: ToolEffect::Read,
                    needs_approval: false,
                },
            ],
        };
        assert_eq!(Toolbox::from_json(&b.to_json()), Ok(b));
        assert!(
            Toolbox::from_json(&json!([{"name": "x", "source": "ftp", "effect": "read"}]))
                .is_err_and(|e| e.contains("unknown source"))
        );
        assert!(Toolbox::from_json(&json!({})).is_err());
    }
}
