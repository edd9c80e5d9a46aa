//! `webhook`: one HTTP request; the body is the rendered `prompt_template`.

use super::{FieldSpec, Fields};
use crate::diag::Diagnostics;

pub const FIELDS: &[FieldSpec] = &[
    FieldSpec {
        name: "url",
        ty: "template",
        default: "required",
        doc: "Where the request goes; rendered per call.",
    },
    FieldSpec {
        name: "method",
        ty: "string",
        default: "POST",
        doc: "The HTTP method (GET, POST, PUT, PATCH, DELETE).",
    },
    FieldSpec {
        name: "headers",
        ty: "map string -> string",
        default: "{}",
        doc: "Request headers; `${VAR}` in a value is taken from the environment.",
    },
    FieldSpec {
        name: "timeout_seconds",
        ty: "number",
        default: "30",
        doc: "How long the request may take (the step's timeout still applies).",
    },
];

#[derive(Debug, Clone, PartialEq)]
pub struct WebhookConfig {
    /// As written; the runner renders it (pointer `url`) before each call.
    pub url: String,
    /// As written; the executor checks it is an HTTP method.
    pub method: Option<String>,
    /// As written; `${VAR}` is expanded per call.
    pub headers: Vec<(String, String)>,
    pub timeout_seconds: Option<f64>,
}

pub(super) fn decode(f: &mut Fields<'_>, d: &mut Diagnostics) -> Option<WebhookConfig> {
    let url = f.get("url");
    let method = f.string(d, "method", "an HTTP method");
    let headers = f.scalar_map(d, "headers").unwrap_or_default();
    let timeout_seconds = f.number(d, "timeout_seconds");
    let url = match url {
        Some(n) => match n.as_str() {
            Some(s) => {
                f.template("url".into(), n.clone(), f.path_of("url"));
                s.to_string()
            }
            None => {
                f.wrong_type(d, n, &f.path_of("url"), "a URL string");
                return None;
            }
        },
        None => {
            d.error_hint(
                f.span(),
                f.path(),
                "the webhook executor needs `executor_config.url`",
                "e.g. `executor_config: {url: \"https://hooks.example/alert\"}`",
            );
            return None;
        }
    };
    Some(WebhookConfig {
        url,
        method,
        headers,
        timeout_seconds,
    })
}
