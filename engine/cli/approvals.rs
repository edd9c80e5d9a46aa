//! `vectorstep approvals list|approve|reject`: decide through the running server's
//! HTTP API, so the waiting run wakes at once and the first decision wins.

use serde_json::{json, Value};
use vectorstep::domain::ApprovalStatus;

use super::{load_config, Cli};

/// How to reach the running server: `--url` / `$VECTORSTEP_URL` (default: the
/// configured host and port) and `--token` / `$VECTORSTEP_TOKEN`.
#[derive(Clone, Copy)]
pub struct Server<'a> {
    pub url: Option<&'a str>,
    pub token: Option<&'a str>,
}

impl Server<'_> {
    pub(super) fn authorize(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self.token.filter(|t| !t.is_empty()) {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }
}

/// An answer the server refused on auth grounds, said as what to do; `what` is
/// what needs the operator token, verb included (`listing replicas needs`).
pub(super) fn auth_hint(status: u16, base: &str, what: &str) -> Option<anyhow::Error> {
    match status {
        401 => Some(anyhow::anyhow!(
            "the server at {base} needs a token: pass --token or set VECTORSTEP_TOKEN to an operator token (auth.operators)"
        )),
        403 => Some(anyhow::anyhow!(
            "the server at {base} refused this token: {what} an operator token (auth.operators), not a team token"
        )),
        _ => None,
    }
}

pub(super) fn base_url(cli: &Cli, url: Option<&str>) -> anyhow::Result<String> {
    if let Some(u) = url {
        return Ok(u.trim_end_matches('/').to_string());
    }
    let config = load_config(&cli.config)?;
    let host = if config.server.host == "0.0.0.0" {
        "127.0.0.1".to_string()
    } else {
        config.server.host.clone()
    };
    Ok(format!("http://{host}:{}", config.server.port))
}

const APPROVALS: &str = "deciding and listing approvals need";

pub fn list(cli: &Cli, server: Server<'_>, as_json: bool) -> anyhow::Result<i32> {
    let base = base_url(cli, server.url)?;
    let rt = tokio::runtime::Runtime::new()?;
    let body: Value = rt.block_on(async {
        let resp = server
            .authorize(reqwest::Client::new().get(format!("{base}/approvals")))
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the server at {base}: {e}"))?;
        let status = resp.status().as_u16();
        if let Some(e) = auth_hint(status, &base, APPROVALS) {
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
    let list = body
        .get("approvals")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if list.is_empty() {
        println!("no pending approvals");
    }
    for a in list {
        let s = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        println!(
            "{}  {}  {}  deadline {}",
            s("token"),
            s("pipeline"),
            s("step"),
            s("deadline_at")
        );
        println!("    {}", s("message").replace('\n', "\n    "));
    }
    Ok(0)
}

pub fn decide(
    cli: &Cli,
    server: Server<'_>,
    token: &str,
    approve: bool,
    by: Option<&str>,
) -> anyhow::Result<i32> {
    let base = base_url(cli, server.url)?;
    let by = by
        .map(str::to_string)
        .unwrap_or_else(|| std::env::var("USER").unwrap_or_else(|_| "cli".into()));
    let rt = tokio::runtime::Runtime::new()?;
    let (status, body) = rt.block_on(async {
        let resp = server
            .authorize(reqwest::Client::new().post(format!("{base}/approvals/{token}")))
            .json(&json!({"decision": if approve { "approve" } else { "reject" }, "by": by}))
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the server at {base}: {e}"))?;
        let status = resp.status().as_u16();
        anyhow::Ok((status, resp.json::<Value>().await.unwrap_or(Value::Null)))
    })?;
    if let Some(e) = auth_hint(status, &base, APPROVALS) {
        return Err(e);
    }
    match status {
        200 => {
            // With an operator token the server records the operator, not `--by`.
            let by = body.get("by").and_then(Value::as_str).unwrap_or(&by);
            let verdict = if approve {
                ApprovalStatus::Approved
            } else {
                ApprovalStatus::Rejected
            };
            println!("{verdict} by {by}");
            Ok(0)
        }
        404 => anyhow::bail!("unknown approval token {token}"),
        409 => anyhow::bail!(
            "already decided: {}",
            body.get("detail").and_then(Value::as_str).unwrap_or("?")
        ),
        other => anyhow::bail!("server answered HTTP {other}: {body}"),
    }
}
