//! `vectorstep tools list [AGENT]`: connect to the MCP servers and print every tool
//! each agent would be offered, with its effect class and approval rule.

use super::{load_config, Cli};
use vectorstep::mcp::McpServers;
use vectorstep::runner::agent::list_tools;

pub fn list(cli: &Cli, agent: Option<&str>) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let agents: Vec<String> = match agent {
        Some(a) if !config.agents.contains_key(a) => {
            let known: Vec<&str> = config.agents.keys().map(String::as_str).collect();
            anyhow::bail!(
                "no agent `{a}` in {} (agents: {})",
                cli.config.display(),
                known.join(", ")
            );
        }
        Some(a) => vec![a.to_string()],
        None => config
            .agents
            .iter()
            .filter(|(_, a)| !a.tools.is_empty())
            .map(|(n, _)| n.clone())
            .collect(),
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let mcp = McpServers::new(&config.mcp_servers, vectorstep::executor::http::client());
        let mut rows = vec![[
            "AGENT".to_string(),
            "TOOL".into(),
            "SOURCE".into(),
            "EFFECT".into(),
            "APPROVAL".into(),
        ]];
        let mut problems = Vec::new();
        for a in &agents {
            match list_tools(&config, &mcp, a).await {
                Ok((tools, missing)) => {
                    for t in tools {
                        rows.push([
                            a.clone(),
                            t.name,
                            t.source,
                            t.effect.as_str().to_string(),
                            if t.needs_approval { "required" } else { "none" }.to_string(),
                        ]);
                    }
                    for m in missing {
                        problems.push(format!(
                            "agent `{a}`: `only` names `{m}`, which the server does not offer"
                        ));
                    }
                }
                Err(e) => problems.push(format!("agent `{a}`: {e}")),
            }
        }
        mcp.shutdown().await;
        let widths: Vec<usize> = (0..5)
            .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for r in &rows {
            let cells: Vec<String> = r
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
        }
        use std::io::Write;
        // A closed pipe (`| head`) ends the listing quietly.
        let _ = std::io::stdout().write_all(out.as_bytes());
        for p in &problems {
            eprintln!("error: {p}");
        }
        Ok(if problems.is_empty() { 0 } else { 1 })
    })
}
