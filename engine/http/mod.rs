//! The HTTP API (SPEC 2). The only module that imports axum. Handlers translate
//! requests into engine calls; a rejected request stores nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::runner::Engine;

mod approvals;
mod events;
mod forms;
mod intake;
mod page;
mod pipelines;
pub mod policy;
mod reload;
mod replay;
mod replicas;
mod runs;
mod secret;
pub mod server;
pub mod session;
mod ui;

pub use policy::{Principal, RouteClass};

/// Shared by every handler.
pub struct AppState {
    pub engine: Arc<Engine>,
    /// Set once the startup sweep has finished (`/readyz`).
    pub ready: AtomicBool,
    /// Cleared when shutdown begins: new runs are refused with 503.
    pub accepting: AtomicBool,
    /// Renders `/metrics`; `None` when no exporter is installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Signs the approval page's form (its CSRF token); loaded from, or first
    /// written to, the store.
    page_key: tokio::sync::OnceCell<[u8; 32]>,
    /// The runs list's counts by status, refreshed at most every few seconds.
    counts: ui::CountsCache,
    /// Store reads the events streams may make at once (`events::STREAM_READS`).
    stream_reads: tokio::sync::Semaphore,
}

impl AppState {
    pub fn new(
        engine: Arc<Engine>,
        metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    ) -> Arc<AppState> {
        Arc::new(AppState {
            engine,
            ready: AtomicBool::new(false),
            accepting: AtomicBool::new(true),
            metrics,
            page_key: tokio::sync::OnceCell::new(),
            stream_reads: tokio::sync::Semaphore::new(events::STREAM_READS),
            counts: ui::CountsCache::default(),
        })
    }

    /// The key behind the approval page's CSRF tokens and, derived from it, the
    /// UI's session cookies and form tokens: 32 random bytes kept in the store
    /// (`kv`), so they survive a restart and every replica shares them.
    pub async fn page_key(&self) -> Result<[u8; 32], ApiError> {
        const KEY: &str = "http.page_key";
        let store = &self.engine.store;
        let key = self
            .page_key
            .get_or_try_init(|| async {
                let parse = |hex: &str| -> Option<[u8; 32]> {
                    let bytes: Vec<u8> = (0..hex.len())
                        .step_by(2)
                        .filter_map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                        .collect();
                    bytes.try_into().ok()
                };
                if let Some(k) = store.kv(KEY)?.as_deref().and_then(parse) {
                    return Ok::<_, ApiError>(k);
                }
                let fresh: [u8; 32] = rand::random();
                let hex: String = fresh.iter().map(|b| format!("{b:02x}")).collect();
                store
                    .commit(vec![crate::store::Write::SetKv {
                        key: KEY.into(),
                        value: hex,
                    }])
                    .await?;
                Ok(fresh)
            })
            .await?;
        Ok(*key)
    }
}

/// An error answer: `{"error": ..., "detail": ...}` with a 4xx status.
pub struct ApiError {
    pub status: StatusCode,
    pub error: String,
    pub detail: Value,
}

impl ApiError {
    pub fn new(status: StatusCode, error: impl Into<String>) -> Self {
        ApiError {
            status,
            error: error.into(),
            detail: Value::Null,
        }
    }

    pub fn detail(mut self, detail: Value) -> Self {
        self.detail = detail;
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({"error": self.error, "detail": self.detail})),
        )
            .into_response()
    }
}

impl From<crate::store::Error> for ApiError {
    fn from(e: crate::store::Error) -> Self {
        tracing::error!(error = %e, "Store error while serving a request.");
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
            .detail(Value::from(e.to_string()))
    }
}

impl From<crate::runner::Error> for ApiError {
    fn from(e: crate::runner::Error) -> Self {
        tracing::error!(error = %e, "Engine error while serving a request.");
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "engine unavailable")
            .detail(Value::from(e.to_string()))
    }
}

/// One route: where, how, for whom. The router is built from [`routes`] only, so
/// a route cannot be served without a class.
pub struct Route {
    pub method: &'static str,
    /// The path as axum matches it (`:name` for a parameter).
    pub path: &'static str,
    pub class: RouteClass,
    handler: axum::routing::MethodRouter<Arc<AppState>>,
}

fn route(
    method: &'static str,
    path: &'static str,
    class: RouteClass,
    handler: axum::routing::MethodRouter<Arc<AppState>>,
) -> Route {
    Route {
        method,
        path,
        class,
        handler,
    }
}

/// Every route `serve` answers, with its access class (see `policy`).
pub fn routes() -> Vec<Route> {
    use RouteClass::*;
    vec![
        route("POST", "/webhook", Trigger, post(intake::webhook)),
        route(
            "POST",
            "/pipelines/:name/run",
            Trigger,
            post(intake::run_pipeline),
        ),
        route("GET", "/runs", Operator, get(runs::list)),
        route("GET", "/runs/:id", Operator, get(runs::show)),
        route("POST", "/runs/:id/cancel", Operator, post(runs::cancel)),
        route("POST", "/runs/:id/replay", Operator, post(replay::replay)),
        route("GET", "/runs/:id/events", Operator, get(events::stream)),
        route("GET", "/pipelines", Operator, get(pipelines::list)),
        route("GET", "/pipelines/:name", Operator, get(pipelines::show)),
        route("GET", "/approvals", Operator, get(approvals::list)),
        route("GET", "/replicas", Operator, get(replicas::list)),
        route("POST", "/-/reload", Operator, post(reload::reload)),
        route(
            "GET",
            "/approvals/:token",
            ApprovalLink,
            get(approvals::page),
        ),
        route(
            "POST",
            "/approvals/:token",
            ApprovalLink,
            post(approvals::decide),
        ),
        route("GET", "/metrics", Metrics, get(metrics)),
        route(
            "GET",
            "/healthz",
            Open,
            get(|| async { (StatusCode::OK, "ok") }),
        ),
        route("GET", "/readyz", Open, get(readyz)),
        route("GET", "/", Open, get(ui::root)),
        route("GET", "/favicon.ico", Open, get(ui::favicon)),
        route("GET", "/ui/static/:file", Open, get(ui::asset)),
        route("GET", "/ui", Ui, get(ui::runs)),
        route("GET", "/ui/runs/:id", Ui, get(ui::run)),
        route("GET", "/ui/pipelines", Ui, get(ui::pipelines)),
        route("GET", "/ui/pipelines/:name", Ui, get(ui::pipeline)),
        route("GET", "/ui/approvals", Ui, get(ui::approvals)),
        route("GET", "/ui/login", UiLogin, get(ui::login_form)),
        route("POST", "/ui/login", UiLogin, post(ui::login)),
        route("POST", "/ui/logout", Ui, post(ui::logout)),
    ]
}

pub fn router(state: Arc<AppState>) -> Router {
    let max_body = state.engine.config.server.max_body_bytes as usize;
    let mut router = Router::new();
    for r in routes() {
        let guard =
            axum::middleware::from_fn_with_state((state.clone(), r.class), policy::authorize);
        router = router.route(r.path, r.handler.route_layer(guard));
    }
    router
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn(log_request))
        .with_state(state)
}

async fn readyz(axum::extract::State(state): axum::extract::State<Arc<AppState>>) -> Response {
    if !state.ready.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: the startup sweep has not finished",
        )
            .into_response();
    }
    // Ready means able to take work: a store that cannot write would take none.
    match state.engine.store.unwritable() {
        None => (StatusCode::OK, "ready").into_response(),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
    }
}

async fn metrics(axum::extract::State(state): axum::extract::State<Arc<AppState>>) -> Response {
    match &state.metrics {
        Some(h) => (
            StatusCode::OK,
            [("content-type", "text/plain; version=0.0.4")],
            h.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metrics exporter not installed").into_response(),
    }
}

/// Logs every request with its method, path, status and latency; the path carries
/// the run id for run routes.
async fn log_request(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let started = std::time::Instant::now();
    let span = tracing::info_span!("http", %method, %path);
    let response = tracing::Instrument::instrument(next.run(req), span).await;
    let status = response.status().as_u16();
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if status >= 500 {
        tracing::warn!(%method, %path, status, ms, "HTTP request failed.");
    } else {
        tracing::debug!(%method, %path, status, ms, "HTTP request.");
    }
    response
}
