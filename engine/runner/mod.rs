//! The driver: performs what `run/` decides. It records every step before and
//! after its executor runs, executes groups concurrently, finishes runs together
//! with the notifications they owe, and resumes runs left `running` by a crash.
//!
//! Invariants kept here:
//! - a unit's record is committed as `running` before its executor is called, and
//!   its terminal record is committed before anything that depends on it starts;
//! - a unit that ends the run is committed in the same transaction as the run's
//!   terminal status, `run_finished` and the notifications it owes, so a crash can
//!   neither continue past it nor lose or repeat those notifications;
//! - branches of a group are recorded one by one as they finish.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::clock::Clock;
use crate::config::Config;
use crate::domain::{ApprovalStatus, RunStatus};
use crate::events::Event;
use crate::executor::Executors;
use crate::pipeline::{Pipeline, PipelineSet};
use crate::run::context::Normalised;
use crate::store::{Outcome, RunRecord, Store, Write};

pub mod adopt;
pub mod agent;
mod branch;
mod call;
mod create;
mod drive;
mod ending;
mod group;
mod human;
pub mod leases;
pub mod outbox;
mod park;
mod persist;
pub mod ports;
pub mod records;
pub mod reload;
mod replay;
pub mod replica;
pub mod retention;
pub mod schedule;
mod services;
mod signals;
mod step;
mod subpipeline;
pub mod sweep;
mod unit;

pub use ports::{ApprovalChange, ApprovalDelivery, ApprovalDesk, ChatChannel};
pub use replay::ReplayRefusal;
pub use services::Services;
#[doc(hidden)]
pub use signals::RetainedSizes;

/// Why the runner could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    #[error("no pipeline named `{0}` is loaded")]
    UnknownPipeline(String),
    #[error("run `{0}` does not exist")]
    UnknownRun(String),
    #[error("stored run `{run_id}` is unreadable: {detail}")]
    CorruptRun { run_id: String, detail: String },
}

/// A reserved run slot (see [`Engine::try_admit`]).
pub struct Admission {
    engine: Option<Arc<Engine>>,
}

impl Admission {
    /// Drives `run_id` in the background on this slot.
    pub fn spawn(mut self, run_id: String) -> tokio::task::JoinHandle<Result<RunEnd, Error>> {
        let engine = self.engine.take();
        tokio::spawn(async move {
            match engine {
                Some(e) => e.drive_counted(&run_id, DriveMode::New, None).await,
                None => Err(Error::UnknownRun(run_id)),
            }
        })
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(e) = self.engine.take() {
            e.release_slot();
        }
    }
}

/// How a call to [`Engine::drive`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// The run reached this terminal status.
    Finished(RunStatus),
    /// Shutdown stopped the run at a step boundary; it stays `running` to be resumed.
    Drained,
    /// The run waits for a human decision without a task (see `park`); it is driven
    /// again when the decision, the deadline or a cancellation arrives.
    Parked,
}

/// Why a run is being driven (see [`Engine::drive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriveMode {
    /// Just created by `create_run`: no records yet.
    New,
    /// Picked up by the startup sweep: its records are read and `run_resumed` is
    /// logged.
    Resume,
    /// Its parked approval was decided, timed out or the run was cancelled. The
    /// engine drives parked runs itself; callers use `New` or `Resume`.
    Unpark,
}

/// The result of asking for a new run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    Inserted(String),
    /// A run with the same pipeline and dedup fingerprint is running, or was
    /// triggered inside the dedup window.
    Duplicate {
        run_id: String,
        reason: String,
    },
}

/// Where a child run hangs off its parent.
#[derive(Debug, Clone)]
pub struct ParentLink {
    pub run_id: String,
    pub step_path: String,
}

/// The `kv` key under which `serve` stores a cancel request for a run another
/// process (`vectorstep run`) drives; the value is who asked (may be empty).
pub fn cancel_request_key(run_id: &str) -> String {
    format!("cancel_request:{run_id}")
}

/// Who decided an approval: the name recorded as `by`, the channel it came
/// through (`page`, `api`, `telegram`, ...) and, for the web, the client address.
#[derive(Debug, Clone)]
pub struct Decider {
    pub by: String,
    pub via: Option<&'static str>,
    pub client: Option<String>,
}

/// The engine owns the runs of this process: it records new runs, admits and
/// drives them, parks and unparks them, and decides approvals. What a running unit
/// may use is its [`Services`], to which the engine derefs (so `engine.store`,
/// `engine.now_ms()` read as before).
pub struct Engine {
    services: Arc<Services>,
    pipelines: RwLock<Arc<PipelineSet>>,
    /// Definitions a reload replaced that runs may still use (`reload`).
    retained: Mutex<reload::Retained>,
    /// Counts the reloads that replaced the set; the scheduler follows it.
    reload_generation: tokio::sync::watch::Sender<u64>,
    /// One reload at a time.
    reload_lock: tokio::sync::Mutex<()>,
    idle: tokio::sync::Notify,
    /// Runs `create_run` just recorded and no driver has picked up yet, with their
    /// trigger: the first drive of a new run starts from these instead of reading
    /// back and re-parsing the row it has just written (see `take_fresh`).
    fresh: Mutex<std::collections::HashMap<String, Box<FreshRun>>>,
    /// The `vectorstep run` process that owns every run this engine creates (the
    /// name of its lock, see `store::lock`); unset in `serve`, whose runs are unowned.
    owner: std::sync::OnceLock<String>,
}

impl std::ops::Deref for Engine {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.services
    }
}

/// A run as `create_run` recorded it, without its JSON copies (the driver keeps
/// only what the loop needs).
pub(crate) struct FreshRun {
    pub run: RunRecord,
    pub trigger: Normalised,
    /// The first step's `running` record, committed with the run.
    pub opened: Option<crate::store::StepRecord>,
    /// A replay's copied step rows, committed with the run: the first drive
    /// plans from them as a resume would (empty for any other run).
    pub copied: Vec<crate::store::StepRecord>,
}

impl Engine {
    pub fn new(
        config: Arc<Config>,
        pipelines: PipelineSet,
        store: Store,
        executors: Executors,
        clock: Arc<dyn Clock>,
    ) -> Arc<Engine> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        Arc::new(Engine {
            services: Arc::new(Services::new(config, store, executors, http, clock)),
            pipelines: RwLock::new(Arc::new(pipelines)),
            retained: Mutex::new(reload::Retained::default()),
            reload_generation: tokio::sync::watch::Sender::new(0),
            reload_lock: tokio::sync::Mutex::new(()),
            idle: tokio::sync::Notify::new(),
            fresh: Mutex::new(std::collections::HashMap::new()),
            owner: std::sync::OnceLock::new(),
        })
    }

    /// What the units of this engine's runs use.
    pub fn services(&self) -> &Arc<Services> {
        &self.services
    }

    /// Marks every run this engine creates from now on as owned by `owner`, a
    /// `vectorstep run` process holding the lock of that name. `serve` leaves such
    /// runs alone while the lock is held (see `sweep`). Set once; later calls are
    /// ignored.
    pub fn set_owner(&self, owner: &str) {
        let _ = self.owner.set(owner.to_string());
    }

    /// The owner set by [`Engine::set_owner`].
    pub fn owner(&self) -> Option<&str> {
        self.owner.get().map(String::as_str)
    }

    pub fn pipelines(&self) -> Arc<PipelineSet> {
        match self.pipelines.read() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn pipeline(&self, name: &str) -> Option<Arc<Pipeline>> {
        self.pipelines().get(name).cloned()
    }

    /// Drives `run_id` until it ends or shutdown drains it. [`DriveMode::Resume`]
    /// is for a run picked up by the startup sweep; [`DriveMode::New`] only for a
    /// run just created, which has no records yet.
    pub fn drive<'a>(
        self: &'a Arc<Self>,
        run_id: &'a str,
        mode: DriveMode,
    ) -> crate::executor::BoxFuture<'a, Result<RunEnd, Error>> {
        self.active.fetch_add(1, Ordering::SeqCst);
        self.drive_counted(run_id, mode, None)
    }

    /// Drives a run already counted in `active` (by `drive` or an [`Admission`]).
    fn drive_counted<'a>(
        self: &'a Arc<Self>,
        run_id: &'a str,
        mode: DriveMode,
        wave: Option<sweep::WaveTicket>,
    ) -> crate::executor::BoxFuture<'a, Result<RunEnd, Error>> {
        // Boxed with an explicit `Send` bound: runs nest (sub-pipelines), and the
        // box breaks the recursive future type.
        Box::pin(async move {
            self.report_in_progress();
            // Every log line of the run carries its id.
            let span = tracing::info_span!("run", run_id = %run_id);
            let result = tracing::Instrument::instrument(
                drive::drive(self.clone(), run_id.to_string(), mode, wave),
                span,
            )
            .await;
            if let Err(e) = &result {
                if persist::must_close(self, e) {
                    // Closed (once the store takes writes) while still counted in
                    // progress: a run is never left `running` with nobody driving it.
                    tracing::error!(run_id = %run_id, error = %e, "Run driver failed; the run is closed as failed.");
                    persist::close_failed(self, run_id, e).await;
                } else if matches!(e, Error::UnknownRun(_)) {
                    tracing::error!(run_id = %run_id, error = %e, "Run driver failed.");
                } else if persist::lost_lease(e) {
                    tracing::warn!(run_id = %run_id, error = %e, "Stopped driving the run: another replica has taken it over, and nothing more of this drive was recorded.");
                } else {
                    tracing::warn!(run_id = %run_id, error = %e, "Run driver stopped during shutdown with the store unwritable; the run stays running and resumes on the next start.");
                }
            }
            if !matches!(result, Ok(RunEnd::Parked)) {
                // Nothing in this process asks about the run again until a new drive
                // starts it afresh; a parked run keeps its state for that drive.
                self.signals.forget_run(run_id);
            }
            if matches!(result, Ok(RunEnd::Finished(_)))
                || result.as_ref().is_err_and(persist::lost_lease)
            {
                // Ended, or lost: no more commits for it here. A drained run keeps
                // its lease (released at shutdown, renewed meanwhile); a parked
                // run's lease was parked before it parked (`leases::park_lease`).
                if let Some(book) = self.leases() {
                    book.forget(run_id);
                }
            }
            self.release_slot();
            result
        })
    }

    /// The run `create_run` recorded as `run_id`, if no driver has taken it yet.
    pub(crate) fn take_fresh(&self, run_id: &str) -> Option<FreshRun> {
        let mut map = self.fresh.lock().ok()?;
        let taken = map.remove(run_id);
        if map.is_empty() && map.capacity() > 1024 {
            // A burst grew the table; do not keep its peak size for the process's life.
            map.shrink_to_fit();
        }
        taken.map(|b| *b)
    }

    fn release_slot(&self) {
        let left = self.active.fetch_sub(1, Ordering::SeqCst) - 1;
        self.report_in_progress();
        if left == 0 {
            self.idle.notify_waiters();
        }
    }

    /// Starts driving a run in the background.
    pub fn spawn(
        self: &Arc<Self>,
        run_id: String,
        mode: DriveMode,
    ) -> tokio::task::JoinHandle<Result<RunEnd, Error>> {
        // Counted before the task starts, so the concurrency cap and the drain
        // never see a gap between acceptance and the run being driven.
        self.active.fetch_add(1, Ordering::SeqCst);
        let engine = self.clone();
        tokio::spawn(async move { engine.drive_counted(&run_id, mode, None).await })
    }

    /// Starts resuming a run as part of a start-up wave (see `sweep::resume_all`).
    pub(crate) fn spawn_resume(self: &Arc<Self>, run_id: String, ticket: sweep::WaveTicket) {
        self.active.fetch_add(1, Ordering::SeqCst);
        let engine = self.clone();
        tokio::spawn(async move {
            engine
                .drive_counted(&run_id, DriveMode::Resume, Some(ticket))
                .await
        });
    }

    /// Takes one of `max` run slots, or `None` when all are taken. The slot is
    /// held from before the run is recorded until it ends, so a burst of requests
    /// cannot all pass the cap at once. Dropping an unused admission frees it.
    pub fn try_admit(self: &Arc<Self>, max: usize) -> Option<Admission> {
        self.active
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Admission {
                engine: Some(self.clone()),
            })
    }

    /// Asks a run to stop at its next step boundary.
    pub fn cancel(self: &Arc<Self>, run_id: &str) {
        self.cancel_by(run_id, None);
    }

    /// Asks a run to stop at its next step boundary, recording who asked in its
    /// `run_cancelled` event.
    pub fn cancel_by(self: &Arc<Self>, run_id: &str, by: Option<&str>) {
        self.signals.cancel(run_id, by);
        tracing::info!(run_id = %run_id, by = by.unwrap_or(""), "Cancel requested.");
        // A run parked on an approval stops now rather than at its next poll.
        if let Ok(list) = self.store.approvals_of_run(run_id) {
            for a in list.iter().filter(|a| a.status == ApprovalStatus::Pending) {
                if let Some(signal) = self.existing_approval_signal(&a.token) {
                    signal.notify_waiters();
                }
            }
        }
        if !self.unpark_run(run_id) {
            // Parked by another replica: driven on from here, where the cancel is known.
            self.unpark_shared(run_id);
        }
    }

    /// Waits until no run is being driven, or `grace` passes. Returns whether idle.
    pub async fn wait_idle(&self, grace: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let notified = self.idle.notified();
            if self.active_runs() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.active_runs() == 0;
            }
        }
    }

    /// Decides a pending approval; the first decision wins.
    pub async fn decide_approval(
        self: &Arc<Self>,
        token: &str,
        approve: bool,
        by: &str,
    ) -> Result<Outcome, Error> {
        let decider = Decider {
            by: by.to_string(),
            via: None,
            client: None,
        };
        self.decide_approval_by(token, approve, &decider).await
    }

    /// Decides a pending approval, recording who decided, through what, and from
    /// where, in the run log and the service log. The first decision wins.
    pub async fn decide_approval_by(
        self: &Arc<Self>,
        token: &str,
        approve: bool,
        decider: &Decider,
    ) -> Result<Outcome, Error> {
        let by = decider.by.as_str();
        let now = self.now_ms();
        let status = if approve {
            ApprovalStatus::Approved
        } else {
            ApprovalStatus::Rejected
        };
        let Some(a) = self.store.approval(token)? else {
            return Ok(Outcome::ApprovalUnknown);
        };
        let ev = Event::ApprovalDecided {
            step: a.step_path.clone(),
            token: token.to_string(),
            decision: status,
            by: by.to_string(),
            via: decider.via.map(str::to_string),
            client: decider.client.clone(),
        }
        .write(
            &a.run_id,
            now,
            format!("Approval for {} {status} by {by}", a.step_path),
        );
        let decide = Write::DecideApproval {
            token: token.to_string(),
            status,
            by: Some(by.to_string()),
            at: now,
        };
        let outcome = self
            .store
            .commit(vec![decide])
            .await?
            .into_iter()
            .next()
            .unwrap_or(Outcome::ApprovalUnknown);
        if outcome == Outcome::ApprovalDecided {
            // Logged only for the decision that won, after it is durable.
            self.store.commit(vec![ev]).await?;
            // At warn, beside "Approval requested": who decided is the audit trail.
            tracing::info!(target: "vectorstep::approval", run_id = %a.run_id, step = %a.step_path, decision = %status, by = %by,
                via = decider.via.unwrap_or("api"), client = decider.client.as_deref().unwrap_or(""),
                "Approval {status} by {by}.");
            crate::telemetry::approval_decided(&a.pipeline_name, status.as_str());
            self.refresh_approvals_gauge();
            // A wait in a task wakes at once; for a parked run, a delivery still
            // retrying stops now. Nobody listening means nothing to wake.
            if !self.unpark(token) {
                // Parked by another replica (or by one that is gone): driven on
                // from here if nobody claims it first.
                self.unpark_shared(&a.run_id);
            }
            if let Some(signal) = self.existing_approval_signal(token) {
                signal.notify_waiters();
            }
            self.publish(ApprovalChange::Decided {
                token: token.to_string(),
            });
        }
        Ok(outcome)
    }
}

/// How sub-pipeline steps reach this engine (see `unit::ChildRuns`).
impl unit::ChildRuns for Engine {
    fn pipeline(&self, name: &str) -> Option<Arc<Pipeline>> {
        Engine::pipeline(self, name)
    }

    fn create<'a>(
        &'a self,
        pipeline: &'a Pipeline,
        trigger: &'a Normalised,
        parent: ParentLink,
    ) -> crate::executor::BoxFuture<'a, Result<Created, Error>> {
        Box::pin(async move {
            self.create_run(
                pipeline,
                trigger,
                &serde_json::json!({}),
                Some(parent),
                None,
            )
            .await
        })
    }

    fn drive(self: Arc<Self>, run_id: String) -> tokio::task::JoinHandle<Result<RunEnd, Error>> {
        self.spawn(run_id, DriveMode::New)
    }

    fn cancel(self: Arc<Self>, run_id: &str) {
        Engine::cancel(&self, run_id);
    }
}
