//! `POST /-/reload`: reload pipelines and the step library from disk, as SIGHUP
//! does. `200 {"status":"reloaded","pipelines","added","changed","removed",
//! "warnings"}`; `422 {"error":"invalid pipelines","detail":[...]}` with every
//! diagnostic when the folder has errors, and then nothing changed.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, AppState, Principal};
use crate::diag::Diagnostic;
use crate::runner::reload;

pub async fn reload(
    State(state): State<Arc<AppState>>,
    who: axum::Extension<Principal>,
) -> Response {
    let by = who.operator().unwrap_or("anonymous").to_string();
    tracing::info!(by = %by, "Reload requested over HTTP.");
    match reload::reload(&state.engine).await {
        Ok(done) => {
            let mut body = serde_json::to_value(&done).unwrap_or_else(|_| json!({}));
            if let Value::Object(map) = &mut body {
                map.insert("status".into(), json!("reloaded"));
            }
            (StatusCode::OK, Json(body)).into_response()
        }
        Err(refused) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid pipelines")
            .detail(Value::Array(
                refused.diagnostics.iter().map(diagnostic_json).collect(),
            ))
            .into_response(),
    }
}

/// One diagnostic as the 422 lists it: where, which field, what, how to fix.
pub fn diagnostic_json(d: &Diagnostic) -> Value {
    let mut fields = d.fields_json();
    fields.insert("text".into(), Value::from(d.to_string()));
    Value::Object(fields)
}
