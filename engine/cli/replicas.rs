//! `vectorstep replicas list`: the replicas sharing the store, through the running
//! server's `GET /replicas`, so that liveness is judged on the database's clock
//! with the server's lease settings.

use serde_json::Value;

use super::approvals::{auth_hint, base_url, Server};
use super::Cli;

pub fn list(cli: &Cli, server: Server<'_>, as_json: bool) -> anyhow::Result<i32> {
    let base = base_url(cli, server.url)?;
    let rt = tokio::runtime::Runtime::new()?;
    let body: Value = rt.block_on(async {
        let resp = server
            .authorize(reqwest::Client::new().get(format!("{base}/replicas")))
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the server at {base}: {e}"))?;
        let status = resp.status().as_u16();
        if let Some(e) = auth_hint(status, &base, "listing replicas needs") {
            return Err(e);
        }
        if status != 200 {
            anyhow::bail!(
                "server answered HTTP {status}: {}",
                resp.text().await.unwrap_or_default()
            );
        }
        anyhow::Ok(resp.json::<Value>().await?)
    })?;
    if as_json {
        println!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(0);
    }
    let none = body["replicas"].as_array().is_none_or(Vec::is_empty);
    if none {
        // Only a PostgreSQL store has replicas; a single serve on SQLite registers none.
        println!(
            "no replicas registered (replicas register only on a PostgreSQL store, database.url)"
        );
        return Ok(0);
    }
    print!("{}", vectorstep::view::replica_table(&body));
    Ok(0)
}
