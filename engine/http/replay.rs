//! `POST /runs/{id}/replay` (SPEC 2, 12): a new run that reuses the old run's
//! recorded steps before `from_step` and starts there. `202 {"run_id",
//! "replay_of", "from_step", "by"}`; `400` without a `from_step` or with one that is
//! not a top-level step (the valid ones are listed); `404` for an unknown run;
//! `409` when the replay is refused (the run is still running, its pipeline is not
//! loaded or changed, the copy would hold a human step or a step that did not
//! finish); `429` at `concurrency.max_runs`; `503` while shutting down or while the
//! store cannot write.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, AppState, Principal};
use crate::runner::ReplayRefusal;

/// The UI's replay form (`from_step`, `csrf`) is answered with the new run's
/// page, or a page saying why not; the API with JSON.
pub async fn replay(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    who: axum::Extension<Principal>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let from_form = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    if !from_form {
        return replay_json(state, id, who, body)
            .await
            .unwrap_or_else(IntoResponse::into_response);
    }
    let field = |k: &str| super::forms::field(&body, k).filter(|v| !v.trim().is_empty());
    let asked = json!({"from_step": field("from_step"), "by": field("by")});
    match replay_json(state, id, who, asked.to_string().into()).await {
        Ok(r) => match r.status() {
            StatusCode::ACCEPTED => {
                let new_id = r
                    .extensions()
                    .get::<NewRun>()
                    .map(|n| n.0.clone())
                    .unwrap_or_default();
                super::page::see_other(&format!("/ui/runs/{}", crate::ui::path_segment(&new_id)))
            }
            _ => r,
        },
        Err(e) => super::page::refused_page(
            e.status,
            "Replay refused",
            &format!(
                "{}{}",
                e.error,
                e.detail
                    .as_str()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default()
            ),
        ),
    }
}

/// The new run's id, handed from the JSON answer to the form's redirect.
#[derive(Clone)]
struct NewRun(String);

async fn replay_json(
    state: Arc<AppState>,
    id: String,
    axum::Extension(who): axum::Extension<Principal>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: Value = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "malformed JSON").detail(Value::from(format!(
            "expected {{\"from_step\": \"name\"}}: {e}"
        )))
    })?;
    let Some(from_step) = body
        .get("from_step")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    else {
        return Err(
            ApiError::new(StatusCode::BAD_REQUEST, "missing `from_step`").detail(Value::from(
                "name the top-level step to start from: {\"from_step\": \"name\"}",
            )),
        );
    };
    // An operator credential names who asked; without auth the body's `by`.
    let by = match who.operator() {
        Some(op) => Some(op.to_string()),
        None => body.get("by").and_then(Value::as_str).map(str::to_string),
    };
    let engine = &state.engine;
    if !state.accepting.load(Ordering::SeqCst) {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down",
        ));
    }
    if let Some(reason) = engine.store.unwritable() {
        return Err(
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
                .detail(Value::from(reason)),
        );
    }
    // The slot is taken before the run is recorded, as for any new run.
    let max_runs = engine.config.max_runs;
    let Some(admission) = engine.try_admit(max_runs) else {
        return Err(
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too many runs in progress").detail(
                Value::from(format!(
                    "concurrency.max_runs is {max_runs}; retry once a run has finished"
                )),
            ),
        );
    };
    let new_id = engine
        .replay(&id, from_step, by.as_deref())
        .await
        .map_err(refusal)?;
    admission.spawn(new_id.clone());
    let mut r = (
        StatusCode::ACCEPTED,
        Json(json!({"run_id": new_id, "replay_of": id, "from_step": from_step, "by": by})),
    )
        .into_response();
    r.extensions_mut().insert(NewRun(new_id));
    Ok(r)
}

fn refusal(e: ReplayRefusal) -> ApiError {
    match e {
        ReplayRefusal::UnknownRun(_) => ApiError::new(StatusCode::NOT_FOUND, "run not found"),
        ReplayRefusal::Refused(r) if r.is_bad_request() => {
            ApiError::new(StatusCode::BAD_REQUEST, "unknown step")
                .detail(Value::from(r.to_string()))
        }
        ReplayRefusal::Refused(r) => {
            ApiError::new(StatusCode::CONFLICT, "replay refused").detail(Value::from(r.to_string()))
        }
        ReplayRefusal::Store(e) => e.into(),
        e @ ReplayRefusal::CorruptRun { .. } => {
            tracing::error!(error = %e, "Replay refused: the old run is unreadable.");
            ApiError::new(StatusCode::CONFLICT, "replay refused").detail(Value::from(e.to_string()))
        }
    }
}
