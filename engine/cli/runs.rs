//! `vectorstep runs cancel RUN_ID` and `runs replay RUN_ID --from STEP`: through the
//! running server's HTTP API (`POST /runs/{id}/cancel`, `POST /runs/{id}/replay`),
//! since the server drives the run. Found and authorised like `approvals`
//! (`--url`/`$VECTORSTEP_URL`, `--token`/`$VECTORSTEP_TOKEN`).

use serde_json::{json, Value};

use super::approvals::{auth_hint, base_url, Server};
use super::Cli;

const RUNS: &str = "cancelling and replaying runs need";

/// Who asked, when the server has no auth to say it: `--by`, else `$USER`.
fn asked_by(by: Option<&str>) -> String {
    by.map(str::to_string)
        .unwrap_or_else(|| std::env::var("USER").unwrap_or_else(|_| "cli".into()))
}

pub fn cancel(
    cli: &Cli,
    server: Server<'_>,
    run_id: &str,
    by: Option<&str>,
) -> anyhow::Result<i32> {
    let by = asked_by(by);
    let (base, status, body) = post(
        cli,
        server,
        &format!("runs/{run_id}/cancel"),
        json!({"by": by}),
    )?;
    if let Some(e) = auth_hint(status, &base, RUNS) {
        return Err(e);
    }
    match status {
        200 => {
            // With an operator token the server records the operator, not `--by`.
            let by = body.get("by").and_then(Value::as_str).unwrap_or(&by);
            println!("cancelling run {run_id} (by {by}): it stops at its next step boundary");
            Ok(0)
        }
        _ => Err(refused(status, &body, run_id)),
    }
}

pub fn replay(
    cli: &Cli,
    server: Server<'_>,
    run_id: &str,
    from_step: &str,
    by: Option<&str>,
) -> anyhow::Result<i32> {
    let by = asked_by(by);
    let (base, status, body) = post(
        cli,
        server,
        &format!("runs/{run_id}/replay"),
        json!({"from_step": from_step, "by": by}),
    )?;
    if let Some(e) = auth_hint(status, &base, RUNS) {
        return Err(e);
    }
    match (status, body.get("run_id").and_then(Value::as_str)) {
        (202, Some(new_id)) => {
            println!("started run {new_id}: a replay of run {run_id} from step {from_step}");
            Ok(0)
        }
        _ => Err(refused(status, &body, run_id)),
    }
}

/// POSTs `body` as JSON to `path` of the server: `(base URL, status, JSON answer)`.
fn post(
    cli: &Cli,
    server: Server<'_>,
    path: &str,
    body: Value,
) -> anyhow::Result<(String, u16, Value)> {
    let base = base_url(cli, server.url)?;
    let rt = tokio::runtime::Runtime::new()?;
    let (status, answer) = rt.block_on(async {
        let resp = server
            .authorize(reqwest::Client::new().post(format!("{base}/{path}")))
            .json(&body)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the server at {base}: {e}"))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let answer = serde_json::from_str(&text).unwrap_or(Value::String(text));
        anyhow::Ok((status, answer))
    })?;
    Ok((base, status, answer))
}

/// The server's refusal, in its own words (`error: detail`).
fn refused(status: u16, body: &Value, run_id: &str) -> anyhow::Error {
    if status == 404 {
        return anyhow::anyhow!("no run with id {run_id} on the server");
    }
    let error = body.get("error").and_then(Value::as_str);
    let detail = body.get("detail").and_then(Value::as_str);
    match (error, detail) {
        (Some(e), Some(d)) => anyhow::anyhow!("{e}: {d}"),
        (Some(e), None) => anyhow::anyhow!("{e}"),
        _ => anyhow::anyhow!("server answered HTTP {status}: {body}"),
    }
}
