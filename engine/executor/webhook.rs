//! `webhook`: one HTTP request whose body is the rendered `prompt_template`.
//!
//! Its `executor_config` keys are declared in
//! [`crate::pipeline::executor_config::webhook::FIELDS`]; header values are
//! `${VAR}`-expanded here, per call, so secrets stay in the environment. A JSON answer shaped like a step output becomes the output;
//! any other 2xx answer is a delivery receipt; non-2xx fails the step.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::Method;
use serde_json::Value;

use super::http::{self, Reply};
use super::{BoxFuture, Call, Error, Executor, Outcome};
use crate::config::expand_env;
use crate::pipeline::executor_config::WebhookConfig;
use crate::pipeline::ExecutorConfig;
use crate::run::{StepOutput, Usage};

/// Used when neither the step nor `executor_config` bounds the request, so a peer
/// that never answers cannot hold a run forever.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Webhook {
    client: reqwest::Client,
}

impl Webhook {
    pub fn new(client: reqwest::Client) -> Self {
        Webhook { client }
    }
}

impl Executor for Webhook {
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(self.run(call))
    }
}

impl Webhook {
    async fn run(&self, call: Call<'_>) -> Result<Outcome, Error> {
        let ExecutorConfig::Webhook(cfg) = &call.action.config else {
            return Err(super::wrong_config(&call, "webhook"));
        };
        let url = http::target_url(&call, Some(&cfg.url), "the webhook executor")?;
        let method = method(cfg)?;
        let own = http::seconds(cfg.timeout_seconds);
        let timeout = http::shortest(own, call.timeout).unwrap_or(DEFAULT_TIMEOUT);
        let headers = headers(&call, cfg)?;
        let what = format!("webhook {method}");
        let mut req = self
            .client
            .request(method, &url)
            .headers(headers)
            .timeout(timeout);
        if !call.prompt.is_empty() {
            req = req.body(call.prompt.clone());
        }
        let reply = http::send(req, &what, &url).await?;
        interpret(&reply)
    }
}

/// Maps the peer's answer to the step's outcome (SPEC 4).
pub fn interpret(reply: &Reply) -> Result<Outcome, Error> {
    let code = reply.status.as_u16();
    if !reply.is_success() {
        return Err(Error::Failed(format!(
            "webhook returned HTTP {code}: {}",
            reply.excerpt()
        )));
    }
    let parsed = serde_json::from_str::<Value>(&reply.body).ok();
    if let Some(v) = parsed.as_ref().filter(|v| StepOutput::looks_like_output(v)) {
        let output = StepOutput::from_json(v).map_err(|e| {
            Error::BadOutput(format!(
                "webhook answered HTTP {code} with an invalid step output: {} (body: {})",
                e.0,
                reply.excerpt()
            ))
        })?;
        return Ok(Outcome {
            output,
            usage: Usage::default(),
        });
    }
    let mut output = StepOutput::new(1.0, format!("Webhook delivered: HTTP {code}"));
    output.extra.insert("status_code".into(), Value::from(code));
    output.extra.insert(
        "body".into(),
        parsed.unwrap_or_else(|| Value::String(reply.body.clone())),
    );
    Ok(Outcome {
        output,
        usage: Usage::default(),
    })
}

fn method(cfg: &WebhookConfig) -> Result<Method, Error> {
    match cfg.method.as_deref() {
        None => Ok(Method::POST),
        Some(m) => Method::from_bytes(m.trim().to_ascii_uppercase().as_bytes())
            .map_err(|_| Error::Config(format!("`{m}` is not an HTTP method"))),
    }
}

/// Content-Type by body, then the configured headers (which may override it), then
/// the idempotency headers, which always win so a retry is recognisable.
fn headers(call: &Call<'_>, cfg: &WebhookConfig) -> Result<HeaderMap, Error> {
    let mut h = HeaderMap::new();
    let json = serde_json::from_str::<Value>(&call.prompt).is_ok();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(if json {
            "application/json"
        } else {
            "text/plain; charset=utf-8"
        }),
    );
    for (name, raw) in &cfg.headers {
        let mut missing = Vec::new();
        let text = expand_env(raw, &|k| std::env::var(k).ok(), &mut missing);
        for var in missing {
            tracing::warn!(header = %name, variable = %var, "Environment variable for a webhook header is not set; it expands to an empty string.");
        }
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| Error::Config(format!("`{name}` is not a valid header name")))?;
        // The value is not quoted: it usually carries a token.
        let value = HeaderValue::from_str(&text)
            .map_err(|_| Error::Config(format!("header `{name}` has an invalid value")))?;
        h.insert(name, value);
    }
    h.extend(http::call_headers(call));
    Ok(h)
}
