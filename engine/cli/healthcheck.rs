//! `vectorstep healthcheck [--url URL]`: one `GET {url}/readyz`, exit 0 on 200 and 1
//! otherwise with the reason on one line of stderr. Made for a container's
//! `HEALTHCHECK` (the image has no curl), so it needs no config file: without
//! `--url` / `$VECTORSTEP_URL` it asks the configured `server.host:server.port`
//! when the config file exists, else `http://127.0.0.1:8000`.

use std::time::Duration;

use super::Cli;

/// The whole check, connection included, must answer within this.
const TIMEOUT: Duration = Duration::from_secs(3);
/// The server's default address, for when there is no config file to read it from.
const DEFAULT_URL: &str = "http://127.0.0.1:8000";
/// At most this much of an answer's body goes into the reason.
const MAX_BODY_CHARS: usize = 300;

pub fn check(cli: &Cli, url: Option<&str>) -> anyhow::Result<i32> {
    let base = match url {
        Some(_) => super::approvals::base_url(cli, url)?,
        None if cli.config.exists() => super::approvals::base_url(cli, None)?,
        None => DEFAULT_URL.to_string(),
    };
    let target = format!("{base}/readyz");
    // The probe is of a server on this host (or the one named): no proxy from the
    // environment stands in between.
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT)
        .no_proxy()
        .build()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let answer = rt.block_on(async {
        let resp = client.get(&target).send().await?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        Ok::<_, reqwest::Error>((status, body))
    });
    match answer {
        Ok((status, _)) if status == reqwest::StatusCode::OK => {
            println!("ready: {target} answered 200");
            Ok(0)
        }
        Ok((status, body)) => {
            eprintln!(
                "not ready: {target} answered HTTP {}: {}",
                status.as_u16(),
                one_line(&body)
            );
            Ok(1)
        }
        Err(e) => {
            eprintln!("not ready: cannot reach {target}: {}", error_chain(&e));
            Ok(1)
        }
    }
}

/// `body` on one line, cut to [`MAX_BODY_CHARS`].
fn one_line(body: &str) -> String {
    let flat = flatten(body);
    if flat.is_empty() {
        return "(empty body)".into();
    }
    match flat.char_indices().nth(MAX_BODY_CHARS) {
        Some((cut, _)) => format!("{}...", &flat[..cut]),
        None => flat,
    }
}

/// `text` with every run of whitespace, newlines included, as one space.
fn flatten(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The error and its causes (`connection refused` is in a source, not in the
/// top-level message), each once.
fn error_chain(e: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = next {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    if e.is_timeout() {
        parts.push(format!("no answer within {} s", TIMEOUT.as_secs()));
    }
    flatten(&parts.join(": "))
}

#[cfg(test)]
mod tests {
    #[test]
    fn bodies_become_one_bounded_line() {
        assert_eq!(super::one_line("a\n  b\tc\n"), "a b c");
        assert_eq!(super::one_line(" \n"), "(empty body)");
        let long = "é".repeat(400);
        let cut = super::one_line(&long);
        assert!(cut.ends_with("...") && cut.chars().count() == super::MAX_BODY_CHARS + 3);
    }
}
