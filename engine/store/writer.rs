//! The single writer thread and its group commit.
//!
//! Every write in the process goes through one thread that owns the only read-write
//! connection. It takes one batch, drains every batch already queued behind it, and
//! applies them all in one transaction, each inside its own SAVEPOINT: a failing batch
//! is rolled back alone and only its caller sees the error, while everybody else
//! shares a single COMMIT and therefore a single fsync. That is what lets hundreds of
//! concurrent runs persist every step without each paying for its own disk flush.
//!
//! The thread also keeps the store's [`Health`]: before each group it checks that the
//! database path still names the open file (a group is never committed into a deleted
//! file), it marks the store unwritable when a group fails for a transient reason and
//! probes it every second until a write succeeds, and it keeps the WAL file bounded
//! (see `connection::WAL_FORCE_CHECKPOINT_BYTES`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::oneshot;
use tracing::{debug, error, warn};

use super::connection::{now_ms, WAL_FORCE_CHECKPOINT_BYTES};
use super::copy::{self, CopyTable};
use super::error::is_transient;
use super::error::DbError;
use super::health::Health;
use super::sql::CopyValue;
use super::sql::Db;
use super::{approvals, events, journal, kv, notifications, replicas, runs, steps};
use super::{
    ApprovalRecord, DelegationRecord, Error, EventRecord, NotificationRecord, ReplicaKind,
    RunRecord, StepRecord, ToolCallRecord, TurnRecord,
};
use crate::domain::{ApprovalStatus, NotificationStatus, RunStatus};

/// One change to the store. A caller's `Vec<Write>` is applied atomically, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Inserts a run, unless it is `running` with a `dedup_fingerprint` and another
    /// running run of the same pipeline has that fingerprint.
    InsertRun(RunRecord),
    /// Like `InsertRun`, but a run of the same pipeline and dedup fingerprint
    /// triggered at or after `window_start` (any status) also suppresses it. The
    /// check and the insert happen in the writer, so a burst of identical alerts
    /// yields exactly one run.
    InsertRunDedup {
        run: RunRecord,
        window_start: i64,
    },
    /// Inserts or completely replaces the step at `(run_id, step_path)`.
    UpsertStep(StepRecord),
    AppendEvent(EventRecord),
    /// Appends the event only if an `InsertRun`/`InsertRunDedup` earlier in the same
    /// batch inserted its run: a run and its first log line share one commit, and a
    /// deduplicated request leaves nothing behind.
    AppendEventIfInserted(EventRecord),
    /// Like `UpsertStep`, only if an insert earlier in the batch inserted its run:
    /// a new run's first step is recorded as started in the run's own commit.
    UpsertStepIfInserted(StepRecord),
    /// Records the terminal state of a run that is still `running`.
    FinishRun {
        run_id: String,
        status: RunStatus,
        completed_at: i64,
        terminal_step: Option<String>,
        reason: Option<String>,
        final_output_json: Option<String>,
    },
    /// Overwrites the run's accumulated usage with these totals.
    SetRunUsage {
        run_id: String,
        tokens_used: u64,
        cost_usd: f64,
    },
    /// Sets `resumed_at` on the first resume and increments `resume_count`.
    /// Sets `resumed_at` (the first time) and counts the resume in
    /// `resume_count` unless it was a clean handoff (`counted: false`: another
    /// replica released the run at a step boundary, nothing was in flight).
    MarkResumed {
        run_id: String,
        at: i64,
        counted: bool,
    },
    InsertApproval(ApprovalRecord),
    SetApprovalDelivery {
        token: String,
        delivery_json: String,
    },
    /// Decides an approval if it is still pending; the first decision wins.
    DecideApproval {
        token: String,
        status: ApprovalStatus,
        by: Option<String>,
        at: i64,
    },
    /// Closes every still-pending approval of a run.
    CloseApprovalsOfRun {
        run_id: String,
        at: i64,
    },
    /// Records a notification; recording the same id again is a no-op.
    InsertNotification(NotificationRecord),
    MarkNotification {
        id: String,
        status: NotificationStatus,
        at: i64,
        error: Option<String>,
    },
    /// Deletes runs that finished before `cutoff` (unix ms) with everything that
    /// belongs to them (steps, log, approvals, notifications, agent journal).
    /// Running runs are never touched.
    PruneFinishedBefore {
        cutoff: i64,
    },
    SetKv {
        key: String,
        value: String,
    },
    /// Sets (or with `None` clears) the process that owns a run: a `vectorstep run`
    /// process, named by its lock (see `store::lock`). Unowned runs belong to `serve`.
    SetRunOwner {
        run_id: String,
        owner: Option<String>,
    },
    /// Inserts or completely replaces the agent turn at `(run_id, step_path,
    /// iteration, turn)`.
    UpsertTurn(TurnRecord),
    /// Inserts or completely replaces the tool call at `(run_id, step_path,
    /// iteration, turn, call_index)`; fails if another call holds its `effect_key`.
    /// Put in the same batch as the turn it follows, "turn N completed + call 1
    /// started" is one commit and one fsync.
    UpsertToolCall(ToolCallRecord),
    /// Inserts or completely replaces the delegation at `(run_id, step_path, key)`.
    UpsertDelegation(DelegationRecord),
    // Leases among replicas (SPEC 11, `store::replicas`). Every time is the
    // database's clock; `lease_ms` is added to it.
    /// Upserts the replica's row (`heartbeat_at` = now, `started_at` = now only when
    /// new, `kind`, `fingerprints_json` (a JSON array of strings) and `host` replaced;
    /// `stopped_at` untouched), then renews in one statement every lease `replica`
    /// holds on a running run that is neither released nor expired, to now +
    /// `lease_ms`. An expired lease is not renewed (another replica may be adopting
    /// it). [`Outcome::Renewed`] with the number of leases renewed.
    Heartbeat {
        replica: String,
        kind: ReplicaKind,
        fingerprints_json: String,
        host: Option<String>,
        lease_ms: u64,
    },
    /// Compare-and-set of a running run's lease: sets owner `replica`, epoch
    /// `expected_epoch + 1`, expiry now + `lease_ms`, not released, only if the
    /// lease's epoch is still `expected_epoch` and it is free (never leased,
    /// released, expired) or already `replica`'s. [`Outcome::Claimed`] with the new
    /// epoch, [`Outcome::ClaimLost`] with the lease as it is now, or
    /// [`Outcome::NotRunning`] for a run missing or finished.
    ///
    /// `holder_gone`: the caller has seen the holder's session end (its liveness
    /// lock was free, `Store::replica_gone`), so an unexpired lease of that holder
    /// may be taken too; the epoch compare-and-set still decides who wins.
    ClaimRun {
        run_id: String,
        replica: String,
        expected_epoch: u64,
        lease_ms: u64,
        holder_gone: bool,
    },
    /// Applied only if an insert earlier in the batch inserted its run (like the
    /// `...IfInserted` writes; `Outcome::Done` otherwise): leases the new run to
    /// `replica` under epoch 1 until now + `lease_ms`, in the run's own commit.
    /// [`Outcome::Claimed`] `{ epoch: 1 }`.
    LeaseNewRun {
        run_id: String,
        replica: String,
        lease_ms: u64,
    },
    /// Put first in every batch that writes for a leased run: if the run's lease is
    /// still `(replica, epoch)` and not released (whatever the run's status, so the
    /// batch that finishes a run is fenced too), it locks the run's row until the
    /// batch commits (`Outcome::Done`), so a takeover waits for the batch. Otherwise
    /// the whole batch fails with [`Error::Fenced`] naming the holder (never
    /// retriable). A run never leased (epoch 0, as on a single SQLite node) or
    /// missing refuses every fence, with `owner: None`.
    Fence {
        run_id: String,
        replica: String,
        epoch: u64,
    },
    /// Releases the lease at a step boundary (SIGTERM handoff) if it is `(replica,
    /// epoch)`, released already or not: `Outcome::Done`; else
    /// [`Outcome::NotHeld`]. A released lease can be claimed at once, and fences of
    /// its epoch are refused.
    ReleaseLease {
        run_id: String,
        replica: String,
        epoch: u64,
    },
    /// Parks the lease of a run that now waits on a human (a parked approval) if
    /// it is `(replica, epoch)` and held: nobody holds it while the run waits, any
    /// replica may claim it to act on the decision or the deadline, and fences of
    /// its epoch are refused. `Outcome::Done`, or [`Outcome::NotHeld`] (a decision
    /// already claimed it again, under a newer epoch).
    ParkLease {
        run_id: String,
        replica: String,
        epoch: u64,
    },
    /// Sets the replica's `stopped_at` to now. `Outcome::Done`.
    StopReplica {
        replica: String,
    },
    /// Takes the named lease (a singleton such as the Telegram poller) if it is new
    /// (epoch 1) or expired (next epoch), or renews it if `owner` holds it (same
    /// epoch), until now + `lease_ms`. [`Outcome::NamedLeaseHeld`] or
    /// [`Outcome::NamedLeaseBusy`].
    AcquireNamedLease {
        name: String,
        owner: String,
        lease_ms: u64,
    },
    /// Expires the named lease now if `owner` holds it (unexpired), so another
    /// takes it at once: `Outcome::Done`; else [`Outcome::NotHeld`].
    ReleaseNamedLease {
        name: String,
        owner: String,
    },
    /// Put first in a batch that writes for a singleton lease's holder (the
    /// Telegram poller's offset): if `name` is still `owner`'s under `epoch` and
    /// unexpired, it locks the row until the batch commits (`Outcome::Done`);
    /// otherwise the whole batch fails with [`Error::NamedLeaseLost`].
    FenceNamedLease {
        name: String,
        owner: String,
        epoch: u64,
    },
    /// Takes a pending notification for one delivery attempt, across replicas:
    /// until now + `claim_ms` nobody else sends it (a sender that dies mid-send
    /// leaves it to be sent again once the claim runs out). Cleared by its
    /// `MarkNotification`. [`Outcome::NotificationClaimed`] or
    /// [`Outcome::NotificationBusy`].
    ///
    /// `take_from`: a sender the caller has seen gone (its replica's session
    /// ended, `Store::replica_gone`), whose unexpired claim may be taken too.
    ClaimNotification {
        id: String,
        claimer: String,
        claim_ms: u64,
        take_from: Option<String>,
    },
    /// Compare-and-set of a schedule's next due tick: sets it to `next_due_at` if
    /// it is `expected_due_at` (`None`: only if the schedule has none yet).
    /// [`Outcome::ScheduleAdvanced`], or [`Outcome::ScheduleRaced`] with the tick
    /// as it is (another replica fired it). Raced, it skips the rest of its batch
    /// (each an `Outcome::Done`): a tick's run, committed after its advance in the
    /// same batch, exists exactly when the advance won.
    AdvanceSchedule {
        pipeline: String,
        expected_due_at: Option<i64>,
        next_due_at: i64,
    },
    /// Inserts `rows` into `table` as they are, every column, generated keys
    /// included (`vectorstep store copy`, see `store::copy`); fails on a row
    /// already there. `Outcome::Done`.
    CopyRows {
        table: &'static CopyTable,
        rows: Vec<Vec<CopyValue>>,
    },
}

/// What a write did; one per write, in the order of the batch. Outcomes other than
/// `Done` are answers the caller acts on, not failures: they never roll anything back.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Done,
    RunInserted,
    /// A run of the same pipeline with the same dedup fingerprint is still running.
    DuplicateRunning {
        existing_run_id: String,
    },
    /// `InsertRunDedup` found a run triggered inside the dedup window.
    DuplicateRecent {
        existing_run_id: String,
        status: RunStatus,
    },
    /// `FinishRun` found the run missing or already finished; nothing was changed.
    NotRunning,
    ApprovalDecided,
    /// Somebody (or the deadline) decided first; this is the recorded status.
    ApprovalAlreadyDecided {
        status: ApprovalStatus,
    },
    ApprovalUnknown,
    /// `PruneFinishedBefore` deleted this many runs.
    Pruned {
        runs: u64,
    },
    /// `Heartbeat` renewed this many leases.
    Renewed {
        runs: u64,
    },
    /// `ClaimRun`/`LeaseNewRun`: the run is leased to the writer under `epoch`.
    Claimed {
        epoch: u64,
    },
    /// `ClaimRun`: the lease moved on or is another replica's live lease; this is
    /// it now (`owner: None`: never leased, the expected epoch was wrong).
    ClaimLost {
        owner: Option<String>,
        epoch: u64,
    },
    /// `ReleaseLease`/`ReleaseNamedLease`: the writer does not hold that lease.
    NotHeld,
    /// `AcquireNamedLease`: the writer holds the named lease under `epoch`.
    NamedLeaseHeld {
        epoch: u64,
    },
    /// `AcquireNamedLease`: `owner` holds it until `expires_at` (database clock).
    NamedLeaseBusy {
        owner: String,
        expires_at: i64,
    },
    ScheduleAdvanced,
    /// `ClaimNotification`: this sender may deliver it now.
    NotificationClaimed,
    /// `ClaimNotification`: another sender's claim runs, or it is no longer pending.
    NotificationBusy,
    /// `AdvanceSchedule` found another tick (`None`: the schedule has none).
    ScheduleRaced {
        next_due_at: Option<i64>,
    },
}

/// Counters for benchmarks and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Batches handed to the writer (by `commit` or `commit_blocking`).
    pub batches_submitted: u64,
    /// Batches whose writes were committed.
    pub batches_committed: u64,
    /// Transactions committed, that is fsyncs paid for those batches.
    pub transactions_committed: u64,
}

impl Write {
    /// The variant name, used to say which write of a batch failed.
    pub fn name(&self) -> &'static str {
        match self {
            Write::InsertRun(_) => "InsertRun",
            Write::InsertRunDedup { .. } => "InsertRunDedup",
            Write::UpsertStep(_) => "UpsertStep",
            Write::AppendEvent(_) => "AppendEvent",
            Write::AppendEventIfInserted(_) => "AppendEventIfInserted",
            Write::UpsertStepIfInserted(_) => "UpsertStepIfInserted",
            Write::FinishRun { .. } => "FinishRun",
            Write::SetRunUsage { .. } => "SetRunUsage",
            Write::MarkResumed { .. } => "MarkResumed",
            Write::InsertApproval(_) => "InsertApproval",
            Write::SetApprovalDelivery { .. } => "SetApprovalDelivery",
            Write::DecideApproval { .. } => "DecideApproval",
            Write::CloseApprovalsOfRun { .. } => "CloseApprovalsOfRun",
            Write::InsertNotification(_) => "InsertNotification",
            Write::MarkNotification { .. } => "MarkNotification",
            Write::SetKv { .. } => "SetKv",
            Write::PruneFinishedBefore { .. } => "PruneFinishedBefore",
            Write::SetRunOwner { .. } => "SetRunOwner",
            Write::UpsertTurn(_) => "UpsertTurn",
            Write::UpsertToolCall(_) => "UpsertToolCall",
            Write::UpsertDelegation(_) => "UpsertDelegation",
            Write::Heartbeat { .. } => "Heartbeat",
            Write::ClaimRun { .. } => "ClaimRun",
            Write::LeaseNewRun { .. } => "LeaseNewRun",
            Write::Fence { .. } => "Fence",
            Write::ReleaseLease { .. } => "ReleaseLease",
            Write::ParkLease { .. } => "ParkLease",
            Write::StopReplica { .. } => "StopReplica",
            Write::AcquireNamedLease { .. } => "AcquireNamedLease",
            Write::ReleaseNamedLease { .. } => "ReleaseNamedLease",
            Write::AdvanceSchedule { .. } => "AdvanceSchedule",
            Write::ClaimNotification { .. } => "ClaimNotification",
            Write::FenceNamedLease { .. } => "FenceNamedLease",
            Write::CopyRows { .. } => "CopyRows",
        }
    }

    /// Applies the write on `db`, inside the writer's transaction (either backend).
    fn apply(&self, db: &impl Db) -> Result<Outcome, DbError> {
        match self {
            Write::InsertRun(run) => runs::insert(db, run),
            Write::InsertRunDedup { run, window_start } => {
                runs::insert_dedup(db, run, *window_start)
            }
            Write::UpsertStep(step) | Write::UpsertStepIfInserted(step) => steps::upsert(db, step),
            Write::AppendEvent(event) | Write::AppendEventIfInserted(event) => {
                events::append(db, event)
            }
            Write::FinishRun {
                run_id,
                status,
                completed_at,
                terminal_step,
                reason,
                final_output_json,
            } => runs::finish(
                db,
                run_id,
                *status,
                *completed_at,
                terminal_step.as_deref(),
                reason.as_deref(),
                final_output_json.as_deref(),
            ),
            Write::SetRunUsage {
                run_id,
                tokens_used,
                cost_usd,
            } => runs::set_usage(db, run_id, *tokens_used, *cost_usd),
            Write::MarkResumed {
                run_id,
                at,
                counted,
            } => runs::mark_resumed(db, run_id, *at, *counted),
            Write::InsertApproval(approval) => approvals::insert(db, approval),
            Write::SetApprovalDelivery {
                token,
                delivery_json,
            } => approvals::set_delivery(db, token, delivery_json),
            Write::DecideApproval {
                token,
                status,
                by,
                at,
            } => approvals::decide(db, token, *status, by.as_deref(), *at),
            Write::CloseApprovalsOfRun { run_id, at } => approvals::close_of_run(db, run_id, *at),
            Write::InsertNotification(n) => notifications::insert(db, n),
            Write::MarkNotification {
                id,
                status,
                at,
                error,
            } => notifications::mark(db, id, *status, *at, error.as_deref()),
            Write::SetKv { key, value } => kv::set(db, key, value),
            Write::PruneFinishedBefore { cutoff } => runs::prune(db, *cutoff),
            Write::SetRunOwner { run_id, owner } => runs::set_owner(db, run_id, owner.as_deref()),
            Write::UpsertTurn(turn) => journal::upsert_turn(db, turn),
            Write::UpsertToolCall(call) => journal::upsert_call(db, call),
            Write::UpsertDelegation(d) => journal::upsert_delegation(db, d),
            Write::Heartbeat {
                replica,
                kind,
                fingerprints_json,
                host,
                lease_ms,
            } => replicas::heartbeat(
                db,
                replica,
                *kind,
                fingerprints_json,
                host.as_deref(),
                *lease_ms,
            ),
            Write::ClaimRun {
                run_id,
                replica,
                expected_epoch,
                lease_ms,
                holder_gone,
            } => replicas::claim(
                db,
                run_id,
                replica,
                *expected_epoch,
                *lease_ms,
                *holder_gone,
            ),
            Write::LeaseNewRun {
                run_id,
                replica,
                lease_ms,
            } => replicas::lease_new(db, run_id, replica, *lease_ms),
            Write::Fence {
                run_id,
                replica,
                epoch,
            } => replicas::fence(db, run_id, replica, *epoch),
            Write::ReleaseLease {
                run_id,
                replica,
                epoch,
            } => replicas::release(db, run_id, replica, *epoch),
            Write::ParkLease {
                run_id,
                replica,
                epoch,
            } => replicas::park(db, run_id, replica, *epoch),
            Write::StopReplica { replica } => replicas::stop(db, replica),
            Write::AcquireNamedLease {
                name,
                owner,
                lease_ms,
            } => replicas::acquire_named(db, name, owner, *lease_ms),
            Write::ReleaseNamedLease { name, owner } => replicas::release_named(db, name, owner),
            Write::AdvanceSchedule {
                pipeline,
                expected_due_at,
                next_due_at,
            } => replicas::advance_schedule(db, pipeline, *expected_due_at, *next_due_at),
            Write::ClaimNotification {
                id,
                claimer,
                claim_ms,
                take_from,
            } => notifications::claim(db, id, claimer, *claim_ms, take_from.as_deref()),
            Write::FenceNamedLease { name, owner, epoch } => {
                replicas::fence_named(db, name, owner, *epoch)
            }
            Write::CopyRows { table, rows } => copy::insert_rows(db, table, rows),
        }
    }
}

/// A batch small enough that its transaction stays short, large enough that a burst
/// of concurrent runs is absorbed in a handful of fsyncs.
const MAX_GROUP: usize = 512;

type Reply = Result<Vec<Outcome>, Rejected>;

/// A batch that was not committed, handed back with its writes so that a caller who
/// waits for the store to recover can submit the very same batch again.
#[derive(Debug)]
pub struct Rejected {
    pub error: Error,
    pub writes: Vec<Write>,
}

/// How often an idle writer checks the database file, and how often a writer whose
/// last group failed probes the store with a tiny write.
const TICK: Duration = Duration::from_secs(1);

/// The `kv` key the probe writes (the time of the probe, unix ms).
pub(super) const PROBE_KEY: &str = "store_probe";

/// After a forced checkpoint that readers kept from finishing, how long the writer
/// waits before forcing another (each one may wait up to the busy timeout).
const FORCED_CHECKPOINT_RETRY: Duration = Duration::from_secs(1);

struct Job {
    writes: Vec<Write>,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
pub(super) struct Counters {
    submitted: AtomicU64,
    committed: AtomicU64,
    transactions: AtomicU64,
}

impl Counters {
    pub(super) fn snapshot(&self) -> StoreStats {
        StoreStats {
            batches_submitted: self.submitted.load(Ordering::Relaxed),
            batches_committed: self.committed.load(Ordering::Relaxed),
            transactions_committed: self.transactions.load(Ordering::Relaxed),
        }
    }
}

/// What the writer thread needs of a database: one group transaction at a time,
/// and its upkeep. SQLite's connection ([`Lite`]) and PostgreSQL's
/// (`postgres::writer`) implement it; the thread, its queue, group commit and the
/// store's health are the same for both.
pub(super) trait GroupCommit: Send + 'static {
    /// Applies every batch in one transaction, each inside its own savepoint so a
    /// failing batch is undone alone.
    fn attempt(&mut self, batches: &[&[Write]]) -> Attempt;

    /// Why no group may be committed now (SQLite: the path names another file).
    fn refuse(&mut self) -> Option<Error> {
        None
    }

    /// After a group committed (SQLite keeps its WAL bounded here).
    fn after_commit(&mut self) {}
}

/// The handle to the writer thread. Dropping it lets the thread finish every queued
/// batch and close the connection before the drop returns, so a store reopened right
/// afterwards (tests, restarts within a process) finds all of it committed.
pub(super) struct Writer {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    pub(super) counters: Arc<Counters>,
    /// The followers of runs' logs, woken after the commits that append to them.
    pub(super) watchers: Arc<super::watch::RunWatchers>,
}

impl Writer {
    /// The writer of a SQLite store, owning its only read-write connection.
    pub(super) fn spawn(conn: Connection, health: Arc<Health>) -> Result<Writer, Error> {
        let wal = wal_path(health.path());
        let lite = Lite {
            conn,
            health: Arc::clone(&health),
            wal,
            last_unfinished: None,
        };
        Writer::spawn_with(lite, health)
    }

    /// The writer thread over any backend.
    pub(super) fn spawn_with(
        backend: impl GroupCommit,
        health: Arc<Health>,
    ) -> Result<Writer, Error> {
        let (tx, rx) = mpsc::channel::<Job>();
        let counters = Arc::new(Counters::default());
        let thread_counters = Arc::clone(&counters);
        let watchers = Arc::new(super::watch::RunWatchers::default());
        let thread_watchers = Arc::clone(&watchers);
        let thread = std::thread::Builder::new()
            .name("vectorstep-store-writer".into())
            .spawn(move || {
                let mut w = Thread {
                    backend,
                    counters: &thread_counters,
                    health,
                    watchers: &thread_watchers,
                };
                w.run(rx)
            })
            .map_err(Error::SpawnWriter)?;
        Ok(Writer {
            tx: Some(tx),
            thread: Some(thread),
            counters,
            watchers,
        })
    }

    /// Queues a batch; the receiver resolves once it is committed or has failed.
    pub(super) fn submit(&self, writes: Vec<Write>) -> Result<oneshot::Receiver<Reply>, Rejected> {
        let (reply, rx) = oneshot::channel();
        let Some(tx) = self.tx.as_ref() else {
            return Err(Rejected {
                error: Error::WriterGone,
                writes,
            });
        };
        tx.send(Job { writes, reply }).map_err(|e| Rejected {
            error: Error::WriterGone,
            writes: e.0.writes,
        })?;
        self.counters.submitted.fetch_add(1, Ordering::Relaxed);
        Ok(rx)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                error!("The store writer thread panicked.");
            }
        }
    }
}

/// The writer thread's state.
struct Thread<'a, B> {
    backend: B,
    counters: &'a Counters,
    health: Arc<Health>,
    watchers: &'a super::watch::RunWatchers,
}

impl<B: GroupCommit> Thread<'_, B> {
    fn run(&mut self, rx: mpsc::Receiver<Job>) {
        loop {
            let first = match rx.recv_timeout(TICK) {
                Ok(job) => job,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.idle_tick();
                    continue;
                }
                // Every sender is gone: the store was dropped.
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            let mut jobs = vec![first];
            while jobs.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            self.commit_group(jobs, true);
        }
    }

    /// Nothing queued for a second: notice a deleted database file even without
    /// traffic, and find out whether a store that failed can write again.
    fn idle_tick(&mut self) {
        if self.backend.refuse().is_some() {
            return;
        }
        if self.health.write_failing() {
            let probe = vec![Write::SetKv {
                key: PROBE_KEY.into(),
                value: now_ms().to_string(),
            }];
            let (reply, _rx) = oneshot::channel();
            // Not counted: nobody submitted it.
            let job = Job {
                writes: probe,
                reply,
            };
            self.commit_group(vec![job], false);
        }
    }

    fn commit_group(&mut self, mut jobs: Vec<Job>, counted: bool) {
        if let Some(refused) = self.backend.refuse() {
            let (path, detail) = match &refused {
                Error::FileReplaced { path, detail } => (path.clone(), detail.clone()),
                other => (self.health.path().to_path_buf(), other.to_string()),
            };
            for job in jobs {
                let _ = job.reply.send(Err(Rejected {
                    error: Error::FileReplaced {
                        path: path.clone(),
                        detail: detail.clone(),
                    },
                    writes: job.writes,
                }));
            }
            return;
        }
        let counters = self.counters;
        // Each round either commits or removes the job that broke it, so this terminates.
        while !jobs.is_empty() {
            let batches: Vec<&[Write]> = jobs.iter().map(|j| j.writes.as_slice()).collect();
            match self.backend.attempt(&batches) {
                Attempt::Committed(results) => {
                    self.health.write_succeeded();
                    let ok = results.iter().filter(|r| r.is_ok()).count();
                    if counted {
                        counters.transactions.fetch_add(1, Ordering::Relaxed);
                        counters.committed.fetch_add(ok as u64, Ordering::Relaxed);
                    }
                    debug!(
                        batches = results.len(),
                        committed = ok,
                        "Store group committed."
                    );
                    // The runs whose log grew wake their followers.
                    self.watchers.committed(
                        jobs.iter()
                            .zip(&results)
                            .filter(|(_, r)| r.is_ok())
                            .flat_map(|(j, _)| j.writes.iter())
                            .filter_map(|w| match w {
                                Write::AppendEvent(e) | Write::AppendEventIfInserted(e) => {
                                    Some(e.run_id.as_str())
                                }
                                _ => None,
                            }),
                    );
                    for (job, result) in jobs.into_iter().zip(results) {
                        let reply = result.map_err(|error| Rejected {
                            error,
                            writes: job.writes,
                        });
                        // The caller may have stopped waiting; its writes are committed anyway.
                        let _ = job.reply.send(reply);
                    }
                    self.backend.after_commit();
                    return;
                }
                Attempt::Aborted { index, error } => {
                    if self.health.write_failing() {
                        // Already reported; the callers waiting it out try every 2 s.
                        debug!(%error, "A batch aborted the store transaction again.");
                    } else {
                        error!(%error, "A batch aborted the store transaction; retrying the others.");
                    }
                    if error.is_retriable() {
                        self.health.write_failed(&error.to_string());
                    }
                    let job = jobs.remove(index);
                    let _ = job.reply.send(Err(Rejected {
                        error,
                        writes: job.writes,
                    }));
                }
                Attempt::Failed {
                    stage,
                    message,
                    retriable,
                } => {
                    if self.health.write_failing() {
                        debug!(error = %message, stage, "The store group transaction failed again.");
                    } else {
                        error!(error = %message, stage, "The store group transaction failed.");
                    }
                    if retriable {
                        self.health.write_failed(&message);
                    }
                    for job in jobs {
                        let _ = job.reply.send(Err(Rejected {
                            error: Error::Transaction {
                                stage,
                                message: message.clone(),
                                retriable,
                            },
                            writes: job.writes,
                        }));
                    }
                    return;
                }
            }
        }
    }
}

/// The SQLite side of the writer: the only read-write connection and its WAL.
struct Lite {
    conn: Connection,
    health: Arc<Health>,
    wal: PathBuf,
    /// When a forced checkpoint last failed to finish.
    last_unfinished: Option<Instant>,
}

impl GroupCommit for Lite {
    fn attempt(&mut self, batches: &[&[Write]]) -> Attempt {
        attempt(&mut self.conn, batches)
    }

    fn refuse(&mut self) -> Option<Error> {
        let detail = self.health.check_file()?;
        Some(Error::FileReplaced {
            path: self.health.path().to_path_buf(),
            detail,
        })
    }

    fn after_commit(&mut self) {
        self.bound_wal();
    }
}

impl Lite {
    /// Passive checkpoints (every `wal_autocheckpoint` pages) keep the WAL small as
    /// long as they can finish; readers holding old snapshots can stop them, and the
    /// WAL then grows with every commit. Past the bound, a truncating checkpoint waits
    /// (under the busy timeout) for those readers and empties the file.
    fn bound_wal(&mut self) {
        let size = match std::fs::metadata(&self.wal) {
            Ok(m) => m.len(),
            Err(_) => return,
        };
        if size <= WAL_FORCE_CHECKPOINT_BYTES {
            return;
        }
        if self
            .last_unfinished
            .is_some_and(|t| t.elapsed() < FORCED_CHECKPOINT_RETRY)
        {
            return;
        }
        self.last_unfinished = None;
        let result: rusqlite::Result<(i64, i64, i64)> =
            self.conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                });
        match result {
            Ok((0, _, _)) => {
                debug!(
                    wal_bytes = size,
                    "WAL over its bound; truncating checkpoint done."
                )
            }
            Ok((_, frames, done)) => {
                self.last_unfinished = Some(Instant::now());
                warn!(
                    wal_bytes = size,
                    frames,
                    checkpointed = done,
                    "WAL over its bound and readers kept the checkpoint from finishing; trying again in a second."
                )
            }
            Err(e) => {
                self.last_unfinished = Some(Instant::now());
                warn!(error = %e, wal_bytes = size, "WAL over its bound; the truncating checkpoint failed.")
            }
        }
    }
}

/// How one attempt at committing a group ended.
pub(super) enum Attempt {
    /// Committed; one result per job, in order (failed batches carry their error).
    Committed(Vec<Result<Vec<Outcome>, Error>>),
    /// A failing write took the whole transaction down with it (SQLite does that for
    /// I/O errors, a full disk and the like). The other jobs deserve another try.
    Aborted { index: usize, error: Error },
    /// BEGIN or COMMIT failed: nothing in the group is durable.
    Failed {
        stage: &'static str,
        message: String,
        retriable: bool,
    },
}

/// `<database>-wal`.
fn wal_path(db: &std::path::Path) -> PathBuf {
    let mut p = db.as_os_str().to_os_string();
    p.push("-wal");
    PathBuf::from(p)
}

fn failed(stage: &'static str, error: rusqlite::Error) -> Attempt {
    Attempt::Failed {
        stage,
        retriable: is_transient(&error),
        message: error.to_string(),
    }
}

fn attempt(conn: &mut Connection, batches: &[&[Write]]) -> Attempt {
    // IMMEDIATE takes the write lock up front, so a second process writing the same
    // file makes us wait at BEGIN (under the busy timeout) instead of failing midway.
    if let Err(error) = conn.execute_batch("BEGIN IMMEDIATE") {
        return failed("begun", error);
    }
    let mut replies = Vec::with_capacity(batches.len());
    for (index, writes) in batches.iter().enumerate() {
        match apply_batch(conn, writes) {
            Ok(outcomes) => replies.push(Ok(outcomes)),
            Err(error) => {
                if conn.is_autocommit() {
                    return Attempt::Aborted { index, error };
                }
                replies.push(Err(error));
            }
        }
    }
    if let Err(error) = conn.execute_batch("COMMIT") {
        // A failed COMMIT can leave the transaction open (for example when busy).
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        return failed("committed", error);
    }
    Attempt::Committed(replies)
}

/// Applies a caller's writes in order on `db`, inside a transaction the caller owns
/// (either backend): the conditional writes apply only after an insert of the batch
/// won, and nothing after a raced `AdvanceSchedule` applies. The first failing write
/// ends it, named in [`Error::Write`].
pub(super) fn apply_writes(db: &impl Db, writes: &[Write]) -> Result<Vec<Outcome>, Error> {
    let mut outcomes = Vec::with_capacity(writes.len());
    let mut inserted = false;
    let mut raced = false;
    for (index, write) in writes.iter().enumerate() {
        if raced {
            outcomes.push(Outcome::Done);
            continue;
        }
        let conditional = matches!(
            write,
            Write::AppendEventIfInserted(_)
                | Write::UpsertStepIfInserted(_)
                | Write::LeaseNewRun { .. }
        );
        if conditional && !inserted {
            outcomes.push(Outcome::Done);
            continue;
        }
        match write.apply(db) {
            Ok(outcome) => {
                inserted |= outcome == Outcome::RunInserted;
                raced = matches!(outcome, Outcome::ScheduleRaced { .. });
                outcomes.push(outcome)
            }
            // A refused fence is the caller's answer, not a broken write: it says
            // who holds the run now.
            Err(source @ (DbError::Fenced { .. } | DbError::NamedLeaseLost { .. })) => {
                return Err(source.into())
            }
            Err(source) => {
                return Err(Error::Write {
                    index,
                    write: write.name(),
                    source,
                })
            }
        }
    }
    Ok(outcomes)
}

/// Applies one caller's batch inside its own savepoint, undoing all of it on failure.
/// If the failure (or the undo) destroyed the enclosing transaction, the connection is
/// back in autocommit mode and the caller of this function must notice.
fn apply_batch(conn: &Connection, writes: &[Write]) -> Result<Vec<Outcome>, Error> {
    // Cached: these run once per batch, thousands of times a second under load.
    conn.prepare_cached("SAVEPOINT batch")?.execute([])?;
    let outcomes = match apply_writes(conn, writes) {
        Ok(outcomes) => outcomes,
        Err(error) => {
            if !conn.is_autocommit() {
                let undone = conn.execute_batch("ROLLBACK TO batch; RELEASE batch");
                if undone.is_err() && !conn.is_autocommit() {
                    // The savepoint cannot be undone, so the only safe way to keep
                    // this batch out is to drop the transaction and retry the rest.
                    let _ = conn.execute_batch("ROLLBACK");
                }
            }
            return Err(error);
        }
    };
    if let Err(error) = conn
        .prepare_cached("RELEASE batch")
        .and_then(|mut st| st.execute([]))
    {
        // Left in place, the savepoint would swallow the next batches' savepoints and
        // muddle which writes belong to whom; start the group over without this batch.
        if !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        return Err(error.into());
    }
    Ok(outcomes)
}
