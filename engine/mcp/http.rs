//! rmcp's streamable-HTTP client over the service's reqwest 0.12 client.
//!
//! rmcp ships this backend for reqwest 0.13; using it would put a second reqwest
//! (and its TLS stack) into the binary. [`Reqwest12`] implements rmcp's
//! [`StreamableHttpClient`] the way rmcp's own backend does
//! (`rmcp/src/transport/common/reqwest/streamable_http_client.rs`): the same
//! status handling (202/204 accepted, 404 on a session is an expired session,
//! 401/403 challenges, JSON-RPC errors in error bodies kept, 429/5xx as status
//! errors) and the same byte limits, applied before parsing.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::StatusCode;
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, SseError, StreamableHttpClient,
    StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::{Sse, SseStream};

const SESSION_ID: &str = "Mcp-Session-Id";
const LAST_EVENT_ID: &str = "Last-Event-Id";
const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";
/// Headers the transport sets itself; a configured header may not replace them.
/// (`MCP-Protocol-Version` is set by rmcp through the custom headers, so it passes.)
const RESERVED: &[&str] = &["accept", "mcp-session-id", "last-event-id"];

/// The service's reqwest 0.12 client as an rmcp HTTP backend.
#[derive(Clone)]
pub(super) struct Reqwest12(pub(super) reqwest::Client);

type Failure = StreamableHttpError<reqwest::Error>;

fn client_error(e: reqwest::Error) -> Failure {
    StreamableHttpError::Client(e)
}

/// Whether a `Content-Type` value names `expected`, ignoring case and parameters.
fn media_type_is(value: &[u8], expected: &str) -> bool {
    value
        .split(|b| *b == b';')
        .next()
        .and_then(|essence| std::str::from_utf8(essence).ok())
        .is_some_and(|e| e.trim_matches([' ', '\t']).eq_ignore_ascii_case(expected))
}

fn with_headers(
    mut request: reqwest::RequestBuilder,
    auth: Option<String>,
    custom: HashMap<HeaderName, HeaderValue>,
) -> Result<reqwest::RequestBuilder, Failure> {
    if let Some(token) = auth {
        request = request.bearer_auth(token);
    }
    for (name, value) in custom {
        if RESERVED.contains(&name.as_str()) {
            return Err(StreamableHttpError::ReservedHeaderConflict(
                name.to_string(),
            ));
        }
        request = request.header(name, value);
    }
    Ok(request)
}

/// A 401 or 403 with a challenge, as rmcp reports it.
fn challenge(status: StatusCode, headers: &HeaderMap) -> Option<Failure> {
    let header = headers.get(WWW_AUTHENTICATE)?;
    let text = match header.to_str() {
        Ok(t) => t.to_string(),
        Err(_) => {
            return Some(StreamableHttpError::UnexpectedServerResponse(Cow::from(
                "invalid www-authenticate header value",
            )))
        }
    };
    match status {
        StatusCode::UNAUTHORIZED => Some(StreamableHttpError::AuthRequired(
            AuthRequiredError::new(text),
        )),
        StatusCode::FORBIDDEN => Some(StreamableHttpError::InsufficientScope(
            InsufficientScopeError::new(text, None),
        )),
        _ => None,
    }
}

/// 429 and 5xx keep only their status and `Retry-After`.
fn status_error(status: StatusCode, headers: &HeaderMap) -> Option<HttpStatusError> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let retry_after = headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Some(HttpStatusError::new(status.as_u16(), retry_after))
}

/// The body, refused past `max` bytes.
async fn read_bounded(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, Failure> {
    if response.content_length().is_some_and(|l| l > max as u64) {
        return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(client_error)? {
        if chunk.len() > max - body.len() {
            return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// At most `max` bytes of the body, for an error message.
async fn read_prefix(mut response: reqwest::Response, max: usize) -> String {
    let mut body = Vec::new();
    while body.len() < max {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let n = chunk.len().min(max - body.len());
                body.extend_from_slice(&chunk[..n]);
            }
            _ => break,
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// Why an SSE body stopped.
#[derive(Debug, thiserror::Error)]
enum SseBodyError {
    #[error(transparent)]
    Read(reqwest::Error),
    #[error("SSE event exceeded the maximum size of {0} bytes")]
    TooLarge(usize),
}

/// The response body parsed as SSE, each event limited to `max` bytes (counted
/// on the raw lines, before the parser joins them).
fn sse_body(response: reqwest::Response, max: usize) -> BoxStream<'static, Result<Sse, SseError>> {
    let mut event_bytes = 0usize;
    let mut line_empty = true;
    let mut failed = false;
    let limited = response.bytes_stream().map(move |chunk| {
        if failed {
            return Err(SseBodyError::TooLarge(max));
        }
        let chunk = chunk.map_err(SseBodyError::Read)?;
        for &b in chunk.iter() {
            match b {
                b'\r' => {}
                b'\n' if line_empty => event_bytes = 0,
                b'\n' => line_empty = true,
                _ => {
                    line_empty = false;
                    event_bytes += 1;
                }
            }
            if event_bytes > max {
                failed = true;
                return Err(SseBodyError::TooLarge(max));
            }
        }
        Ok(chunk)
    });
    SseStream::from_bytes_stream(limited).boxed()
}

impl StreamableHttpClient for Reqwest12 {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Failure> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Failure> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, Failure> {
        let request = self
            .0
            .post(uri.as_ref())
            .header(ACCEPT, format!("{EVENT_STREAM}, {JSON}"));
        let mut request = with_headers(request, auth_header, custom_headers)?;
        let session_was_attached = session_id.is_some();
        if let Some(id) = session_id {
            request = request.header(SESSION_ID, id.as_ref());
        }
        let response = request.json(&message).send().await.map_err(client_error)?;
        let status = response.status();
        if let Some(e) = challenge(status, response.headers()) {
            return Err(e);
        }
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && session_was_attached {
            return Err(StreamableHttpError::SessionExpired);
        }
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let is_json = content_type
            .as_deref()
            .is_some_and(|ct| media_type_is(ct.as_bytes(), JSON));
        let new_session = response
            .headers()
            .get(SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let awaits_no_response = matches!(
            message,
            ClientJsonRpcMessage::Notification(_)
                | ClientJsonRpcMessage::Response(_)
                | ClientJsonRpcMessage::Error(_)
        );
        if !status.is_success() {
            let by_status = status_error(status, response.headers());
            if let Some(e) =
                by_status.filter(|_| !is_json || status == StatusCode::TOO_MANY_REQUESTS)
            {
                return Err(e.into());
            }
            let by_status = status_error(status, response.headers());
            let auth_failure = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
            let body = if is_json && !auth_failure {
                let raw = read_bounded(response, limits.max_json_response_size).await?;
                if let Ok(m @ JsonRpcMessage::Error(_)) =
                    serde_json::from_slice::<ServerJsonRpcMessage>(&raw)
                {
                    return Ok(StreamableHttpPostResponse::Json(m, new_session));
                }
                let n = raw.len().min(limits.max_error_response_size);
                String::from_utf8_lossy(&raw[..n]).into_owned()
            } else {
                read_prefix(response, limits.max_error_response_size).await
            };
            if let Some(e) = by_status {
                return Err(e.into());
            }
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!("HTTP {status}: {body}"),
            )));
        }
        if response.content_length() == Some(0) && awaits_no_response {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        match content_type.as_deref() {
            Some(ct) if media_type_is(ct.as_bytes(), EVENT_STREAM) => {
                Ok(StreamableHttpPostResponse::Sse(
                    sse_body(response, limits.max_sse_event_size),
                    new_session,
                ))
            }
            Some(ct) if media_type_is(ct.as_bytes(), JSON) => {
                let body = read_bounded(response, limits.max_json_response_size).await?;
                match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                    Ok(m) => Ok(StreamableHttpPostResponse::Json(m, new_session)),
                    Err(_) if awaits_no_response => Ok(StreamableHttpPostResponse::Accepted),
                    Err(e) => {
                        let n = body.len().min(256);
                        Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                            format!(
                                "could not parse JSON response as ServerJsonRpcMessage: {e}: {}",
                                String::from_utf8_lossy(&body[..n])
                            ),
                        )))
                    }
                }
            }
            _ if awaits_no_response => Ok(StreamableHttpPostResponse::Accepted),
            _ => Err(StreamableHttpError::UnexpectedContentType(content_type)),
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Failure> {
        let request = self
            .0
            .delete(uri.as_ref())
            .header(SESSION_ID, session_id.as_ref());
        let request = with_headers(request, auth_header, custom_headers)?;
        let response = request.send().await.map_err(client_error)?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(());
        }
        response.error_for_status().map_err(client_error)?;
        Ok(())
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Failure> {
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default().max_sse_event_size,
        )
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Failure> {
        let mut request = self
            .0
            .get(uri.as_ref())
            .header(ACCEPT, format!("{EVENT_STREAM}, {JSON}"));
        if let Some(id) = session_id {
            request = request.header(SESSION_ID, id.as_ref());
        }
        if let Some(id) = last_event_id {
            request = request.header(LAST_EVENT_ID, id);
        }
        let request = with_headers(request, auth_header, custom_headers)?;
        let response = request.send().await.map_err(client_error)?;
        let status = response.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if let Some(e) = challenge(status, response.headers()) {
            return Err(e);
        }
        if let Some(e) = status_error(status, response.headers()) {
            return Err(e.into());
        }
        let response = response.error_for_status().map_err(client_error)?;
        match response.headers().get(CONTENT_TYPE) {
            Some(ct)
                if media_type_is(ct.as_bytes(), EVENT_STREAM)
                    || media_type_is(ct.as_bytes(), JSON) => {}
            other => {
                return Err(StreamableHttpError::UnexpectedContentType(
                    other.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
                ))
            }
        }
        Ok(sse_body(response, max_sse_event_size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_ignore_case_and_parameters() {
        let cases = [
            ("application/json", JSON, true),
            ("Application/JSON; charset=utf-8", JSON, true),
            ("application/json-seq", JSON, false),
            ("text/event-stream", EVENT_STREAM, true),
            ("text/event-streaming", EVENT_STREAM, false),
        ];
        for (value, expected, want) in cases {
            assert_eq!(media_type_is(value.as_bytes(), expected), want, "{value}");
        }
    }
}
