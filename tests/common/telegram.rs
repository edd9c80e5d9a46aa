//! A fake Telegram Bot API server on 127.0.0.1 that teloxide is pointed at through
//! `notifications.telegram.api_url`. It answers `POST /bot<token>/<method>`,
//! records every call with its parameters, queues updates for `getUpdates`
//! (honouring `offset` the way Telegram does: updates below it are confirmed and
//! dropped), and can be told to fail or hang the next calls of a method.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};

/// One Bot API call.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    pub token: String,
    pub params: Value,
    pub at: Instant,
}

/// What to do instead of answering normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// HTTP 500 with a Bot API error body.
    ServerError,
    /// Never answer (the client's timeout ends the call).
    Hang,
}

#[derive(Default)]
struct St {
    calls: Mutex<Vec<Call>>,
    updates: Mutex<Vec<Value>>,
    /// Updates below this id were confirmed by an `offset`.
    confirmed: AtomicI64,
    next_update_id: AtomicI64,
    next_message_id: AtomicI64,
    failures: Mutex<HashMap<String, VecDeque<Failure>>>,
    /// While set, every call is answered 502 and counted in `refused` instead of
    /// being recorded: an outage the client sees, leaving `calls` to what got through.
    down: std::sync::atomic::AtomicBool,
    refused: Mutex<HashMap<String, usize>>,
    arrived: tokio::sync::Notify,
    enqueued: tokio::sync::Notify,
    /// `getUpdates` requests being answered right now, and how many arrived while
    /// another was: Telegram answers those 409 Conflict.
    polling: AtomicI64,
    conflicts: AtomicI64,
}

/// Counts one `getUpdates` as in flight until dropped (also when its client
/// went away and the handler was cancelled).
struct Polling<'a>(&'a AtomicI64);

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The fake server; stopped when dropped.
pub struct FakeTelegram {
    addr: std::net::SocketAddr,
    st: Arc<St>,
    task: tokio::task::JoinHandle<()>,
}

pub const CHAT: i64 = -1001;

impl FakeTelegram {
    pub async fn start() -> FakeTelegram {
        let st = Arc::new(St::default());
        st.next_update_id.store(1000, Ordering::SeqCst);
        st.next_message_id.store(500, Ordering::SeqCst);
        let app = Router::new()
            .route("/:bot/:method", axum::routing::post(handle))
            .with_state(st.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeTelegram { addr, st, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `notifications.telegram` block pointing at this server.
    pub fn config(&self) -> String {
        format!(
            "notifications:\n  telegram: {{bot_token: \"123:fake\", chat_id: \"{CHAT}\", api_url: \"{}\"}}\n",
            self.url()
        )
    }

    pub fn calls(&self) -> Vec<Call> {
        self.st.calls.lock().unwrap().clone()
    }

    pub fn calls_of(&self, method: &str) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.method == method)
            .collect()
    }

    pub fn count(&self, method: &str) -> usize {
        self.calls_of(method).len()
    }

    /// The next `n` calls of `method` fail with `f`.
    pub fn fail_next(&self, method: &str, n: usize, f: Failure) {
        let mut m = self.st.failures.lock().unwrap();
        m.entry(method.to_string())
            .or_default()
            .extend(std::iter::repeat_n(f, n));
    }

    /// Starts (`true`) or ends an outage: meanwhile every call fails with HTTP 502.
    pub fn set_down(&self, down: bool) {
        self.st.down.store(down, Ordering::SeqCst);
    }

    /// How many calls of `method` the outage refused.
    /// How many `getUpdates` arrived while another was being answered (Telegram
    /// answers them 409: two pollers on one bot).
    pub fn conflicts(&self) -> i64 {
        self.st.conflicts.load(Ordering::SeqCst)
    }

    pub fn refused(&self, method: &str) -> usize {
        self.st
            .refused
            .lock()
            .unwrap()
            .get(method)
            .copied()
            .unwrap_or(0)
    }

    /// Waits until the outage refused at least `n` calls of `method`.
    pub async fn wait_refused(&self, method: &str, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(45);
        loop {
            let notified = self.st.arrived.notified();
            if self.refused(method) >= n {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "fake Telegram: waited for {n} refused {method} call(s), saw {}",
                    self.refused(method)
                );
            }
        }
    }

    /// Queues a button press on message `message_id` in `chat`; returns its update id.
    pub fn press(&self, user_id: u64, chat: i64, message_id: i64, data: &str) -> i64 {
        let id = self.st.next_update_id.fetch_add(1, Ordering::SeqCst);
        let update = json!({
            "update_id": id,
            "callback_query": {
                "id": format!("cbq-{id}"),
                "from": {"id": user_id, "is_bot": false, "first_name": format!("user{user_id}"),
                         "username": format!("user{user_id}")},
                "chat_instance": "ci-1",
                "message": message(chat, message_id, "approval"),
                "data": data,
            }
        });
        self.st.updates.lock().unwrap().push(update);
        self.st.enqueued.notify_waiters();
        id
    }

    /// The answer given to the press with update id `update_id`, once it arrives.
    pub async fn answer_to(&self, update_id: i64) -> String {
        let id = format!("cbq-{update_id}");
        let found = self
            .wait_for(&format!("answerCallbackQuery for {id}"), |calls| {
                calls.iter().any(|c| {
                    c.method == "answerCallbackQuery" && c.params["callback_query_id"] == id
                })
            })
            .await;
        found
            .into_iter()
            .find(|c| c.method == "answerCallbackQuery" && c.params["callback_query_id"] == id)
            .and_then(|c| c.params["text"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// Whether Telegram would still hand out this update (no offset confirmed it).
    pub fn unconfirmed(&self, update_id: i64) -> bool {
        update_id >= self.st.confirmed.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` calls of `method` arrived; returns them.
    pub async fn wait_calls(&self, method: &str, n: usize) -> Vec<Call> {
        self.wait_for(&format!("{n} {method} call(s)"), |calls| {
            calls.iter().filter(|c| c.method == method).count() >= n
        })
        .await;
        self.calls_of(method)
    }

    pub async fn wait_for(&self, what: &str, pred: impl Fn(&[Call]) -> bool) -> Vec<Call> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(45);
        loop {
            let notified = self.st.arrived.notified();
            {
                let calls = self.st.calls.lock().unwrap();
                if pred(&calls) {
                    return calls.clone();
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let seen: Vec<String> = self
                    .calls()
                    .iter()
                    .filter(|c| c.method != "getUpdates")
                    .map(|c| format!("{} {}", c.method, c.params))
                    .collect();
                panic!("fake Telegram: waited for {what}; calls (without getUpdates): {seen:#?}");
            }
        }
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn message(chat: i64, message_id: i64, text: &str) -> Value {
    let date = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(1);
    json!({
        "message_id": message_id,
        "date": date,
        "chat": {"id": chat, "type": "supergroup", "title": "ops"},
        "from": {"id": 1, "is_bot": true, "first_name": "vectorstep-bot", "username": "vs_bot"},
        "text": text,
    })
}

fn params_of(headers: &HeaderMap, body: &Bytes) -> Value {
    let form = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    if form {
        let pairs: serde_json::Map<String, Value> = String::from_utf8_lossy(body)
            .split('&')
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_string(), Value::from(v.replace('+', " "))))
            .collect();
        return Value::Object(pairs);
    }
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

fn canonical(method: &str) -> String {
    const KNOWN: &[&str] = &[
        "sendMessage",
        "editMessageText",
        "answerCallbackQuery",
        "getUpdates",
        "deleteWebhook",
        "getMe",
    ];
    KNOWN
        .iter()
        .find(|k| k.eq_ignore_ascii_case(method))
        .map(|k| k.to_string())
        .unwrap_or_else(|| method.to_string())
}

fn ok(result: Value) -> Response {
    (
        StatusCode::OK,
        axum::Json(json!({"ok": true, "result": result})),
    )
        .into_response()
}

async fn handle(
    State(st): State<Arc<St>>,
    Path((bot, method)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let params = params_of(&headers, &body);
    let token = bot.strip_prefix("bot").unwrap_or("").to_string();
    // Bot API method names are case-insensitive (teloxide sends `SendMessage`);
    // calls are recorded under the documented spelling.
    let method = canonical(&method);
    if st.down.load(Ordering::SeqCst) {
        *st.refused.lock().unwrap().entry(method).or_default() += 1;
        st.arrived.notify_waiters();
        let body = json!({"ok": false, "error_code": 502, "description": "Bad Gateway"});
        return (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response();
    }
    st.calls.lock().unwrap().push(Call {
        method: method.clone(),
        token,
        params: params.clone(),
        at: Instant::now(),
    });
    st.arrived.notify_waiters();
    let failure = st
        .failures
        .lock()
        .unwrap()
        .get_mut(&method)
        .and_then(VecDeque::pop_front);
    match failure {
        Some(Failure::ServerError) => {
            let body =
                json!({"ok": false, "error_code": 500, "description": "Internal Server Error"});
            return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response();
        }
        Some(Failure::Hang) => std::future::pending::<()>().await,
        None => {}
    }
    match method.as_str() {
        // Like Telegram, refuse HTML it cannot parse.
        "sendMessage" | "editMessageText"
            if params["parse_mode"] == "HTML"
                && params["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("<none>")) =>
        {
            let description = "Bad Request: can't parse entities: Unsupported start tag \"none\" at byte offset 0";
            let body = json!({"ok": false, "error_code": 400, "description": description});
            (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
        }
        "sendMessage" => {
            let id = st.next_message_id.fetch_add(1, Ordering::SeqCst);
            let chat = params["chat_id"].as_i64().unwrap_or(CHAT);
            let mut m = message(chat, id, params["text"].as_str().unwrap_or(""));
            m["reply_markup"] = params["reply_markup"].clone();
            ok(m)
        }
        "editMessageText" => {
            let chat = params["chat_id"].as_i64().unwrap_or(CHAT);
            let id = params["message_id"].as_i64().unwrap_or(0);
            ok(message(chat, id, params["text"].as_str().unwrap_or("")))
        }
        "answerCallbackQuery" | "deleteWebhook" => ok(json!(true)),
        "getUpdates" => {
            let _polling = Polling(&st.polling);
            if st.polling.fetch_add(1, Ordering::SeqCst) > 0 {
                st.conflicts.fetch_add(1, Ordering::SeqCst);
                let description =
                    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running";
                let body = json!({"ok": false, "error_code": 409, "description": description});
                return (StatusCode::CONFLICT, axum::Json(body)).into_response();
            }
            ok(Value::Array(updates(&st, &params).await))
        }
        _ => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"ok": false, "error_code": 404, "description": "Not Found"})),
        )
            .into_response(),
    }
}

/// Telegram's rule: an `offset` confirms every update below it; the answer holds
/// the updates from the offset on, or waits (here at most 1 s) for one to arrive.
async fn updates(st: &St, params: &Value) -> Vec<Value> {
    if let Some(o) = params["offset"].as_i64() {
        st.confirmed.fetch_max(o, Ordering::SeqCst);
    }
    let hold = Duration::from_secs(params["timeout"].as_u64().unwrap_or(0).min(1));
    let deadline = tokio::time::Instant::now() + hold;
    loop {
        let notified = st.enqueued.notified();
        let confirmed = st.confirmed.load(Ordering::SeqCst);
        let list: Vec<Value> = {
            let mut q = st.updates.lock().unwrap();
            q.retain(|u| u["update_id"].as_i64().unwrap_or(0) >= confirmed);
            q.clone()
        };
        if !list.is_empty() || tokio::time::timeout_at(deadline, notified).await.is_err() {
            return list;
        }
    }
}
