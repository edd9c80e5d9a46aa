//! Fake peers for integration tests: real HTTP servers on 127.0.0.1 that record
//! every request and answer from a script, so "exactly once" is an assertion.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use vectorstep::executor::Call;
use vectorstep::pipeline::template::Template;
use vectorstep::pipeline::{Action, ExecutorConfig, ExecutorKind};

/// One request as the fake peer saw it. Header names are lower-case.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("request body is JSON")
    }
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub content_type: &'static str,
    pub delay: Option<Duration>,
}

impl Reply {
    pub fn text(status: u16, body: &str) -> Reply {
        Reply {
            status,
            body: body.to_string(),
            content_type: "text/plain",
            delay: None,
        }
    }

    pub fn json(status: u16, body: Value) -> Reply {
        Reply {
            status,
            body: body.to_string(),
            content_type: "application/json",
            delay: None,
        }
    }

    pub fn delayed(mut self, d: Duration) -> Reply {
        self.delay = Some(d);
        self
    }
}

#[derive(Default)]
struct Shared {
    requests: Vec<Recorded>,
    script: Vec<Reply>,
}

/// An HTTP server answering replies in order; the last one repeats once the
/// script runs out. Stopped when dropped.
pub struct FakeServer {
    addr: std::net::SocketAddr,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeServer {
    pub async fn start(script: Vec<Reply>) -> FakeServer {
        let shared = Arc::new(Mutex::new(Shared {
            requests: Vec::new(),
            script,
        }));
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeServer { addr, shared, task }
    }

    /// The base URL, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().unwrap().requests.clone()
    }

    pub fn count(&self) -> usize {
        self.shared.lock().unwrap().requests.len()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    State(shared): State<Arc<Mutex<Shared>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let reply = {
        let mut s = shared.lock().unwrap();
        let n = s.requests.len();
        s.requests.push(Recorded {
            method: method.to_string(),
            path: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
            headers: headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        s.script
            .get(n)
            .or(s.script.last())
            .cloned()
            .unwrap_or_else(|| Reply::text(200, "ok"))
    };
    if let Some(d) = reply.delay {
        tokio::time::sleep(d).await;
    }
    let status = StatusCode::from_u16(reply.status).unwrap();
    (status, [("content-type", reply.content_type)], reply.body).into_response()
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

/// An action as the pipeline loader would build it, without templates.
pub fn action(kind: ExecutorKind, name: &str, config: Value) -> Action {
    Action {
        executor_name: name.to_string(),
        executor: kind,
        config: ExecutorConfig::from_json(kind, &config).expect("a valid executor_config"),
        agent: None,
        prompt: Template::empty(),
        config_templates: Vec::new(),
        timeout_seconds: None,
    }
}

/// A first attempt of step `check` in run `run-1`.
pub fn call<'a>(action: &'a Action, prompt: &str) -> Call<'a> {
    Call {
        run_id: "run-1",
        pipeline: "test-pipeline",
        step_path: "check",
        idempotency_key: "run-1:check:1",
        attempt: 1,
        action,
        prompt: prompt.to_string(),
        rendered: BTreeMap::new(),
        timeout: None,
    }
}
