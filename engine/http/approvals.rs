//! The approvals API and page: `GET /approvals`, `GET /approvals/{token}` (HTML),
//! `POST /approvals/{token}` (JSON or the page's form). Works for every channel,
//! and alone when no chat is configured.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{ApiError, AppState};
use crate::store::Outcome;

/// `channel` is where the request goes (`telegram`, `webhook`, `page`; null for a
/// testing run, which is never sent); `delivered_at` stays null until that channel
/// accepted it.
fn approval_json(a: &crate::store::ApprovalRecord) -> Value {
    let delivered_at = a.delivery_json.as_deref().map(|j| {
        crate::telegram::Delivery::parse(j)
            .and_then(|d| d.delivered_at)
            // Recorded by an older version, which did not keep the time: the
            // request was delivered at some point after it was created.
            .unwrap_or(a.created_at)
    });
    json!({"token": a.token, "run_id": a.run_id, "step": a.step_path, "pipeline": a.pipeline_name,
        "message": a.message, "team": a.team, "stage": a.stage, "status": a.status,
        "created_at": crate::clock::rfc3339(a.created_at), "deadline_at": crate::clock::rfc3339(a.deadline_at),
        "decided_by": a.decided_by, "channel": a.channel,
        "delivered_at": delivered_at.map(crate::clock::rfc3339)})
}

pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let pending = state.engine.store.approvals_with_status("pending")?;
    Ok(Json(
        json!({"approvals": pending.iter().map(approval_json).collect::<Vec<_>>()}),
    ))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub async fn page(State(state): State<Arc<AppState>>, Path(token): Path<String>) -> Response {
    let a = match state.engine.store.approval(&token) {
        Ok(Some(a)) => a,
        Ok(None) => {
            return (
                StatusCode::NOT_FOUND,
                Html("<h1>Unknown approval</h1>".to_string()),
            )
                .into_response()
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    let form = if a.status == "pending" {
        format!(
            "<form method=\"post\" action=\"/approvals/{t}\"><input name=\"by\" placeholder=\"your name\">\
             <button name=\"decision\" value=\"approve\">Approve</button> \
             <button name=\"decision\" value=\"reject\">Reject</button></form>",
            t = escape(&a.token)
        )
    } else {
        format!(
            "<p>Decided: <b>{}</b> by {}</p>",
            escape(&a.status),
            escape(a.decided_by.as_deref().unwrap_or("?"))
        )
    };
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Approval</title></head><body>\
         <h1>Approval for {p} / {s}</h1><pre>{m}</pre><p>Deadline: {d}</p>{form}</body></html>",
        p = escape(&a.pipeline_name),
        s = escape(&a.step_path),
        m = escape(&a.message),
        d = crate::clock::rfc3339(a.deadline_at),
    ))
    .into_response()
}

pub async fn decide(
    State(state): State<Arc<AppState>>,
    Path(token): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let is_form = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded"));
    let (decision, by) = if is_form {
        let pairs: Vec<(String, String)> = url_decode_pairs(&String::from_utf8_lossy(&body));
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        (
            get("decision").unwrap_or_default(),
            get("by").filter(|s| !s.is_empty()),
        )
    } else {
        let v: Value = serde_json::from_slice(&body).map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, "malformed JSON")
                .detail(Value::from(e.to_string()))
        })?;
        (
            v.get("decision")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            v.get("by").and_then(Value::as_str).map(str::to_string),
        )
    };
    let approve = match decision.as_str() {
        "approve" => true,
        "reject" => false,
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "`decision` must be \"approve\" or \"reject\"",
            ))
        }
    };
    let by = by.unwrap_or_else(|| "approvals page".into());
    match state.engine.decide_approval(&token, approve, &by).await? {
        Outcome::ApprovalDecided => Ok(Json(json!({"status": if approve { "approved" } else { "rejected" }, "token": token, "by": by})).into_response()),
        Outcome::ApprovalAlreadyDecided { status } => Err(ApiError::new(StatusCode::CONFLICT, "already decided").detail(Value::from(status))),
        _ => Err(ApiError::new(StatusCode::NOT_FOUND, "unknown approval token")),
    }
}

fn url_decode_pairs(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}
