//! `GET /pipelines`, `GET /pipelines/{name}` (SPEC 2): the loaded pipelines with
//! their step graph (`ui::graph`, the same the UI draws).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, AppState};
use crate::pipeline::model::Pipeline;

fn describe(p: &Pipeline, now: i64) -> Value {
    let schedule = p.schedule.as_ref().map(|s| {
        let next = chrono::DateTime::from_timestamp_millis(now)
            .and_then(|after| crate::runner::schedule::next_tick(&s.cron, after))
            .map(|t| crate::clock::rfc3339(t.timestamp_millis()));
        json!({"cron": s.cron, "next_tick": next})
    });
    let trigger: Vec<Value> = p
        .trigger
        .conditions
        .iter()
        .map(|(field, op)| Value::from(format!("{field} {}", crate::ui::views::describe_op(op))))
        .collect();
    json!({
        "name": p.name,
        "description": p.description,
        "stage": p.stage.as_str(),
        "trigger": {"match": trigger, "dedup": p.trigger.dedup_enabled, "dedup_window_seconds": p.trigger.dedup_window_seconds},
        "durable": p.durable.is_some(),
        "schedule": schedule,
        "fingerprint": p.fingerprint,
        "file": p.file.display().to_string(),
        "steps": crate::ui::graph::entries(p),
    })
}

pub async fn list(State(state): State<Arc<AppState>>) -> Json<Value> {
    let now = state.engine.now_ms();
    let set = state.engine.pipelines();
    Json(json!({"pipelines": set.pipelines.iter().map(|p| describe(p, now)).collect::<Vec<_>>()}))
}

pub async fn show(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let now = state.engine.now_ms();
    state
        .engine
        .pipeline(&name)
        .map(|p| Json(describe(&p, now)))
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "pipeline not loaded"))
}
