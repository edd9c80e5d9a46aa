//! HTTP plumbing shared by the `webhook`, `agent` and `notify` executors.
//!
//! One [`reqwest::Client`] is built per service instance so connections are pooled.
//! Every side-effecting request carries the call's idempotency key and attempt
//! (SPEC 4), bodies are read with a size cap so a misbehaving peer cannot exhaust
//! memory, and error messages never contain a full URL: webhook and Telegram URLs
//! often embed secrets in their path or query.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{RequestBuilder, StatusCode};

use super::{Call, Error};

/// The largest response body kept; the rest is discarded.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// How long establishing a connection may take, whatever the request timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How many characters of a peer's answer an error message quotes.
pub const EXCERPT_CHARS: usize = 500;

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const ATTEMPT: &str = "x-vectorstep-attempt";
pub const REPLICA: &str = "x-vectorstep-replica";

/// This process's replica id, on a shared store (see [`set_replica`]).
static REPLICA_ID: std::sync::OnceLock<HeaderValue> = std::sync::OnceLock::new();

/// Names this process's replica in every effect request from now on
/// (`X-Vectorstep-Replica`), so a peer or a proxy log can tell which replica sent
/// a request (a resend after a takeover comes from the adopter). Set once, by a
/// replica on a shared store; a single process sends no such header.
pub fn set_replica(id: &str) {
    if let Ok(v) = HeaderValue::from_str(id) {
        let _ = REPLICA_ID.set(v);
    }
}

/// The client shared by all HTTP executors. There is no overall timeout here:
/// each request sets its own from the step and executor configuration.
pub fn client() -> reqwest::Client {
    let built = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("vectorstep/", env!("CARGO_PKG_VERSION")))
        .build();
    match built {
        Ok(c) => c,
        Err(e) => {
            // Only a broken TLS backend makes the builder fail; the default client
            // still works for plain HTTP, so degrade instead of refusing to start.
            tracing::warn!(error = %e, "Cannot build the HTTP client; using defaults.");
            reqwest::Client::new()
        }
    }
}

/// `Idempotency-Key` and `X-Vectorstep-Attempt` for `call`.
pub fn call_headers(call: &Call<'_>) -> HeaderMap {
    effect_headers(call.idempotency_key, call.attempt)
}

/// `Idempotency-Key: key` and `X-Vectorstep-Attempt: attempt`, for any call with
/// an effect key (a step's, or a tool call's), and `X-Vectorstep-Replica` from a
/// replica.
pub fn effect_headers(key: &str, attempt: u32) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(HeaderName::from_static(IDEMPOTENCY_KEY), header_value(key));
    h.insert(HeaderName::from_static(ATTEMPT), HeaderValue::from(attempt));
    h.extend(replica_header());
    h
}

/// `X-Vectorstep-Replica` of this process, if it is a replica.
pub fn replica_header() -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(replica) = REPLICA_ID.get() {
        h.insert(HeaderName::from_static(REPLICA), replica.clone());
    }
    h
}

/// A header value for arbitrary text. Should a step path hold a control character
/// a header cannot carry, the key is percent-encoded rather than failing the call.
fn header_value(text: &str) -> HeaderValue {
    if let Ok(v) = HeaderValue::from_str(text) {
        return v;
    }
    let mut s = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x21..0x7f).contains(&b) && b != b'%' {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static("invalid"))
}

/// The shorter of an executor's own timeout and the step's, if either is set.
/// The call's URL: the rendered `url` template, else `raw`, the configured `url`
/// (so an executor also works when called directly, without the runner rendering).
pub fn target_url(call: &Call<'_>, raw: Option<&str>, who: &str) -> Result<String, Error> {
    match (call.rendered.get("url"), raw) {
        (Some(u), _) => Ok(u.clone()),
        (None, Some(u)) => Ok(u.to_string()),
        (None, None) => Err(Error::Config(format!("{who} needs `executor_config.url`"))),
    }
}

pub fn shortest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `timeout_seconds` as a duration; non-positive or absurd values are ignored.
pub fn seconds(v: Option<f64>) -> Option<Duration> {
    v.filter(|s| s.is_finite() && *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
}

/// A peer's answer with its body read up to [`MAX_BODY_BYTES`].
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub body: String,
    pub truncated: bool,
}

impl Reply {
    pub fn is_success(&self) -> bool {
        self.status.is_success()
    }

    pub fn excerpt(&self) -> String {
        excerpt(&self.body, EXCERPT_CHARS)
    }
}

/// The default bound on requests in flight to one peer (`scheme://host:port`).
pub const DEFAULT_MAX_CONNECTIONS_PER_HOST: usize = 32;

/// Requests in flight per peer, process-wide: with a permit held from sending until
/// the answer is read, a peer never has more sockets from this process than the
/// bound (the pool reuses them), however many runs call it at once. 5,000 runs
/// against one webhook target used to open 5,000 sockets.
struct PeerLimits {
    per_host: std::sync::atomic::AtomicUsize,
    peers: std::sync::Mutex<
        std::collections::BTreeMap<String, std::sync::Arc<tokio::sync::Semaphore>>,
    >,
}

static PEERS: PeerLimits = PeerLimits {
    per_host: std::sync::atomic::AtomicUsize::new(DEFAULT_MAX_CONNECTIONS_PER_HOST),
    peers: std::sync::Mutex::new(std::collections::BTreeMap::new()),
};

/// Sets the per-peer bound (`concurrency.max_connections_per_host`) for peers not
/// yet called; called once at start.
pub fn set_max_connections_per_host(n: usize) {
    PEERS
        .per_host
        .store(n.max(1), std::sync::atomic::Ordering::SeqCst);
}

fn peer_semaphore(url: &str) -> std::sync::Arc<tokio::sync::Semaphore> {
    let key = redact(url);
    let mut peers = match PEERS.peers.lock() {
        Ok(p) => p,
        Err(p) => p.into_inner(),
    };
    peers
        .entry(key)
        .or_insert_with(|| {
            std::sync::Arc::new(tokio::sync::Semaphore::new(
                PEERS.per_host.load(std::sync::atomic::Ordering::SeqCst),
            ))
        })
        .clone()
}

/// Sends `req` and reads the answer. `what` names the call in error messages
/// (`webhook POST`), `url` is shown without its path or query. Waits for a free
/// connection to the peer first (see [`PeerLimits`]); the request's own timeout
/// starts once it is sent.
pub async fn send(req: RequestBuilder, what: &str, url: &str) -> Result<Reply, Error> {
    let fail =
        |e: reqwest::Error| Error::Transport(format!("{what} to {}: {}", redact(url), describe(e)));
    let semaphore = peer_semaphore(url);
    let _permit = semaphore.acquire_owned().await.map_err(|_| {
        Error::Transport(format!(
            "{what} to {}: the client is shutting down",
            redact(url)
        ))
    })?;
    let mut resp = req.send().await.map_err(fail)?;
    let status = resp.status();
    let mut bytes = Vec::new();
    let mut truncated = false;
    while let Some(chunk) = resp.chunk().await.map_err(fail)? {
        let room = MAX_BODY_BYTES.saturating_sub(bytes.len());
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            truncated = true;
            // Stop reading: the connection is dropped instead of draining a huge body.
            break;
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Reply {
        status,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        truncated,
    })
}

/// The error and its causes on one line, without the URL reqwest would print.
fn describe(e: reqwest::Error) -> String {
    if e.is_timeout() {
        return "timed out".into();
    }
    let e = e.without_url();
    let mut parts = vec![e.to_string()];
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let text = s.to_string();
        // hyper and the OS often repeat the same cause at two levels.
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// `scheme://host[:port]`: enough to tell which peer failed, without the path or
/// query where webhook URLs and bot tokens keep their secrets.
pub fn redact(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => {
            let host = u.host_str().unwrap_or("?");
            match u.port() {
                Some(p) => format!("{}://{host}:{p}", u.scheme()),
                None => format!("{}://{host}", u.scheme()),
            }
        }
        Err(_) => "an invalid URL".into(),
    }
}

/// The first `max` characters of `text`, trimmed, marked when cut.
pub fn excerpt(text: &str, max: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// The last `max` characters of `text`, trimmed: where a failing command usually
/// says what went wrong.
pub fn tail(text: &str, max: usize) -> String {
    let text = text.trim();
    let count = text.chars().count();
    if count <= max {
        return text.to_string();
    }
    match text.char_indices().nth(count - max) {
        Some((i, _)) => format!("…{}", &text[i..]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_keeps_only_scheme_host_and_port() {
        let cases = [
            (
                "https://api.telegram.org/bot123:SECRET/sendMessage",
                "https://api.telegram.org",
            ),
            (
                "http://127.0.0.1:8080/hooks/T0/B0/XYZ?token=s",
                "http://127.0.0.1:8080",
            ),
            ("not a url", "an invalid URL"),
        ];
        for (input, want) in cases {
            assert_eq!(redact(input), want, "{input}");
        }
    }

    #[test]
    fn excerpts_cut_on_char_boundaries() {
        assert_eq!(excerpt("  héllo  ", 10), "héllo");
        assert_eq!(excerpt("héllo", 2), "hé…");
        assert_eq!(tail("héllo", 2), "…lo");
        assert_eq!(tail("ab", 5), "ab");
    }

    #[test]
    fn header_values_never_fail() {
        assert_eq!(header_value("run:step:1"), "run:step:1");
        // Non-ASCII is legal (if unusual) in a header; control characters are not.
        assert_eq!(
            header_value("run:stép 1").as_bytes(),
            "run:stép 1".as_bytes()
        );
        assert_eq!(header_value("run:a\nb"), "run:a%0Ab");
    }

    #[test]
    fn shortest_timeout_wins() {
        let s = Duration::from_secs;
        assert_eq!(shortest(Some(s(5)), Some(s(3))), Some(s(3)));
        assert_eq!(shortest(None, Some(s(3))), Some(s(3)));
        assert_eq!(shortest(Some(s(5)), None), Some(s(5)));
        assert_eq!(shortest(None, None), None);
        assert_eq!(seconds(Some(-1.0)), None);
        assert_eq!(seconds(Some(f64::INFINITY)), None);
        assert_eq!(seconds(Some(1.5)), Some(Duration::from_millis(1500)));
    }
}
