//! `vectorstep serve`: open the store, bind HTTP, sweep and resume interrupted runs,
//! serve until SIGTERM/SIGINT, then drain (SPEC 6.6) and exit 0. The store's lock
//! (`store::lock`) is held from before the store is opened until the very end.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::validate::load_pipelines;
use super::{load_acting_config, Cli};
use vectorstep::clock::SystemClock;
use vectorstep::executor::Executors;
use vectorstep::http::{router, AppState};
use vectorstep::runner::{outbox, sweep, Engine};
use vectorstep::store::lock::ServeLock;
use vectorstep::store::ReplicaKind;

pub fn serve(cli: &Cli) -> anyhow::Result<i32> {
    let config = Arc::new(load_acting_config(&cli.config)?);
    super::init_logging(&config, &config.logging.level);
    check_exposure(&config)?;
    // First of all: a second `serve` on this store stops here, before it binds,
    // sweeps or migrates anything. Held (and its file removed) until `serve` returns.
    // On SQLite a lock file beside the database. On PostgreSQL any number of
    // `serve` processes share the store: each leases the runs it drives.
    let store_lock = match &config.database_url {
        Some(_) => None,
        None => Some(ServeLock::acquire(&config.database_path)?),
    };
    if let Some(lock) = &store_lock {
        tracing::debug!(lock = %lock.path().display(), "Store lock taken.");
    }
    let set = load_pipelines(&config, &[])?;
    let store = super::open_store(&config)?;
    // Built before anything starts, so a bad `api_url` stops the start with a
    // config error instead of failing every send later.
    let telegram = match &config.telegram {
        Some(t) => Some(vectorstep::telegram::Client::standalone(t)?),
        None => None,
    };
    let metrics = vectorstep::telemetry::install_prometheus()
        .context("cannot install the metrics recorder")?;
    vectorstep::telemetry::zero_pipeline_counters(set.pipelines.iter().map(|p| p.name.as_str()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        // Taken first: from here on a SIGHUP reloads (once ready) instead of
        // killing the process, which is its default action.
        let hangups = hangup_signals();
        let engine = Engine::new(config.clone(), set, store, Executors::standard(&config), Arc::new(SystemClock));
        // On a shared store this process is a replica with an id of its own, and
        // every run it creates or adopts is leased to it (runner::leases).
        let replica_id = engine.store.is_shared().then(vectorstep::runner::replica::new_id);
        if let Some(id) = &replica_id {
            let lease_ms = config.replica.lease_seconds.saturating_mul(1000);
            engine.lease_runs_as(Arc::new(vectorstep::runner::leases::LeaseBook::new(id, lease_ms)));
        }
        // Runs waiting for a human hold no task here (runner::park).
        engine.enable_parking();
        // Human steps send through Telegram and its messages show decisions.
        vectorstep::telegram::attach(&engine);
        let state = AppState::new(engine.clone(), Some(metrics));
        let addr = format!("{}:{}", config.server.host, config.server.port);
        let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        tracing::info!(address = %local, pipelines = engine.pipelines().len(), "Listening.");
        // Tests and supervisors read the bound port from this line.
        super::logging::announce(
            &format!("vectorstep listening on http://{local}"),
            [("address".to_string(), serde_json::Value::from(local.to_string()))].into_iter().collect(),
        );
        let (stop_http, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let app = router(state.clone());
        let limits = http_limits(&config);
        tracing::info!(max_connections = limits.max_connections, "Connection limits set.");
        let server = tokio::spawn(vectorstep::http::server::serve(listener, app, limits, async move {
            let _ = stop_rx.await;
        }));

        // Start-up: deliver notifications an earlier process recorded but did not
        // send, and sweep runs left `running` and resume the durable ones. Delivery
        // runs on its own task: a notification peer that hangs (up to its 30 s
        // timeout, per notification) must not hold back readiness or resumes. The
        // outbox's claim set keeps it from racing a run's own delivery. The same
        // task retries failed deliveries until shutdown (runner::outbox).
        // On a shared store: registered before anything is resumed, heartbeating
        // until its runs are drained and let go (`stop_heartbeat`).
        let (stop_heartbeat, heartbeat_stop) = tokio::sync::watch::channel(false);
        let heartbeat = match replica_id {
            Some(id) => {
                let liveness = vectorstep::runner::replica::register(&engine, &id, ReplicaKind::Serve).await?;
                // Without it the other replicas would take this one's runs as a dead
                // replica's at every sweep.
                anyhow::ensure!(
                    liveness.is_held(),
                    "cannot take this replica's liveness lock on {}: a `vectorstep store copy` may be using the database; wait for it to finish",
                    engine.store.name()
                );
                Some(tokio::spawn(vectorstep::runner::replica::heartbeat(engine.clone(), id, ReplicaKind::Serve, liveness, heartbeat_stop)))
            }
            None => None,
        };
        outbox::start_retries(engine.services());
        // On a shared store only what nobody else drives (runner::adopt).
        let resumable = if engine.store.is_shared() {
            vectorstep::runner::adopt::claim_orphans(&engine, vectorstep::runner::adopt::SweepCause::Start).await?
        } else {
            sweep::sweep(&engine).await?
        };
        engine.refresh_approvals_gauge();
        {
            // In waves, on its own task: readiness does not wait for thousands of
            // resumes, and they do not all hold their transient state at once.
            let engine = engine.clone();
            tokio::spawn(async move { sweep::resume_all(&engine, resumable).await });
        }
        // Runs of `vectorstep run` processes that die from now on are adopted too;
        // on a shared store, so are the runs of replicas that die.
        let owners = tokio::spawn(sweep::watch_owners(engine.clone()));
        let orphans = engine.store.is_shared().then(|| tokio::spawn(vectorstep::runner::adopt::watch(engine.clone())));
        let scheduler = tokio::spawn(vectorstep::runner::schedule::run(engine.clone()));
        // After the sweep, so a press for a run that was just interrupted is answered
        // "already decided" instead of deciding it. Stops by itself when shutdown begins.
        let poller = telegram.map(|client| tokio::spawn(vectorstep::telegram::poller::run(engine.approval_desk(), client)));
        let retention = tokio::spawn(vectorstep::runner::retention::run(engine.clone()));
        state.ready.store(true, Ordering::SeqCst);
        tracing::info!("Ready.");
        let reloader = hangups.map(|h| tokio::spawn(reload_on_hangup(engine.clone(), h)));

        wait_for_signal().await;
        tracing::warn!(grace_seconds = config.durability.shutdown_grace_seconds, "Shutdown requested: draining in-flight steps.");
        state.accepting.store(false, Ordering::SeqCst);
        engine.begin_shutdown();
        let idle = engine.wait_idle(Duration::from_secs(config.durability.shutdown_grace_seconds)).await;
        if !idle {
            tracing::warn!(still_running = engine.active_runs(), "Grace period over; steps still in flight will be re-run or escalated on the next start.");
        }
        scheduler.abort();
        owners.abort();
        if let Some(o) = orphans {
            o.abort();
        }
        if idle {
            // Every run stopped at a step boundary: hand them over at once.
            vectorstep::runner::adopt::release_all(&engine).await;
        }
        if let Some(p) = poller {
            p.abort();
        }
        retention.abort();
        if let Some(r) = reloader {
            r.abort();
        }
        // Only now, with nothing in flight or the leases let go: it records that
        // this replica stopped and gives up its liveness lock.
        let _ = stop_heartbeat.send(true);
        if let Some(h) = heartbeat {
            let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
        }
        // MCP servers end with the service: sessions closed, stdio groups killed.
        engine.mcp.shutdown().await;
        let _ = stop_http.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        tracing::info!("Stopped.");
        Ok(0)
    });
    // The runtime's tasks hold store handles; once they are gone the writer has
    // committed everything, and only then may another `serve` take the store.
    drop(rt);
    drop(store_lock);
    result
}

/// The HTTP limits from config, with the connection bound derived from the
/// open-files limit (raised to its hard limit first).
fn http_limits(config: &vectorstep::config::Config) -> vectorstep::http::server::Limits {
    use vectorstep::http::server;
    server::Limits::from_config(&config.server, server::raise_open_files_limit())
}

/// Refuses an open API on a non-loopback address (unless the operator says so)
/// and warns loudly about what is open.
fn check_exposure(config: &vectorstep::config::Config) -> anyhow::Result<()> {
    let host = config
        .server
        .host
        .trim_start_matches('[')
        .trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !config.auth_enabled() {
        if !loopback && !config.server.allow_unauthenticated {
            anyhow::bail!(
                "refusing to listen on {host} with no auth configured: anyone who can reach it could read every run, \
                 decide approvals and cancel runs. Configure auth.operators and auth.teams tokens, listen on 127.0.0.1, \
                 or set server.allow_unauthenticated: true if a proxy in front authenticates every request"
            );
        }
        tracing::warn!(host = %host, "No auth configured: every route is open to anyone who can reach {host}. \
            Set auth.operators (and auth.teams) tokens to protect runs, approvals and cancels.");
    } else if config.auth_operators.is_empty() {
        tracing::warn!(
            "auth.teams is set but auth.operators is empty: nobody can read runs, list approvals, \
            cancel or decide through the API (the approval page and Telegram still work)."
        );
    }
    Ok(())
}

#[cfg(unix)]
type Hangups = tokio::signal::unix::Signal;
#[cfg(not(unix))]
type Hangups = ();

#[cfg(unix)]
fn hangup_signals() -> Option<Hangups> {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "Cannot listen for SIGHUP; reload with POST /-/reload.");
            None
        }
    }
}

#[cfg(not(unix))]
fn hangup_signals() -> Option<Hangups> {
    None
}

/// Every SIGHUP reloads the pipelines (`runner::reload`): the outcome is logged
/// there, a refused reload keeps the old set.
async fn reload_on_hangup(engine: Arc<Engine>, mut hangups: Hangups) {
    #[cfg(unix)]
    while hangups.recv().await.is_some() {
        tracing::info!("SIGHUP received: reloading pipelines.");
        let _ = vectorstep::runner::reload::reload(&engine).await;
    }
    #[cfg(not(unix))]
    let _ = (engine, hangups);
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
