//! One connected MCP session: the rmcp client service and, for a stdio server,
//! its process group.

use std::collections::HashMap;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use tokio::sync::Mutex;

use super::http::Reqwest12;
use super::stdio::{self, Group};
use crate::config::{McpServer, McpTransport};

/// How long a closing session may take to say goodbye (stdin closed, HTTP
/// session deleted) before it is cut off; a stdio group is killed after it
/// either way.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

pub(super) struct Session {
    peer: Peer<RoleClient>,
    service: Mutex<Option<RunningService<RoleClient, ClientConfig>>>,
    group: Option<Group>,
}

/// What we tell servers about ourselves. The protocol version is the newest
/// one that still has the `initialize` handshake, which every server speaks.
fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("vectorstep", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

impl Session {
    /// Starts or reaches the server and completes the `initialize` handshake
    /// within `limit`. A stdio child that does not finish it in time is killed
    /// with its group. The error is the reason, for `Error::Connect`.
    pub(super) async fn connect(
        name: &str,
        config: &McpServer,
        http: &reqwest::Client,
        limit: Duration,
    ) -> Result<Session, Failure> {
        match &config.transport {
            McpTransport::Stdio { command, env } => {
                let (transport, group) = stdio::spawn(name, command, env)
                    .await
                    .map_err(Failure::Failed)?;
                match tokio::time::timeout(limit, client_config().serve(transport)).await {
                    Ok(Ok(service)) => Ok(Session::new(service, Some(group))),
                    Ok(Err(e)) => {
                        group.kill();
                        Err(Failure::Failed(e.to_string()))
                    }
                    Err(_) => {
                        group.kill();
                        Err(Failure::TimedOut)
                    }
                }
            }
            McpTransport::Http { url, headers } => {
                let headers = header_map(headers).map_err(Failure::Failed)?;
                let transport_config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(headers);
                let transport = StreamableHttpClientTransport::with_client(
                    Reqwest12(http.clone()),
                    transport_config,
                );
                match tokio::time::timeout(limit, client_config().serve(transport)).await {
                    Ok(Ok(service)) => Ok(Session::new(service, None)),
                    Ok(Err(e)) => Err(Failure::Failed(e.to_string())),
                    Err(_) => Err(Failure::TimedOut),
                }
            }
        }
    }

    fn new(service: RunningService<RoleClient, ClientConfig>, group: Option<Group>) -> Session {
        Session {
            peer: service.peer().clone(),
            service: Mutex::new(Some(service)),
            group,
        }
    }

    pub(super) fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// False once the transport closed (the child exited, the HTTP worker
    /// ended): the session cannot answer any more requests.
    pub(super) fn is_alive(&self) -> bool {
        !self.peer.is_transport_closed()
    }

    pub(super) fn is_stdio(&self) -> bool {
        self.group.is_some()
    }

    /// Kills a stdio server's whole process group at once (a timeout: the
    /// server is hung, nothing graceful will work).
    pub(super) fn kill(&self) {
        if let Some(g) = &self.group {
            g.kill();
        }
    }

    /// Ends the session: the service loop is cancelled (stdin closed, the child
    /// reaped; an HTTP session deleted), bounded by [`CLOSE_GRACE`], and a
    /// stdio group is killed whatever is left of it.
    pub(super) async fn close(&self) {
        let service = self.service.lock().await.take();
        if let Some(mut service) = service {
            if let Err(e) = service.close_with_timeout(CLOSE_GRACE).await {
                tracing::debug!(error = %e, "MCP session task ended badly.");
            }
        }
        self.kill();
    }
}

/// A session dropped without [`Session::close`] (the registry dropped without
/// `shutdown`) still takes its stdio server's group with it; rmcp's own guard
/// kills only the server itself.
impl Drop for Session {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Why a connect failed.
pub(super) enum Failure {
    Failed(String),
    TimedOut,
}

fn header_map(
    headers: &std::collections::BTreeMap<String, String>,
) -> Result<HashMap<HeaderName, HeaderValue>, String> {
    let mut out = HashMap::new();
    for (k, v) in headers {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("`{k}` is not a valid HTTP header name"))?;
        let value = HeaderValue::from_str(v)
            .map_err(|_| format!("the value of header `{k}` is not valid"))?;
        out.insert(name, value);
    }
    Ok(out)
}
