//! `GET /runs`, `GET /runs/{id}`, `POST /runs/{id}/cancel`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, AppState};
use crate::domain::RunStatus;
use crate::store::RunFilter;
use crate::view;

pub async fn list(
    State(state): State<Arc<AppState>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let number = |key: &str, default: u32| -> Result<u32, ApiError> {
        match q.get(key) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!("`{key}` must be a whole number"),
                )
            }),
        }
    };
    let filter = RunFilter {
        status: q.get("status").cloned().filter(|s| !s.is_empty()),
        pipeline: q.get("pipeline").cloned().filter(|s| !s.is_empty()),
        limit: number("limit", 50)?.clamp(1, 500),
        offset: number("offset", 0)?,
    };
    let store = state.engine.store.clone();
    let runs = tokio::task::spawn_blocking(move || store.runs(&filter))
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))??;
    Ok(Json(
        json!({"runs": runs.iter().map(view::run_summary).collect::<Vec<_>>()}),
    ))
}

pub async fn show(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let store = state.engine.store.clone();
    let found = tokio::task::spawn_blocking(move || -> Result<_, crate::store::Error> {
        let Some(run) = store.run(&id)? else {
            return Ok(None);
        };
        let steps = store.steps(&id)?;
        let events = store.events(&id)?;
        let journals = store.journals_of_run(&id)?;
        Ok(Some(view::run_detail(&run, &steps, &events, &journals)))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))??;
    found
        .map(Json)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "run not found"))
}

pub async fn cancel(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    axum::Extension(who): axum::Extension<super::Principal>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    // The UI's button sends a form and is answered with the run's page.
    let from_form = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    // An operator credential names who cancelled; without auth the body's `by`.
    let by = match who.operator() {
        Some(op) => Some(op.to_string()),
        None if from_form => super::forms::field(&body, "by").filter(|b| !b.trim().is_empty()),
        None => serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("by").and_then(Value::as_str).map(str::to_string)),
    };
    let Some(run) = state.engine.store.run(&id)? else {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "run not found"));
    };
    let page = format!("/ui/runs/{}", crate::ui::path_segment(&id));
    if run.status != RunStatus::Running {
        if from_form {
            return Ok(super::page::see_other(&page));
        }
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("run is already {}", run.status),
        ));
    }
    // A run of a live `vectorstep run`, or on a shared store of another replica,
    // is driven by a process that cannot see this one's memory: the request is
    // stored for it (it polls every second, a replica every heartbeat).
    let owner = state.engine.store.run_owner(&id)?;
    if owner.is_some() || state.engine.store.is_shared() {
        state
            .engine
            .store
            .commit(vec![crate::store::Write::SetKv {
                key: crate::runner::cancel_request_key(&id),
                value: by.clone().unwrap_or_default(),
            }])
            .await?;
        tracing::info!(run_id = %id, owner = owner.as_deref().unwrap_or(""), "Cancel request stored for the process that drives the run.");
    }
    state.engine.cancel_by(&id, by.as_deref());
    if from_form {
        return Ok(super::page::see_other(&page));
    }
    Ok(Json(
        json!({"status": "cancelling", "run_id": id, "by": by, "detail": "the run stops at its next step boundary"}),
    )
    .into_response())
}
