//! The fake peer: a real HTTP server on 127.0.0.1 that records every request and
//! answers (or holds it) as its rule says, so "exactly once" is an assertion and a
//! step is provably in flight when a crash test kills the process. [`FakeServer`]
//! and [`FakeLlm`] are the same peer answering from a script.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

use super::service::RUN_TIMEOUT;

/// A scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub content_type: &'static str,
    pub delay: Option<Duration>,
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::json(200, json!({"ok": true}))
    }

    pub fn json(status: u16, body: Value) -> Reply {
        Reply {
            status,
            body: body.to_string(),
            content_type: "application/json",
            delay: None,
        }
    }

    pub fn text(status: u16, body: &str) -> Reply {
        Reply {
            status,
            body: body.to_string(),
            content_type: "text/plain",
            delay: None,
        }
    }

    /// A 200 whose body is a step output.
    pub fn output(confidence: f64, summary: &str) -> Reply {
        Reply::json(
            200,
            json!({"confidence": confidence, "summary": summary, "next_step_context": ""}),
        )
    }

    /// A 200 OpenAI-style chat completion whose content is a confident step output.
    pub fn completion(prompt_tokens: u64, completion_tokens: u64) -> Reply {
        let content =
            json!({"confidence": 0.95, "summary": "looked into it", "next_step_context": ""});
        Reply::json(
            200,
            json!({
                "id": "chatcmpl-crash",
                "object": "chat.completion",
                "model": "fake-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content.to_string()}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}
            }),
        )
    }

    pub fn delayed(mut self, d: Duration) -> Reply {
        self.delay = Some(d);
        self
    }
}

/// What the peer does with one request.
#[derive(Debug, Clone)]
pub enum Answer {
    Reply(Reply),
    /// Answer once [`HoldingPeer::release`] has been called (at once if it was).
    Hold(Reply),
    /// Never answer; the request stays open until the client goes away.
    Never,
}

/// One request as the peer saw it. Header names are lower-case.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Position among all requests to this peer, from 0.
    pub seq: usize,
    /// Position among earlier requests with the same path, from 0.
    pub seq_path: usize,
    /// Position among earlier requests with the same `Idempotency-Key`, from 0.
    pub seq_key: usize,
    pub method: String,
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body: String,
    pub at: Instant,
    /// The peer sent its answer (a held request that never was stays false).
    pub answered: bool,
}

impl Seen {
    pub fn key(&self) -> &str {
        self.headers
            .get("idempotency-key")
            .map(String::as_str)
            .unwrap_or("")
    }

    /// A header by name, in any case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("request body is JSON")
    }

    /// `X-Vectorstep-Attempt`, 0 when absent.
    pub fn attempt(&self) -> u32 {
        self.headers
            .get("x-vectorstep-attempt")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0)
    }
}

type Rule = Arc<dyn Fn(&Seen) -> Answer + Send + Sync>;

struct PeerState {
    requests: Mutex<Vec<Seen>>,
    rule: Mutex<Rule>,
    arrived: tokio::sync::Notify,
    released: tokio::sync::watch::Sender<bool>,
}

/// An HTTP server on 127.0.0.1 that records every request and answers (or holds
/// it) as its rule says. Stopped when dropped.
pub struct HoldingPeer {
    addr: std::net::SocketAddr,
    state: Arc<PeerState>,
    task: tokio::task::JoinHandle<()>,
}

impl HoldingPeer {
    pub async fn start(rule: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> HoldingPeer {
        let (released, _) = tokio::sync::watch::channel(false);
        let state = Arc::new(PeerState {
            requests: Mutex::new(Vec::new()),
            rule: Mutex::new(Arc::new(rule)),
            arrived: tokio::sync::Notify::new(),
            released,
        });
        let app = Router::new().fallback(handle).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        HoldingPeer { addr, state, task }
    }

    /// A peer answering every request with `reply`.
    pub async fn answering(reply: Reply) -> HoldingPeer {
        HoldingPeer::start(move |_| Answer::Reply(reply.clone())).await
    }

    /// Replaces the rule for requests that arrive from now on.
    pub fn set_rule(&self, rule: impl Fn(&Seen) -> Answer + Send + Sync + 'static) {
        *self.state.rule.lock().unwrap() = Arc::new(rule);
    }

    /// The base URL, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Lets every held request (and every later [`Answer::Hold`]) answer.
    pub fn release(&self) {
        self.state.released.send_replace(true);
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.state.requests.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.state.requests.lock().unwrap().len()
    }

    pub fn count_path(&self, path: &str) -> usize {
        self.requests().iter().filter(|r| r.path == path).count()
    }

    pub fn for_path(&self, path: &str) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }

    pub fn for_key(&self, key: &str) -> Vec<Seen> {
        self.requests()
            .into_iter()
            .filter(|r| r.key() == key)
            .collect()
    }

    /// Requests grouped by `Idempotency-Key`, in arrival order.
    pub fn by_key(&self) -> BTreeMap<String, Vec<Seen>> {
        let mut m: BTreeMap<String, Vec<Seen>> = BTreeMap::new();
        for r in self.requests() {
            m.entry(r.key().to_string()).or_default().push(r);
        }
        m
    }

    pub fn answered_count(&self) -> usize {
        self.requests().iter().filter(|r| r.answered).count()
    }

    /// Waits until the peer has seen at least `n` requests in all.
    pub async fn wait_for_request(&self, n: usize) {
        self.wait_for(&format!("{n} request(s)"), |all| all.len() >= n)
            .await;
    }

    /// Waits until at least `n` requests to `path` arrived.
    pub async fn wait_for_path(&self, path: &str, n: usize) {
        self.wait_for(&format!("{n} request(s) to {path}"), |all| {
            all.iter().filter(|r| r.path == path).count() >= n
        })
        .await;
    }

    /// Waits (bounded by [`RUN_TIMEOUT`]) until `pred` holds over all requests seen.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&[Seen]) -> bool) {
        let deadline = tokio::time::Instant::now() + RUN_TIMEOUT;
        loop {
            let notified = self.state.arrived.notified();
            if pred(&self.state.requests.lock().unwrap()) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let seen: Vec<String> = self
                    .requests()
                    .iter()
                    .map(|r| {
                        format!(
                            "{} {} key={} attempt={}",
                            r.method,
                            r.path,
                            r.key(),
                            r.attempt()
                        )
                    })
                    .collect();
                panic!(
                    "peer {}: waited {RUN_TIMEOUT:?} for {what}; seen: {seen:#?}",
                    self.url()
                );
            }
        }
    }
}

impl Drop for HoldingPeer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    State(state): State<Arc<PeerState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (index, answer) = {
        let mut list = state.requests.lock().unwrap();
        let path = uri.path().to_string();
        let headers: BTreeMap<String, String> = headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let key = headers.get("idempotency-key").cloned().unwrap_or_default();
        let seen = Seen {
            seq: list.len(),
            seq_path: list.iter().filter(|r| r.path == path).count(),
            seq_key: list.iter().filter(|r| r.key() == key).count(),
            method: method.to_string(),
            path,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
            at: Instant::now(),
            answered: false,
        };
        let rule = state.rule.lock().unwrap().clone();
        let answer = rule(&seen);
        list.push(seen);
        (list.len() - 1, answer)
    };
    state.arrived.notify_waiters();
    let reply = match answer {
        Answer::Reply(r) => r,
        Answer::Hold(r) => {
            let mut rx = state.released.subscribe();
            let _ = rx.wait_for(|released| *released).await;
            r
        }
        Answer::Never => std::future::pending().await,
    };
    if let Some(d) = reply.delay {
        tokio::time::sleep(d).await;
    }
    state.requests.lock().unwrap()[index].answered = true;
    state.arrived.notify_waiters();
    let status = StatusCode::from_u16(reply.status).unwrap();
    (status, [("content-type", reply.content_type)], reply.body).into_response()
}

/// One request as a scripted peer saw it.
pub type Recorded = Seen;

/// A peer answering replies in order; the last one repeats once the script runs
/// out (`200 ok` when it is empty). Stopped when dropped.
pub struct FakeServer {
    peer: HoldingPeer,
}

impl FakeServer {
    pub async fn start(script: Vec<Reply>) -> FakeServer {
        let peer = HoldingPeer::start(move |seen| {
            Answer::Reply(
                script
                    .get(seen.seq)
                    .or(script.last())
                    .cloned()
                    .unwrap_or_else(|| Reply::text(200, "ok")),
            )
        })
        .await;
        FakeServer { peer }
    }

    /// The base URL, without a trailing slash.
    pub fn url(&self) -> String {
        self.peer.url()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.peer.requests()
    }

    pub fn count(&self) -> usize {
        self.peer.count()
    }
}

/// A fake OpenAI-compatible API: every chat completion answers `content` with the
/// given token usage.
pub struct FakeLlm {
    pub server: FakeServer,
}

impl FakeLlm {
    pub async fn start(content: &str, prompt_tokens: u64, completion_tokens: u64) -> FakeLlm {
        FakeLlm::with_replies(vec![completion(content, prompt_tokens, completion_tokens)]).await
    }

    pub async fn with_replies(replies: Vec<Reply>) -> FakeLlm {
        FakeLlm {
            server: FakeServer::start(replies).await,
        }
    }

    /// The provider `base_url` (the API root, e.g. `http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("{}/v1", self.server.url())
    }
}

/// A 200 chat completion carrying `content`.
pub fn completion(content: &str, prompt_tokens: u64, completion_tokens: u64) -> Reply {
    Reply::json(
        200,
        json!({
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": "fake-model",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop"
            }],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens
            }
        }),
    )
}
