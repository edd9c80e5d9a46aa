//! The approvals API and page: `GET /approvals`, `GET /approvals/{token}` (HTML),
//! `POST /approvals/{token}` (JSON or the page's form). Works for every channel,
//! and alone when no chat is configured.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::{ApiError, AppState, Principal};
use crate::domain::ApprovalStatus;
use crate::runner::Decider;
use crate::store::Outcome;

/// `channel` is where the request goes (`telegram`, `webhook`, `page`; null for a
/// testing run, which is never sent); `delivered_at` stays null until that channel
/// accepted it.
fn approval_json(a: &crate::store::ApprovalRecord) -> Value {
    let delivered_at = a.delivery_json.as_deref().map(|j| {
        crate::runner::ApprovalDelivery::parse(j)
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
    let pending = state
        .engine
        .store
        .approvals_with_status(ApprovalStatus::Pending)?;
    Ok(Json(
        json!({"approvals": pending.iter().map(approval_json).collect::<Vec<_>>()}),
    ))
}

pub(super) fn escape(s: &str) -> String {
    crate::view::escape_html(s)
}

/// The CSRF token the page's form carries: a keyed hash of the approval token
/// under the server's page key (kept in the store, so a restart between showing
/// the page and pressing a button does not expire the form).
pub(super) async fn csrf_token(state: &AppState, approval_token: &str) -> Result<String, ApiError> {
    let key = state.page_key().await?;
    Ok(
        blake3::keyed_hash(&key, format!("approval-form:{approval_token}").as_bytes())
            .to_hex()
            .to_string(),
    )
}

/// A whole HTML page around `body`.
fn page_html(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <title>{t}</title><link rel=\"icon\" href=\"/favicon.ico\" type=\"image/svg+xml\"><style>body{{font-family:sans-serif;max-width:44em;margin:2em auto;padding:0 1em}}\
         .msg{{white-space:pre-wrap;border-left:3px solid #888;padding:.5em 1em;background:#f6f6f6}}\
         dt{{font-weight:bold}}button{{font-size:1.1em;margin-right:.5em}}</style></head>\
         <body><h1>{t}</h1>{body}</body></html>",
        t = escape(title),
    );
    let mut r = (status, Html(html)).into_response();
    // The page holds a credential in its URL and form: keep it out of caches,
    // referrers and frames.
    let h = r.headers_mut();
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert(
        "content-security-policy",
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'"),
    );
    r
}

fn time_left(now_ms: i64, deadline_ms: i64) -> String {
    let secs = (deadline_ms - now_ms) / 1000;
    if secs <= 0 {
        return "the deadline has passed".into();
    }
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        format!("{h} h {m} min left")
    } else if m > 0 {
        format!("{m} min {s} s left")
    } else {
        format!("{s} s left")
    }
}

/// `GET /approvals/{token}`: the request, the time left and, while it is
/// pending, the form (or, when only listed approvers may decide, where to).
pub async fn page(
    State(state): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(token): Path<String>,
) -> Response {
    let a = match state.engine.store.approval(&token) {
        Ok(Some(a)) => a,
        Ok(None) => return unknown_page(),
        Err(e) => return ApiError::from(e).into_response(),
    };
    let now = state.engine.now_ms();
    // The message is the human step's rendered template: its own markup is kept
    // and every value interpolated into it was escaped when it was rendered.
    let mut body = format!(
        "<dl><dt>Pipeline</dt><dd>{p}</dd><dt>Run</dt><dd><code>{r}</code></dd><dt>Step</dt><dd>{s}</dd></dl>\
         <div class=\"msg\">{m}</div>",
        p = escape(&a.pipeline_name),
        r = escape(&a.run_id),
        s = escape(&a.step_path),
        m = a.message,
    );
    if let Some(op) = who.operator() {
        // The link is posted to chats; only an operator is shown the way to the run.
        body.push_str(&format!(
            "<p>Signed in as {} · <a href=\"/ui/runs/{}\">open the run</a></p>",
            escape(op),
            crate::ui::path_segment(&a.run_id)
        ));
    }
    if a.status != ApprovalStatus::Pending {
        body.push_str(&format!(
            "<p>Decided: <b>{}</b> by {}.</p>",
            escape(a.status.as_str()),
            escape(a.decided_by.as_deref().unwrap_or("?"))
        ));
        return page_html(StatusCode::OK, "Approval decided", &body);
    }
    body.push_str(&format!(
        "<p>Deadline {} ({}).</p>",
        crate::clock::rfc3339(a.deadline_at),
        time_left(now, a.deadline_at)
    ));
    if !state.engine.config.human_approval.approvers.is_empty() && who.operator().is_none() {
        body.push_str(
            "<p>Only the listed approvers may decide this request: use the buttons in Telegram, \
             or as an operator <code>vectorstep approvals approve TOKEN</code> / \
             <code>reject TOKEN</code> with your operator token.</p>",
        );
        return page_html(StatusCode::OK, "Approval requested", &body);
    }
    let csrf = match csrf_token(&state, &a.token).await {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    body.push_str(&format!(
        "<form method=\"post\" action=\"/approvals/{t}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         {name}\
         <p><button name=\"decision\" value=\"approve\">Approve</button>\
         <button name=\"decision\" value=\"reject\">Reject</button></p></form>",
        t = escape(&a.token),
        // A signed-in operator decides under their own name.
        name = if who.operator().is_some() {
            ""
        } else {
            "<p><label>Your name <input name=\"by\" required maxlength=\"100\" autocomplete=\"name\"></label></p>"
        },
    ));
    page_html(StatusCode::OK, "Approval requested", &body)
}

fn unknown_page() -> Response {
    page_html(
        StatusCode::NOT_FOUND,
        "Unknown approval",
        "<p>No approval has this link. It may have been mistyped, or removed with its run.</p>",
    )
}

/// What a decision request asked for, and how it came.
struct Request {
    approve: bool,
    /// The name in the body or form (never trusted when an operator credential is given).
    by: Option<String>,
    from_page: bool,
    /// Where a UI form goes back to after deciding (a `/ui` path only).
    return_to: Option<String>,
}

/// `POST /approvals/{token}`: the page's form (its CSRF token and the link are the
/// credential) or the JSON API (an operator credential when auth is configured).
pub async fn decide(
    State(state): State<Arc<AppState>>,
    Path(token): Path<String>,
    Extension(who): Extension<Principal>,
    client: Option<ConnectInfo<SocketAddr>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let req = if content_type.starts_with("application/x-www-form-urlencoded") {
        let pairs = super::forms::pairs(&String::from_utf8_lossy(&body));
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        if !state.engine.config.human_approval.approvers.is_empty() && who.operator().is_none() {
            return Ok(page_html(
                StatusCode::FORBIDDEN,
                "Only approvers may decide",
                "<p>Use the buttons in Telegram, or decide with <code>vectorstep approvals</code> and an operator token.</p>",
            ));
        }
        let expected = csrf_token(&state, &token).await?;
        let given = get("csrf").unwrap_or_default();
        if !super::secret::same_secret(given.as_bytes(), expected.as_bytes()) {
            return Ok(page_html(
                StatusCode::FORBIDDEN,
                "Form expired",
                "<p>This form did not come from this approval's page. Open the link again and decide there.</p>",
            ));
        }
        Request {
            approve: get("decision").as_deref() == Some("approve"),
            by: get("by")
                .map(|b| b.trim().chars().take(100).collect::<String>())
                .filter(|b| !b.is_empty()),
            from_page: get("decision").is_some_and(|d| d == "approve" || d == "reject"),
            return_to: get("return_to")
                .filter(|r| !r.is_empty())
                .map(|r| super::session::safe_next(Some(&r))),
        }
    } else {
        if !content_type.starts_with("application/json") {
            // Browsers can post text/plain across sites without asking; JSON they cannot.
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send the decision as JSON (content-type: application/json) or from the approval page",
            ));
        }
        if state.engine.config.auth_enabled() && who.operator().is_none() {
            return Err(match who {
                Principal::Anonymous => ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized")
                    .detail(Value::from(
                        "deciding through the API needs an operator token",
                    )),
                _ => ApiError::new(StatusCode::FORBIDDEN, "forbidden").detail(Value::from(
                    "deciding through the API needs an operator token",
                )),
            });
        }
        let v: Value = serde_json::from_slice(&body).map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, "malformed JSON")
                .detail(Value::from(e.to_string()))
        })?;
        let decision = v
            .get("decision")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if decision != "approve" && decision != "reject" {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "`decision` must be \"approve\" or \"reject\"",
            ));
        }
        Request {
            approve: decision == "approve",
            by: v.get("by").and_then(Value::as_str).map(str::to_string),
            from_page: false,
            return_to: None,
        }
    };
    let is_form = content_type.starts_with("application/x-www-form-urlencoded");
    if is_form && !req.from_page {
        return Ok(page_html(
            StatusCode::BAD_REQUEST,
            "No decision",
            "<p>Press Approve or Reject.</p>",
        ));
    }
    let approve = req.approve;
    let return_to = req.return_to.clone();
    // An operator credential names the decider; a `by` in the request is ignored.
    let decider = match who.operator() {
        Some(op) => Decider {
            by: op.to_string(),
            via: Some(if is_form { "page" } else { "api" }),
            client: client.map(|c| c.0.ip().to_string()),
        },
        None if is_form => {
            let ip = client.map(|c| c.0.ip().to_string());
            let name = req.by.unwrap_or_else(|| "anonymous".into());
            Decider {
                by: match &ip {
                    Some(ip) => format!("{name} (approval page, {ip})"),
                    None => format!("{name} (approval page)"),
                },
                via: Some("page"),
                client: ip,
            }
        }
        None => Decider {
            by: req.by.unwrap_or_else(|| "approvals page".into()),
            via: Some("api"),
            client: client.map(|c| c.0.ip().to_string()),
        },
    };
    let outcome = state
        .engine
        .decide_approval_by(&token, approve, &decider)
        .await?;
    let verdict = if approve {
        ApprovalStatus::Approved
    } else {
        ApprovalStatus::Rejected
    };
    if let (true, Some(back), Outcome::ApprovalDecided | Outcome::ApprovalAlreadyDecided { .. }) =
        (is_form, &return_to, &outcome)
    {
        return Ok(super::page::see_other(back));
    }
    if is_form {
        return Ok(match outcome {
            Outcome::ApprovalDecided => page_html(
                StatusCode::OK,
                if approve { "Approved" } else { "Rejected" },
                &format!(
                    "<p>You {verdict} this request as {}. The run goes on.</p>",
                    escape(&decider.by)
                ),
            ),
            Outcome::ApprovalAlreadyDecided { status } => page_html(
                StatusCode::CONFLICT,
                "Already decided",
                &format!(
                    "<p>This request was already {}; your decision was not recorded.</p>",
                    escape(status.as_str())
                ),
            ),
            _ => unknown_page(),
        });
    }
    match outcome {
        Outcome::ApprovalDecided => {
            Ok(Json(json!({"status": verdict, "token": token, "by": decider.by})).into_response())
        }
        Outcome::ApprovalAlreadyDecided { status } => {
            Err(ApiError::new(StatusCode::CONFLICT, "already decided").detail(Value::from(status)))
        }
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown approval token",
        )),
    }
}
