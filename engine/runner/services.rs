//! What a unit may use while it runs: the store, the executors, the clock, the
//! configuration, the HTTP client, the MCP sessions and the approval signals (cancellations, approval
//! wake-ups, parked waits, approval changes). Units get an `Arc<Services>`, never
//! the [`Engine`](super::Engine): starting, driving and admitting runs stays with
//! the engine, and the one thing a unit needs of it (a sub-pipeline's child run)
//! goes through the small [`ChildRuns`](super::unit::ChildRuns) trait.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::park::Parking;
use super::ports::{self, ApprovalChange, ChatChannel};
use super::signals::{RetainedSizes, RunSignals};
use crate::clock::Clock;
use crate::config::Config;
use crate::executor::Executors;
use crate::store::Store;

pub struct Services {
    pub store: Store,
    pub config: Arc<Config>,
    pub executors: Executors,
    pub http: reqwest::Client,
    pub clock: Arc<dyn Clock>,
    /// One MCP session per server of `mcp_servers`, shared by every agent step.
    pub mcp: crate::mcp::McpServers,
    shutdown: tokio::sync::watch::Sender<bool>,
    /// Runs being driven by a task in this process (their slots, see
    /// `Engine::try_admit`); with the parked runs, `runs_in_progress`.
    pub(super) active: AtomicUsize,
    /// Cancellations, approval wake-ups and used approvals of the runs in progress,
    /// dropped when a run's driver ends (see `signals`).
    pub(super) signals: RunSignals,
    /// Subscribers of approval changes (see `ports`).
    changes: ports::Changes,
    /// The chat human steps deliver requests through, installed at start (`ports`).
    chat: std::sync::OnceLock<Arc<dyn ChatChannel>>,
    /// Notification ids being sent right now, so two deliverers never send one twice.
    pub(crate) delivering: Mutex<HashSet<String>>,
    /// Set by `outbox::start_retries` (`serve`): a failed delivery stays pending and
    /// is retried. A one-shot process tries once and records the failure.
    pub(crate) outbox_retrying: AtomicBool,
    /// Runs parked on approvals (see `park`).
    pub(super) parking: Mutex<Parking>,
    pub(super) parking_changed: tokio::sync::Notify,
    parking_enabled: AtomicBool,
    /// The run leases of this replica on a shared store (see `leases`); unset on
    /// SQLite and in `vectorstep run`.
    leases: std::sync::OnceLock<Arc<super::leases::LeaseBook>>,
}

impl Services {
    pub(super) fn new(
        config: Arc<Config>,
        store: Store,
        executors: Executors,
        http: reqwest::Client,
        clock: Arc<dyn Clock>,
    ) -> Services {
        let (shutdown, _) = tokio::sync::watch::channel(false);
        let mcp = crate::mcp::McpServers::new(&config.mcp_servers, http.clone());
        Services {
            mcp,
            store,
            config,
            executors,
            http,
            clock,
            shutdown,
            active: AtomicUsize::new(0),
            signals: RunSignals::default(),
            changes: ports::Changes::default(),
            chat: std::sync::OnceLock::new(),
            delivering: Mutex::new(HashSet::new()),
            outbox_retrying: AtomicBool::new(false),
            parking: Mutex::new(Parking::default()),
            parking_changed: tokio::sync::Notify::new(),
            parking_enabled: AtomicBool::new(false),
            leases: std::sync::OnceLock::new(),
        }
    }

    /// Makes this process a replica that leases its runs (`serve` on a shared
    /// store), before any run is created or resumed. Set once. Its effect requests
    /// name it from now on (`X-Vectorstep-Replica`).
    pub fn lease_runs_as(&self, book: Arc<super::leases::LeaseBook>) {
        crate::executor::http::set_replica(book.replica());
        let _ = self.leases.set(book);
    }

    /// This replica's leases, on a shared store.
    pub fn leases(&self) -> Option<&super::leases::LeaseBook> {
        self.leases.get().map(Arc::as_ref)
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    pub fn is_cancelled(&self, run_id: &str) -> bool {
        self.signals.is_cancelled(run_id)
    }

    /// Who cancelled `run_id`, if it was cancelled by someone known.
    pub fn cancelled_by(&self, run_id: &str) -> Option<String> {
        self.signals.cancelled_by(run_id)
    }

    /// How many per-run entries (cancellations, approval wake-ups, used approvals)
    /// the engine holds; all zero once no run is in progress. For tests.
    #[doc(hidden)]
    pub fn retained_sizes(&self) -> RetainedSizes {
        self.signals.sizes()
    }

    /// Stops starting new steps; steps in flight finish and are recorded.
    pub fn begin_shutdown(&self) {
        // `send_replace`, not `send`: `send` refuses to store the value when no
        // receiver exists (the usual case: only human waits subscribe), which left
        // `is_shutting_down` false and let runs go on starting steps during a drain.
        self.shutdown.send_replace(true);
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// A receiver that changes when shutdown begins.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Number of runs being driven by this process.
    pub fn active_runs(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// `runs_in_progress`: runs driven by a task plus runs parked on an approval.
    pub(super) fn report_in_progress(&self) {
        crate::telemetry::runs_in_progress(self.active_runs() + self.parked_runs());
    }

    /// The wake-up for waiters on `token`, an approval of `run_id`; kept until the
    /// run's driver ends.
    pub(crate) fn approval_signal(&self, run_id: &str, token: &str) -> Arc<tokio::sync::Notify> {
        self.signals.approval(run_id, token)
    }

    /// The signal of `token` if something (a wait, a delivery) listens on it.
    pub(super) fn existing_approval_signal(&self, token: &str) -> Option<Arc<tokio::sync::Notify>> {
        self.signals.existing_approval(token)
    }

    /// Sets `vectorstep_human_approvals_pending` from the store (production only).
    pub fn refresh_approvals_gauge(&self) {
        if let Ok(n) = self.store.count_pending_production_approvals() {
            crate::telemetry::approvals_pending(n as usize);
        }
    }

    /// Installs the chat that human steps deliver `telegram` requests through. Set
    /// once at start; later calls are ignored. Without one, such a request fails to
    /// deliver (and stays decidable on the approvals page).
    pub fn set_chat_channel(&self, chat: Arc<dyn ChatChannel>) {
        let _ = self.chat.set(chat);
    }

    pub(crate) fn chat_channel(&self) -> Option<&Arc<dyn ChatChannel>> {
        self.chat.get()
    }

    /// Every [`ApprovalChange`] from now on, in the order they were published.
    pub fn approval_changes(&self) -> tokio::sync::mpsc::UnboundedReceiver<ApprovalChange> {
        self.changes.subscribe()
    }

    pub(crate) fn publish(&self, change: ApprovalChange) {
        self.changes.publish(change);
    }

    pub(crate) fn parking_enabled(&self) -> bool {
        self.parking_enabled.load(Ordering::SeqCst)
    }

    /// Turns parking on; `true` the first time (the caller starts the keeper).
    pub(super) fn turn_parking_on(&self) -> bool {
        !self.parking_enabled.swap(true, Ordering::SeqCst)
    }

    pub(super) fn parking(&self) -> MutexGuard<'_, Parking> {
        match self.parking.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Number of runs parked on an approval.
    pub fn parked_runs(&self) -> usize {
        self.parking().len()
    }

    /// Registers a run as parked on `token` until `deadline_at` (unix ms). The
    /// keeper (started with parking) acts on its deadline.
    pub(crate) fn park(&self, token: &str, run_id: &str, deadline_at: i64) {
        let earliest = self.parking().insert(token, run_id, deadline_at);
        if earliest {
            // The keeper sleeps until the earliest deadline it knew of.
            self.parking_changed.notify_one();
        }
        self.report_in_progress();
    }

    /// Takes `token` back from the parked set; `true` if the caller now owns the run.
    pub(crate) fn claim_parked(&self, token: &str) -> bool {
        let taken = self.parking().remove(token).is_some();
        if taken {
            self.report_in_progress();
        }
        taken
    }
}
