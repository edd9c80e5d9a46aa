//! `POST /webhook` and `POST /pipelines/{name}/run`: authenticate, normalise,
//! resolve, gate testing pipelines, deduplicate, respect the concurrency cap,
//! then start the run in the background. The response never waits for the run.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, AppState};
use crate::pipeline::Stage;
use crate::run::context::Normalised;
use crate::runner::Created;

/// The `source` label a refused trigger request is counted under in
/// `webhooks_total`, as the handler would have counted it.
pub(super) fn source_label(uri: &axum::http::Uri, headers: &HeaderMap) -> String {
    if uri.path().starts_with("/pipelines/") {
        return "generic".into();
    }
    let from_query = uri.query().and_then(|q| {
        q.split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == "source")
            .map(|(_, v)| v.to_string())
    });
    from_query
        .or_else(|| {
            headers
                .get("x-pipeline-source")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "none".into())
}

/// The word a refused trigger request is counted under in `webhooks_total`
/// (answer words, never HTTP codes, so a dashboard reads what happened).
pub(super) fn refusal_word(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        _ => "error",
    }
}

fn reject(source: &str, err: ApiError) -> Response {
    let word = refusal_word(err.status);
    crate::telemetry::webhook(source, word);
    tracing::info!(source, status = word, code = err.status.as_u16(), error = %err.error, "Webhook refused.");
    err.into_response()
}

/// A body axum could not read (over `server.max_body_bytes`, or cut off) becomes
/// the usual error shape instead of axum's plain-text rejection.
fn read_body(body: Result<Bytes, BytesRejection>, max_body_bytes: u64) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(status, "payload too large").detail(Value::from(format!(
                "the request body is over server.max_body_bytes ({max_body_bytes} bytes)"
            )))
        } else {
            ApiError::new(status, "unreadable request body")
                .detail(Value::from(rejection.body_text()))
        }
    })
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "malformed JSON").detail(Value::from(e.to_string()))
    })
}

pub async fn webhook(
    State(state): State<Arc<AppState>>,
    Query(query): Query<HashMap<String, String>>,
    axum::Extension(who): axum::Extension<super::Principal>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let source = query
        .get("source")
        .cloned()
        .or_else(|| {
            headers
                .get("x-pipeline-source")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_default();
    let label = if source.is_empty() {
        "none".to_string()
    } else {
        source.clone()
    };
    let body = match read_body(body, state.engine.config.server.max_body_bytes) {
        Ok(b) => b,
        Err(e) => return reject(&label, e),
    };
    match accept(&state, &query, &who, &body, &source, None).await {
        Ok(r) => r,
        Err(e) => reject(&label, e),
    }
}

pub async fn run_pipeline(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    axum::Extension(who): axum::Extension<super::Principal>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match read_body(body, state.engine.config.server.max_body_bytes) {
        Ok(b) => b,
        Err(e) => return reject("generic", e),
    };
    match accept(&state, &query, &who, &body, "generic", Some(name)).await {
        Ok(r) => r,
        Err(e) => reject("generic", e),
    }
}

async fn accept(
    state: &Arc<AppState>,
    query: &HashMap<String, String>,
    who: &super::Principal,
    body: &Bytes,
    source: &str,
    forced_pipeline: Option<String>,
) -> Result<Response, ApiError> {
    let team = who.team().map(str::to_string);
    if !state.accepting.load(Ordering::SeqCst) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down",
        ));
    }
    // Refused up front rather than accepted into a store that cannot keep it (or into
    // a database file that is no longer at its path); the sender retries later.
    if let Some(reason) = state.engine.store.unwritable() {
        return Err(
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
                .detail(Value::from(reason)),
        );
    }
    let mut payload = if body.is_empty() && forced_pipeline.is_some() {
        json!({})
    } else {
        parse_json(body)?
    };
    if source.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "Source must be provided via ?source= query param or X-Pipeline-Source header",
        ));
    }
    if let (Some(name), Value::Object(m)) = (&forced_pipeline, &mut payload) {
        m.insert("pipeline".into(), Value::from(name.clone()));
    }
    let engine = &state.engine;
    let received_at = crate::clock::rfc3339(engine.now_ms());
    let mut trigger: Normalised = crate::intake::normalise(
        source,
        query.get("strategy").map(String::as_str),
        &payload,
        &received_at,
    )
    .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.to_string()))?;
    trigger.team = team;
    let pipelines = engine.pipelines();
    let pipeline = match crate::intake::route(&pipelines, &trigger, forced_pipeline.as_deref()) {
        crate::intake::Route::Start(p) => p.clone(),
        crate::intake::Route::UnknownPipeline(name) => {
            return Err(
                ApiError::new(StatusCode::NOT_FOUND, "pipeline not found").detail(Value::from(
                    format!("no pipeline named `{name}` is loaded; GET /pipelines lists them"),
                )),
            );
        }
        crate::intake::Route::IgnoredResolved(p) => {
            crate::telemetry::webhook(source, "ignored_resolved");
            tracing::info!(pipeline = %p.name, source, severity = trigger.severity.as_deref().unwrap_or(""),
                "Resolved notification ignored: the pipeline takes firing notifications only (add `status: resolved` to its trigger.match to take them).");
            let body = json!({"status": "ignored_resolved", "pipeline": p.name, "source": source,
                "reason": format!("the notification is resolved and pipeline {} does not match on status", p.name)});
            return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
        }
        crate::intake::Route::NoMatch => {
            crate::telemetry::webhook(source, "no_match");
            let severity = trigger.severity.as_deref().unwrap_or("none");
            tracing::info!(source, severity, labels = %crate::telemetry::json_text(&trigger.labels), "Webhook matched no pipeline.");
            let body = json!({"status": "no_match", "source": source, "severity": trigger.severity, "labels": trigger.labels,
                "error": "no pipeline matched", "detail": format!("no loaded pipeline's trigger.match holds for source={source} severity={severity}")});
            // Alertmanager re-sends every 4xx each group_interval and raises its
            // own failure alerts: an alert nobody routes here is not its error.
            let code = if source == "alertmanager" {
                StatusCode::OK
            } else {
                StatusCode::UNPROCESSABLE_ENTITY
            };
            return Ok((code, Json(body)).into_response());
        }
    };
    let allow_testing = forced_pipeline.is_some()
        || query
            .get("allow_testing")
            .is_some_and(|v| v == "true" || v == "1");
    if pipeline.stage == Stage::Testing && !allow_testing {
        crate::telemetry::webhook(source, "skipped_testing");
        tracing::info!(pipeline = %pipeline.name, source,
            "Webhook skipped: the pipeline is in stage testing (set `stage: production`, or pass ?allow_testing=true).");
        return Ok((
            StatusCode::ACCEPTED,
            Json(
                json!({"status": "skipped_testing", "pipeline": pipeline.name,
            "reason": "pipeline is in stage testing; pass ?allow_testing=true to run it"}),
            ),
        )
            .into_response());
    }
    let cfg = &engine.config;
    let dedup_enabled = pipeline.trigger.dedup_enabled.unwrap_or(cfg.dedup.enabled);
    let window = pipeline
        .trigger
        .dedup_window_seconds
        .unwrap_or(cfg.dedup.window_seconds);
    let common = json!({"pipeline": pipeline.name, "source": source, "severity": trigger.severity, "summary": trigger.summary});
    // The slot is taken before the run is recorded, so a burst cannot overshoot.
    let admission = engine.try_admit(cfg.max_runs);
    if admission.is_none() {
        // Dedup is decided before the cap (reference 7.1), so a retried alert whose
        // run exists is answered `deduplicated` instead of being refused.
        if let Some((run_id, reason)) = find_duplicate(
            engine,
            &pipeline.name,
            trigger.fingerprint.as_deref(),
            dedup_enabled.then_some(window),
        )
        .await?
        {
            crate::telemetry::webhook(source, "deduplicated");
            tracing::info!(pipeline = %pipeline.name, source, run_id = %run_id, "Webhook deduplicated.");
            let mut body = json!({"status": "deduplicated", "run_id": run_id, "reason": reason});
            merge(&mut body, common);
            return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
        }
        crate::telemetry::webhook(source, "overloaded");
        return Ok((
            StatusCode::TOO_MANY_REQUESTS,
            Json(
                json!({"status": "overloaded", "error": "too many runs in progress",
            "detail": format!("concurrency.max_runs is {}; retry once a run has finished", cfg.max_runs),
            "active_runs": engine.active_runs(), "max_runs": cfg.max_runs}),
            ),
        )
            .into_response());
    }
    // The body as it arrived (it parsed, so it is JSON), unless it was amended.
    let payload_json = match (&forced_pipeline, std::str::from_utf8(body)) {
        (None, Ok(text)) => text.to_string(),
        _ => payload.to_string(),
    };
    let created = engine
        .create_run_from(
            &pipeline,
            &trigger,
            payload_json,
            None,
            dedup_enabled.then_some(window),
        )
        .await
        .map_err(|e| match e {
            // Nothing was stored: the same answer as when the store was already known
            // to be failing, so a sender sees one shape for "try again later".
            crate::runner::Error::Store(s) if s.is_retriable() => {
                tracing::warn!(error = %s, "Store cannot take a new run; answering 503.");
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
                    .detail(Value::from(s.to_string()))
            }
            other => ApiError::from(other),
        })?;
    match created {
        Created::Duplicate { run_id, reason } => {
            crate::telemetry::webhook(source, "deduplicated");
            tracing::info!(pipeline = %pipeline.name, source, run_id = %run_id, "Webhook deduplicated.");
            let mut body = json!({"status": "deduplicated", "run_id": run_id, "reason": reason});
            merge(&mut body, common);
            Ok((StatusCode::ACCEPTED, Json(body)).into_response())
        }
        Created::Inserted(run_id) => {
            crate::telemetry::webhook(source, "accepted");
            tracing::info!(run_id = %run_id, pipeline = %pipeline.name, source, "Webhook accepted.");
            if let Some(slot) = admission {
                slot.spawn(run_id.clone());
            }
            let mut body = json!({"status": "accepted", "run_id": run_id});
            merge(&mut body, common);
            Ok((StatusCode::ACCEPTED, Json(body)).into_response())
        }
    }
}

/// The run an insert would be folded into as a duplicate (the same test as
/// `store::Write::InsertRunDedup`), with the reason to give. Read-only; used only
/// when the cap refuses new runs: two index lookups on a blocking thread, so
/// clients retrying 429s cannot starve the async workers that drive runs.
async fn find_duplicate(
    engine: &crate::runner::Engine,
    pipeline: &str,
    fingerprint: Option<&str>,
    window_seconds: Option<u64>,
) -> Result<Option<(String, String)>, ApiError> {
    let Some(fingerprint) = fingerprint.filter(|f| !f.is_empty()) else {
        return Ok(None);
    };
    let window_start = window_seconds.map(|w| engine.now_ms() - (w as i64) * 1000);
    let store = engine.store.clone();
    let (pipeline, fingerprint) = (pipeline.to_string(), fingerprint.to_string());
    let found = tokio::task::spawn_blocking(move || {
        store.find_duplicate(&pipeline, &fingerprint, window_start)
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))??;
    Ok(found.map(|d| {
        let reason = if d.running {
            format!("Duplicate of run {} (status=running)", d.run_id)
        } else {
            format!(
                "Duplicate of run {} (status={}) inside the dedup window",
                d.run_id, d.status
            )
        };
        (d.run_id, reason)
    }))
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(a), Value::Object(b)) = (into, from) {
        a.extend(b);
    }
}
