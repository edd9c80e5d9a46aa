//! The HTTP server loop: accepts connections and serves the router over HTTP/1.1
//! with the limits a public-facing service needs, which `axum::serve` lacks:
//!
//! - a connection that has not sent a complete request within
//!   `server.header_read_timeout_seconds` (or, between keep-alive requests, within
//!   `server.idle_timeout_seconds`) is closed;
//! - a request body must arrive whole within `server.body_read_timeout_seconds`;
//! - at most `max_connections` are open at once. At the bound, the connection that
//!   has waited longest (at least a second) without sending a request is closed to
//!   make room, so slow or idle clients can never lock out a health check or a
//!   webhook; when no connection can go, new ones wait in the kernel's accept queue.
//!
//! The bound is derived from the open-files limit (raised to its hard limit at
//! start, see [`raise_open_files_limit`]), keeping descriptors back for the store,
//! outbound HTTP and child processes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// The limits the loop enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl Limits {
    /// The limits `server.*` configures, with the connection bound derived from
    /// `open_files` (see [`connection_bound`]).
    pub fn from_config(server: &crate::config::Server, open_files: u64) -> Limits {
        let secs = Duration::from_secs_f64;
        Limits {
            header_read_timeout: secs(server.header_read_timeout_seconds),
            body_read_timeout: secs(server.body_read_timeout_seconds),
            idle_timeout: secs(server.idle_timeout_seconds),
            max_connections: connection_bound(open_files, server.max_connections),
        }
    }
}

/// Descriptors kept back from the connection bound: the store (database, WAL,
/// shared memory, lock), outbound peers, MCP and shell children, logs.
const RESERVED_FDS: u64 = 256;

/// Raises the soft open-files limit to the hard limit (nothing else is needed
/// for 1000s of connections on most hosts) and returns the soft limit now in force.
pub fn raise_open_files_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
        lim.rlim_cur
    }
}

/// The connection bound for an open-files limit: what is left after the reserve,
/// at least 16, and at most `configured` when that is set.
pub fn connection_bound(open_files: u64, configured: Option<usize>) -> usize {
    let available = open_files.saturating_sub(RESERVED_FDS).max(16) as usize;
    match configured {
        Some(c) if c > 0 => c.min(available),
        _ => available.min(100_000),
    }
}

/// How long a connection must have waited for its request before it may be closed
/// to make room for a new one.
const MIN_WAIT_BEFORE_EVICTION: Duration = Duration::from_secs(1);

/// What the loop knows of one open connection. Updated by its requests without
/// the registry's lock: a request only stores into these atomics.
struct Conn {
    /// Nanoseconds since [`epoch`] at which it began waiting for its next request;
    /// [`BUSY`] while one is being served.
    waiting_since: AtomicU64,
    /// Whether it has served a request (then the idle timeout applies).
    served: AtomicBool,
    close: Notify,
}

/// `waiting_since` of a connection serving a request.
const BUSY: u64 = u64::MAX;

/// The clock origin of `waiting_since`.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_nanos() -> u64 {
    Instant::now().duration_since(epoch()).as_nanos() as u64
}

impl Conn {
    fn set_waiting(&self, waiting: bool) {
        if waiting {
            self.served.store(true, Ordering::Relaxed);
            self.waiting_since.store(now_nanos(), Ordering::Relaxed);
        } else {
            self.waiting_since.store(BUSY, Ordering::Relaxed);
        }
    }

    /// Since when it has been waiting, `None` while busy.
    fn waiting(&self) -> Option<u64> {
        match self.waiting_since.load(Ordering::Relaxed) {
            BUSY => None,
            t => Some(t),
        }
    }
}

#[derive(Default)]
struct Registry {
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        match self.conns.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    #[cfg(test)]
    fn set_waiting(&self, id: u64, waiting: bool) {
        if let Some(c) = self.lock().get(&id) {
            c.set_waiting(waiting);
        }
    }

    /// The connection to close to make room: the one that has waited longest for
    /// a request, if it has waited at least `min_age`. A connection younger than
    /// that may be a client whose request is still on its way (a health check that
    /// arrived in a burst of connects), so it is never the one closed.
    fn evictable(conns: &HashMap<u64, Arc<Conn>>, min_age: Duration) -> Option<u64> {
        let cutoff = now_nanos().saturating_sub(min_age.as_nanos() as u64);
        conns
            .iter()
            .filter_map(|(id, c)| c.waiting().map(|t| (*id, t)))
            .filter(|(_, t)| *t <= cutoff)
            .min_by_key(|(_, t)| *t)
            .map(|(id, _)| id)
    }

    /// Whether a new connection can be taken now (under the bound, or one can be
    /// closed to make room). When not, new connections wait in the kernel's queue.
    fn has_room(&self, bound: usize, min_age: Duration) -> bool {
        let conns = self.lock();
        conns.len() < bound || Self::evictable(&conns, min_age).is_some()
    }

    /// Registers a new connection; at the bound, first closes the one waiting
    /// longest for a request (see [`Registry::evictable`]). `None` when none can go.
    fn admit(&self, bound: usize, min_age: Duration) -> Option<(u64, Arc<Conn>)> {
        let mut conns = self.lock();
        if conns.len() >= bound {
            let oldest = Self::evictable(&conns, min_age)?;
            if let Some(c) = conns.remove(&oldest) {
                c.close.notify_one();
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            waiting_since: AtomicU64::new(now_nanos()),
            served: AtomicBool::new(false),
            close: Notify::new(),
        });
        conns.insert(id, conn.clone());
        Some((id, conn))
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Closes every connection that waited past its timeout.
    fn reap(&self, limits: &Limits) -> usize {
        let now = now_nanos();
        let mut conns = self.lock();
        let expired: Vec<u64> = conns
            .iter()
            .filter(|(_, c)| {
                let limit = if c.served.load(Ordering::Relaxed) {
                    limits.idle_timeout
                } else {
                    limits.header_read_timeout
                };
                c.waiting()
                    .is_some_and(|t| now.saturating_sub(t) > limit.as_nanos() as u64)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            if let Some(c) = conns.remove(id) {
                c.close.notify_one();
            }
        }
        expired.len()
    }
}

/// Serves `app` on `listener` under `limits` until `stop` resolves, then lets
/// requests in flight finish (up to 5 s).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl std::future::Future<Output = ()> + Send,
) {
    let registry = Arc::new(Registry::default());
    let reaper = {
        let registry = registry.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let n = registry.reap(&limits);
                if n > 0 {
                    tracing::debug!(
                        closed = n,
                        "Closed connections that sent no request in time."
                    );
                }
            }
        })
    };
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
    let tasks = tokio_util_tracker::Tracker::default();
    tokio::pin!(stop);
    'serve: loop {
        // At the bound with no connection old enough to close: new ones wait in the
        // kernel's accept queue (their clients see a slow connect, not a reset).
        while !registry.has_room(limits.max_connections, MIN_WAIT_BEFORE_EVICTION) {
            tokio::select! {
                _ = &mut stop => break 'serve,
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        let (stream, peer) = tokio::select! {
            _ = &mut stop => break 'serve,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors (EMFILE/ENFILE) or a connection reset before
                    // accept: wait a moment instead of spinning.
                    tracing::warn!(error = %e, "Cannot accept a connection.");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some((id, conn_state)) =
            registry.admit(limits.max_connections, MIN_WAIT_BEFORE_EVICTION)
        else {
            tracing::warn!(peer = %peer, bound = limits.max_connections, "Every connection is busy: closed a new one.");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = RequestService {
            app: app.clone(),
            peer,
            conn: conn_state.clone(),
            body_timeout: limits.body_read_timeout,
        };
        let mut drain = drain_rx.clone();
        let registry = registry.clone();
        let header_timeout = limits.header_read_timeout;
        tasks.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = conn_state.close.notified() => {}
                _ = async { let _ = drain.wait_for(|d| *d).await; } => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(5), conn.as_mut()).await;
                }
            }
            registry.remove(id);
        });
    }
    drop(listener);
    let _ = drain_tx.send(true);
    tasks.wait(Duration::from_secs(6)).await;
    reaper.abort();
}

/// Serves one request: marks its connection busy, gives the router the client's
/// address, reads the body under its deadline, and marks the connection waiting
/// again once the response body has been sent.
#[derive(Clone)]
struct RequestService {
    app: Router,
    peer: SocketAddr,
    conn: Arc<Conn>,
    body_timeout: Duration,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for RequestService {
    type Response = hyper::Response<axum::body::Body>;
    type Error = std::convert::Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, req: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        self.conn.set_waiting(false);
        let deadline = tokio::time::Instant::now() + self.body_timeout;
        let mut req = req.map(|body| {
            axum::body::Body::new(DeadlineBody {
                inner: body,
                sleep: tokio::time::sleep_until(deadline),
            })
        });
        req.extensions_mut().insert(ConnectInfo(self.peer));
        let mut app = self.app.clone();
        let guard = WaitingAgain {
            conn: self.conn.clone(),
        };
        Box::pin(async move {
            // `Router` is always ready: no `poll_ready` needed before `call`.
            let response = match tower_service::Service::call(&mut app, req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok(response.map(|body| {
                axum::body::Body::new(GuardedBody {
                    inner: body,
                    _guard: guard,
                })
            }))
        })
    }
}

/// Marks the connection waiting for its next request when dropped (the response
/// body is done, or the connection went away).
struct WaitingAgain {
    conn: Arc<Conn>,
}

impl Drop for WaitingAgain {
    fn drop(&mut self) {
        self.conn.set_waiting(true);
    }
}

/// The request body has this error when its deadline passes.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within server.body_read_timeout_seconds")]
pub struct BodyTimeout;

pin_project_lite::pin_project! {
    /// A request body that fails once its deadline has passed.
    struct DeadlineBody {
        #[pin]
        inner: hyper::body::Incoming,
        #[pin]
        sleep: tokio::time::Sleep,
    }
}

impl http_body::Body for DeadlineBody {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        match std::future::Future::poll(this.sleep, cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

pin_project_lite::pin_project! {
    /// A response body that carries a guard until it is dropped.
    struct GuardedBody {
        #[pin]
        inner: axum::body::Body,
        _guard: WaitingAgain,
    }
}

impl http_body::Body for GuardedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Keeps count of connection tasks so shutdown can wait for them.
mod tokio_util_tracker {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[derive(Default, Clone)]
    pub struct Tracker {
        live: Arc<(AtomicUsize, tokio::sync::Notify)>,
    }

    impl Tracker {
        pub fn spawn(&self, f: impl std::future::Future<Output = ()> + Send + 'static) {
            let live = self.live.clone();
            live.0.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                f.await;
                live.0.fetch_sub(1, Ordering::SeqCst);
                live.1.notify_waiters();
            });
        }

        pub async fn wait(&self, at_most: Duration) {
            let deadline = tokio::time::Instant::now() + at_most;
            loop {
                let notified = self.live.1.notified();
                if self.live.0.load(Ordering::SeqCst) == 0 {
                    return;
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            header_read_timeout: Duration::from_millis(50),
            body_read_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_millis(200),
            max_connections: 2,
        }
    }

    #[test]
    fn the_bound_leaves_descriptors_for_the_store_and_peers() {
        assert_eq!(connection_bound(1024, None), 768);
        assert_eq!(connection_bound(1024, Some(100)), 100);
        assert_eq!(connection_bound(1024, Some(5000)), 768);
        assert_eq!(connection_bound(100, None), 16);
        assert_eq!(connection_bound(10_000_000, None), 100_000);
    }

    #[test]
    fn at_the_bound_the_longest_waiting_connection_makes_room() {
        let r = Registry::default();
        let age = Duration::from_millis(1);
        let (a, close_a) = r.admit(2, age).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let (b, _) = r.admit(2, age).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        assert!(r.has_room(2, age));
        let (_c, _) = r.admit(2, age).unwrap();
        assert!(
            !r.lock().contains_key(&a),
            "the oldest waiting one was closed"
        );
        assert!(r.lock().contains_key(&b));
        // A connection serving a request is never the one closed.
        let _ = close_a;
        r.set_waiting(b, false);
        std::thread::sleep(Duration::from_millis(2));
        let (_d, _) = r.admit(2, age).unwrap();
        assert!(r.lock().contains_key(&b));
        // A connection that has not waited long enough is not closed either.
        let young = Registry::default();
        young.admit(1, Duration::from_secs(60)).unwrap();
        assert!(!young.has_room(1, Duration::from_secs(60)));
        assert!(young.admit(1, Duration::from_secs(60)).is_none());
        // Every connection busy: the new one is refused.
        let ids: Vec<u64> = r.lock().keys().copied().collect();
        for id in ids {
            r.set_waiting(id, false);
        }
        assert!(!r.has_room(2, age));
        assert!(r.admit(2, age).is_none());
    }

    #[test]
    fn silent_connections_are_reaped_and_busy_ones_are_not() {
        let r = Registry::default();
        let (fresh, _) = r.admit(10, Duration::ZERO).unwrap();
        let (busy, _) = r.admit(10, Duration::ZERO).unwrap();
        let (idle, _) = r.admit(10, Duration::ZERO).unwrap();
        r.set_waiting(busy, false);
        r.set_waiting(idle, true); // served a request: the idle timeout applies
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(r.reap(&limits()), 1);
        assert!(!r.lock().contains_key(&fresh));
        assert!(r.lock().contains_key(&idle));
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(r.reap(&limits()), 1);
        assert!(r.lock().contains_key(&busy));
    }
}
