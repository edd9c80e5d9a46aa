//! HTML answers of the web UI and its forms: every page with the headers that
//! keep it to this origin (no framing, no caching, a content security policy
//! that allows nothing from elsewhere), a page with a message, a redirect.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use serde_json::{json, Value};

/// Every UI page's headers: nothing from another origin, no framing, no caching.
pub fn page(status: StatusCode, html: String) -> Response {
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

pub fn rendered(template: &str, context: &Value) -> Response {
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

pub fn see_other(location: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        r.headers_mut().insert("location", v);
    }
    r
}
