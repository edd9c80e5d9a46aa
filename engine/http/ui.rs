//! The web UI's routes (SPEC 12): read the store, hand `ui::views` the records,
//! answer the rendered page with headers that keep it to this origin. The token
//! form signs an operator in (`session`); the policy middleware has already
//! checked who may see a page and every POST's CSRF token.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Extension;
use serde_json::{json, Value};

use super::session::{self, Session};
use super::{ApiError, AppState, Principal};
use crate::domain::ApprovalStatus;
use crate::store::{RunCursor, RunQuery};
use crate::ui::views::{self, Frame, ListFilters, PendingApproval};

/// How long the runs list's counts by status may be old: counting is the one
/// part of the list whose cost grows with the store, so it is refreshed off the
/// request path at most this often.
const COUNTS_MAX_AGE: Duration = Duration::from_secs(3);
const PAGE_SIZE: u32 = 50;
const RECENT_RUNS: u32 = 50;

/// Runs by status, `(status, count)`.
type Counts = Vec<(String, u64)>;

/// The counts and when they were read (`None` before the first read), and
/// whether a refresh is under way.
type CountsState = (Option<(Instant, Counts)>, bool);

/// The counts of the runs list, kept between requests.
#[derive(Default)]
pub struct CountsCache {
    inner: std::sync::Mutex<CountsState>,
}

impl CountsCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, CountsState> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// Every UI page's headers: nothing from another origin, no framing, no caching.
fn page(status: StatusCode, html: String) -> Response {
    let mut r = (status, Html(html)).into_response();
    let h = r.headers_mut();
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    r
}

fn rendered(template: &str, context: &Value) -> Response {
    match crate::ui::render(template, context) {
        Ok(html) => page(StatusCode::OK, html),
        Err(e) => {
            tracing::error!(error = %e, "A UI page failed to render.");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page failed to render",
            )
                .into_response()
        }
    }
}

/// A page with a title and a message (refusals, confirmations).
pub fn refused_page(status: StatusCode, title: &str, message: &str) -> Response {
    let ctx = json!({"frame": {"csrf": "", "operator": null}, "title": title, "message": message, "back": "/ui"});
    match crate::ui::render("message.html", &ctx) {
        Ok(html) => page(status, html),
        Err(_) => (status, message.to_string()).into_response(),
    }
}

fn see_other(location: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        r.headers_mut().insert("location", v);
    }
    r
}

async fn frame(state: &AppState, who: &Principal, s: Option<&Session>) -> Result<Frame, ApiError> {
    let key = state.page_key().await?;
    Ok(Frame {
        csrf: s
            .map(|s| session::csrf_token(&key, &s.value))
            .unwrap_or_default(),
        operator: who.operator().map(str::to_string),
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, crate::store::Error> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?
        .map_err(ApiError::from)
}

/// `2026-12-03T08:00` (a form's local time, read as UTC) or RFC 3339.
fn parse_time(s: &str) -> Option<i64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_millis());
    }
    for fmt in ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, fmt) {
            return Some(t.and_utc().timestamp_millis());
        }
    }
    None
}

async fn counts(state: &Arc<AppState>) -> Result<Vec<(String, u64)>, ApiError> {
    let (cached, refresh) = {
        let mut g = state.counts.lock();
        let fresh =
            g.0.as_ref()
                .is_some_and(|(at, _)| at.elapsed() < COUNTS_MAX_AGE);
        let refresh = !fresh && !g.1 && g.0.is_some();
        if refresh {
            g.1 = true;
        }
        (g.0.as_ref().map(|(_, c)| c.clone()), refresh)
    };
    match cached {
        Some(c) => {
            if refresh {
                let state = state.clone();
                tokio::task::spawn_blocking(move || {
                    let result = state.engine.store.count_runs_by_status();
                    let mut g = state.counts.lock();
                    if let Ok(c) = result {
                        g.0 = Some((Instant::now(), c));
                    }
                    g.1 = false;
                });
            }
            Ok(c)
        }
        None => {
            let store = state.engine.store.clone();
            let c = blocking(move || store.count_runs_by_status()).await?;
            state.counts.lock().0 = Some((Instant::now(), c.clone()));
            Ok(c)
        }
    }
}

/// `GET /ui`: the runs list.
pub async fn runs(
    State(state): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    s: Option<Extension<Session>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let get = |k: &str| q.get(k).map(|v| v.trim().to_string()).unwrap_or_default();
    let filters = ListFilters {
        status: get("status"),
        pipeline: get("pipeline"),
        team: get("team"),
        since: get("since"),
        until: get("until"),
        q: get("q"),
    };
    let after = q.get("after").and_then(|c| RunCursor::parse(c));
    let first_page = after.is_none();
    let query = RunQuery {
        status: Some(filters.status.clone()).filter(|s| !s.is_empty()),
        pipeline: Some(filters.pipeline.clone()).filter(|s| !s.is_empty()),
        team: Some(filters.team.clone()).filter(|s| !s.is_empty()),
        since: parse_time(&filters.since),
        until: parse_time(&filters.until),
        search: Some(filters.q.clone()).filter(|s| !s.is_empty()),
        after,
        limit: PAGE_SIZE + 1,
    };
    let store = state.engine.store.clone();
    let mut page_runs = blocking(move || store.runs_page(&query)).await?;
    let next = if page_runs.len() > PAGE_SIZE as usize {
        page_runs.truncate(PAGE_SIZE as usize);
        page_runs.last().map(|r| {
            RunCursor {
                triggered_at: r.triggered_at,
                id: r.id.clone(),
            }
            .encode()
        })
    } else {
        None
    };
    let counts = counts(&state).await?;
    let pipelines: Vec<String> = state
        .engine
        .pipelines()
        .pipelines
        .iter()
        .map(|p| p.name.clone())
        .collect();
    let frame = frame(&state, &who, s.as_deref()).await?;
    let now = state.engine.now_ms();
    Ok(rendered(
        "runs.html",
        &views::runs_page(
            &frame,
            &page_runs,
            &counts,
            &filters,
            next.map(|n| crate::ui::query_value(&n)),
            first_page,
            &pipelines,
            now,
        ),
    ))
}

async fn pending_of(
    state: &AppState,
    approvals: Vec<crate::store::ApprovalRecord>,
    now: i64,
) -> Result<Vec<PendingApproval>, ApiError> {
    let mut out = Vec::new();
    for a in approvals
        .into_iter()
        .filter(|a| a.status == ApprovalStatus::Pending)
    {
        let csrf = super::approvals::csrf_token(state, &a.token).await?;
        out.push(PendingApproval::of(&a, csrf, now));
    }
    Ok(out)
}

/// `GET /ui/runs/{id}`.
pub async fn run(
    State(state): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    s: Option<Extension<Session>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let store = state.engine.store.clone();
    let run_id = id.clone();
    let found = blocking(move || {
        let Some(run) = store.run(&run_id)? else {
            return Ok(None);
        };
        let steps = store.steps(&run_id)?;
        let events = store.events(&run_id)?;
        let journals = store.journals_of_run(&run_id)?;
        let approvals = store.approvals_of_run(&run_id)?;
        Ok(Some((run, steps, events, journals, approvals)))
    })
    .await?;
    let frame = frame(&state, &who, s.as_deref()).await?;
    let Some((run, steps, events, journals, approvals)) = found else {
        return Ok(not_found(&frame, "No run has this id."));
    };
    let now = state.engine.now_ms();
    let pipeline = state.engine.pipeline(&run.pipeline_name);
    let pending = pending_of(&state, approvals, now).await?;
    let mut ctx = views::run_page(
        &frame,
        &views::RunPage {
            run: &run,
            steps: &steps,
            events: &events,
            journals: &journals,
            approvals: pending,
            pipeline: pipeline.as_deref(),
            replays: &[],
            now,
        },
    );
    ctx["return_to"] = Value::from(format!("/ui/runs/{}", crate::ui::path_segment(&run.id)));
    Ok(rendered("run.html", &ctx))
}

fn not_found(frame: &Frame, message: &str) -> Response {
    let ctx = json!({"frame": frame, "title": "Not found", "message": message, "back": "/ui"});
    match crate::ui::render("message.html", &ctx) {
        Ok(html) => page(StatusCode::NOT_FOUND, html),
        Err(_) => (StatusCode::NOT_FOUND, message.to_string()).into_response(),
    }
}

fn next_tick(p: &crate::pipeline::model::Pipeline, now: i64) -> Option<i64> {
    let cron = &p.schedule.as_ref()?.cron;
    let after = chrono::DateTime::from_timestamp_millis(now)?;
    crate::runner::schedule::next_tick(cron, after).map(|t| t.timestamp_millis())
}

/// `GET /ui/pipelines`.
pub async fn pipelines(
    State(state): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    s: Option<Extension<Session>>,
) -> Result<Response, ApiError> {
    let set = state.engine.pipelines();
    let names: Vec<String> = set.pipelines.iter().map(|p| p.name.clone()).collect();
    let store = state.engine.store.clone();
    let recent = blocking(move || {
        names
            .iter()
            .map(|n| {
                store.runs_page(&RunQuery {
                    pipeline: Some(n.clone()),
                    limit: RECENT_RUNS,
                    ..RunQuery::default()
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    let now = state.engine.now_ms();
    let rows = set
        .pipelines
        .iter()
        .zip(recent)
        .map(|(p, runs)| {
            (
                views::pipeline_facts(p, next_tick(p, now), now),
                views::recent_stats(&runs),
            )
        })
        .collect();
    let frame = frame(&state, &who, s.as_deref()).await?;
    Ok(rendered(
        "pipelines.html",
        &views::pipelines_page(&frame, rows),
    ))
}

/// `GET /ui/pipelines/{name}`.
pub async fn pipeline(
    State(state): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    s: Option<Extension<Session>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let frame = frame(&state, &who, s.as_deref()).await?;
    let Some(p) = state.engine.pipeline(&name) else {
        return Ok(not_found(&frame, "No pipeline of this name is loaded."));
    };
    let store = state.engine.store.clone();
    let recent = blocking(move || {
        store.runs_page(&RunQuery {
            pipeline: Some(name),
            limit: RECENT_RUNS,
            ..RunQuery::default()
        })
    })
    .await?;
    let now = state.engine.now_ms();
    Ok(rendered(
        "pipeline.html",
        &views::pipeline_page(&frame, &p, next_tick(&p, now), &recent, now),
    ))
}

/// `GET /ui/approvals`.
pub async fn approvals(
    State(state): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    s: Option<Extension<Session>>,
) -> Result<Response, ApiError> {
    let pending = state
        .engine
        .store
        .approvals_with_status(ApprovalStatus::Pending)?;
    let now = state.engine.now_ms();
    let list = pending_of(&state, pending, now).await?;
    let frame = frame(&state, &who, s.as_deref()).await?;
    let mut ctx = views::approvals_page(&frame, list);
    ctx["return_to"] = Value::from("/ui/approvals");
    Ok(rendered("approvals.html", &ctx))
}

/// `GET /ui/login`: the token form.
pub async fn login_form(
    State(state): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    s: Option<Extension<Session>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let next = session::safe_next(q.get("next").map(String::as_str));
    if !state.engine.config.auth_enabled() {
        // Nothing to sign in to: the UI is open.
        return Ok(see_other(&next));
    }
    let frame = frame(&state, &who, s.as_deref()).await?;
    Ok(rendered(
        "login.html",
        &json!({"frame": frame, "title": "Sign in", "next": next, "error": null}),
    ))
}

/// `POST /ui/login`: checks the operator token once and sets the session cookie.
pub async fn login(
    State(state): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    s: Option<Extension<Session>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let token = super::forms::field(&body, "token").unwrap_or_default();
    let next = session::safe_next(super::forms::field(&body, "next").as_deref());
    let config = &state.engine.config;
    let Some(op) = super::policy::operator_with_token(config, token.trim()) else {
        tracing::warn!("A sign-in to the web UI was refused: the token is not an operator's.");
        let frame = frame(&state, &who, s.as_deref()).await?;
        let mut r = rendered(
            "login.html",
            &json!({"frame": frame, "title": "Sign in", "next": next,
                "error": "That token is not an operator token of this server."}),
        );
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        return Ok(r);
    };
    let key = state.page_key().await?;
    let value = session::issue(&key, Some(op), rand::random(), state.engine.now_ms() / 1000);
    tracing::info!(operator = %op.name, "An operator signed in to the web UI.");
    let mut r = see_other(&next);
    let cookie = session::set_cookie(&value, super::policy::forwarded_https(&headers));
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().insert("set-cookie", v);
    }
    Ok(r)
}

/// `POST /ui/logout`.
pub async fn logout() -> Response {
    let mut r = see_other("/ui/login");
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie()) {
        r.headers_mut().insert("set-cookie", v);
    }
    r
}

/// `GET /ui/static/{file}` and `GET /favicon.ico`.
pub async fn asset(Path(file): Path<String>) -> Response {
    serve_asset(&file)
}

pub async fn favicon() -> Response {
    serve_asset("favicon.svg")
}

fn serve_asset(file: &str) -> Response {
    match crate::ui::ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, body)) => {
            let mut r = (StatusCode::OK, *body).into_response();
            let h = r.headers_mut();
            h.insert("content-type", HeaderValue::from_static(content_type));
            h.insert(
                "cache-control",
                HeaderValue::from_static("public, max-age=300"),
            );
            h.insert(
                "x-content-type-options",
                HeaderValue::from_static("nosniff"),
            );
            r
        }
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

/// `GET /`: the UI.
pub async fn root() -> Response {
    see_other("/ui")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_times_are_read_as_utc() {
        assert_eq!(parse_time("1970-01-01T00:01"), Some(60_000));
        assert_eq!(parse_time("1970-01-01T00:00:02Z"), Some(2_000));
        assert_eq!(parse_time(""), None);
        assert_eq!(parse_time("yesterday"), None);
    }
}
