//! `GET /replicas` (SPEC 11): the replicas sharing the store, live or not, with
//! the runs each holds. On SQLite the table is normally empty (a single `serve`
//! registers no replica), and the answer is simply what it holds.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::Value;

use super::{ApiError, AppState};
use crate::run::lease::Timing;
use crate::view;

pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let replica = &state.engine.config.replica;
    let timing = Timing {
        lease_ms: (replica.lease_seconds as i64).saturating_mul(1000),
        heartbeat_ms: (replica.heartbeat_seconds as i64).saturating_mul(1000),
    };
    let store = state.engine.store.clone();
    // The rows first, then the clock: every heartbeat read is then at or before
    // `now`, so an age is never negative.
    let body = tokio::task::spawn_blocking(move || -> Result<Value, crate::store::Error> {
        let replicas = store.replicas()?;
        let now = store.db_now_ms()?;
        Ok(view::replicas(&replicas, timing, now))
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))??;
    Ok(Json(body))
}
