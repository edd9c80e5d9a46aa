//! The single writer thread and its group commit.
//!
//! Every write in the process goes through one thread that owns the only read-write
//! connection. It takes one batch, drains every batch already queued behind it, and
//! applies them all in one transaction, each inside its own SAVEPOINT: a failing batch
//! is rolled back alone and only its caller sees the error, while everybody else
//! shares a single COMMIT and therefore a single fsync. That is what lets hundreds of
//! concurrent runs persist every step without each paying for its own disk flush.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::oneshot;
use tracing::{debug, error};

use super::error::is_busy;
use super::{approvals, events, kv, notifications, runs, steps};
use super::{ApprovalRecord, Error, EventRecord, NotificationRecord, RunRecord, StepRecord};

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
        status: String,
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
    MarkResumed {
        run_id: String,
        at: i64,
    },
    InsertApproval(ApprovalRecord),
    SetApprovalDelivery {
        token: String,
        delivery_json: String,
    },
    /// Decides an approval if it is still pending; the first decision wins.
    DecideApproval {
        token: String,
        status: String,
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
        status: String,
        at: i64,
        error: Option<String>,
    },
    /// Deletes runs that finished before `cutoff` (unix ms) with everything that
    /// belongs to them. Running runs are never touched.
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
        status: String,
    },
    /// `FinishRun` found the run missing or already finished; nothing was changed.
    NotRunning,
    ApprovalDecided,
    /// Somebody (or the deadline) decided first; this is the recorded status.
    ApprovalAlreadyDecided {
        status: String,
    },
    ApprovalUnknown,
    /// `PruneFinishedBefore` deleted this many runs.
    Pruned {
        runs: u64,
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
        }
    }

    fn apply(&self, conn: &Connection) -> rusqlite::Result<Outcome> {
        match self {
            Write::InsertRun(run) => runs::insert(conn, run),
            Write::InsertRunDedup { run, window_start } => {
                runs::insert_dedup(conn, run, *window_start)
            }
            Write::UpsertStep(step) | Write::UpsertStepIfInserted(step) => {
                steps::upsert(conn, step)
            }
            Write::AppendEvent(event) | Write::AppendEventIfInserted(event) => {
                events::append(conn, event)
            }
            Write::FinishRun {
                run_id,
                status,
                completed_at,
                terminal_step,
                reason,
                final_output_json,
            } => runs::finish(
                conn,
                run_id,
                status,
                *completed_at,
                terminal_step.as_deref(),
                reason.as_deref(),
                final_output_json.as_deref(),
            ),
            Write::SetRunUsage {
                run_id,
                tokens_used,
                cost_usd,
            } => runs::set_usage(conn, run_id, *tokens_used, *cost_usd),
            Write::MarkResumed { run_id, at } => runs::mark_resumed(conn, run_id, *at),
            Write::InsertApproval(approval) => approvals::insert(conn, approval),
            Write::SetApprovalDelivery {
                token,
                delivery_json,
            } => approvals::set_delivery(conn, token, delivery_json),
            Write::DecideApproval {
                token,
                status,
                by,
                at,
            } => approvals::decide(conn, token, status, by.as_deref(), *at),
            Write::CloseApprovalsOfRun { run_id, at } => approvals::close_of_run(conn, run_id, *at),
            Write::InsertNotification(n) => notifications::insert(conn, n),
            Write::MarkNotification {
                id,
                status,
                at,
                error,
            } => notifications::mark(conn, id, status, *at, error.as_deref()),
            Write::SetKv { key, value } => kv::set(conn, key, value),
            Write::PruneFinishedBefore { cutoff } => runs::prune(conn, *cutoff),
            Write::SetRunOwner { run_id, owner } => runs::set_owner(conn, run_id, owner.as_deref()),
        }
    }
}

/// A batch small enough that its transaction stays short, large enough that a burst
/// of concurrent runs is absorbed in a handful of fsyncs.
const MAX_GROUP: usize = 512;

type Reply = Result<Vec<Outcome>, Error>;

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

/// The handle to the writer thread. Dropping it lets the thread finish every queued
/// batch and close the connection before the drop returns, so a store reopened right
/// afterwards (tests, restarts within a process) finds all of it committed.
pub(super) struct Writer {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    pub(super) counters: Arc<Counters>,
}

impl Writer {
    pub(super) fn spawn(conn: Connection) -> Result<Writer, Error> {
        let (tx, rx) = mpsc::channel::<Job>();
        let counters = Arc::new(Counters::default());
        let thread_counters = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("vectorstep-store-writer".into())
            .spawn(move || run(conn, rx, &thread_counters))
            .map_err(Error::SpawnWriter)?;
        Ok(Writer {
            tx: Some(tx),
            thread: Some(thread),
            counters,
        })
    }

    /// Queues a batch; the receiver resolves once it is committed or has failed.
    pub(super) fn submit(&self, writes: Vec<Write>) -> Result<oneshot::Receiver<Reply>, Error> {
        let (reply, rx) = oneshot::channel();
        let tx = self.tx.as_ref().ok_or(Error::WriterGone)?;
        tx.send(Job { writes, reply })
            .map_err(|_| Error::WriterGone)?;
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

fn run(mut conn: Connection, rx: mpsc::Receiver<Job>, counters: &Counters) {
    // recv fails only once every sender is gone, i.e. the store was dropped.
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        commit_group(&mut conn, jobs, counters);
    }
}

/// How one attempt at committing a group ended.
enum Attempt {
    /// Committed; one reply per job, in order (failed batches carry their error).
    Committed(Vec<Reply>),
    /// A failing write took the whole transaction down with it (SQLite does that for
    /// I/O errors, a full disk and the like). The other jobs deserve another try.
    Aborted { index: usize, error: Error },
    /// BEGIN or COMMIT failed: nothing in the group is durable.
    Failed {
        stage: &'static str,
        error: rusqlite::Error,
    },
}

fn commit_group(conn: &mut Connection, mut jobs: Vec<Job>, counters: &Counters) {
    // Each round either commits or removes the job that broke it, so this terminates.
    while !jobs.is_empty() {
        match attempt(conn, &jobs) {
            Attempt::Committed(replies) => {
                counters.transactions.fetch_add(1, Ordering::Relaxed);
                let ok = replies.iter().filter(|r| r.is_ok()).count();
                counters.committed.fetch_add(ok as u64, Ordering::Relaxed);
                debug!(
                    batches = replies.len(),
                    committed = ok,
                    "Store group committed."
                );
                for (job, reply) in jobs.into_iter().zip(replies) {
                    // The caller may have stopped waiting; its writes are committed anyway.
                    let _ = job.reply.send(reply);
                }
                return;
            }
            Attempt::Aborted { index, error } => {
                error!(%error, "A batch aborted the store transaction; retrying the others.");
                let _ = jobs.remove(index).reply.send(Err(error));
            }
            Attempt::Failed { stage, error } => {
                error!(%error, stage, "The store group transaction failed.");
                let retriable = is_busy(&error);
                let message = error.to_string();
                for job in jobs {
                    let _ = job.reply.send(Err(Error::Transaction {
                        stage,
                        message: message.clone(),
                        retriable,
                    }));
                }
                return;
            }
        }
    }
}

fn attempt(conn: &mut Connection, jobs: &[Job]) -> Attempt {
    // IMMEDIATE takes the write lock up front, so a second process writing the same
    // file makes us wait at BEGIN (under the busy timeout) instead of failing midway.
    if let Err(error) = conn.execute_batch("BEGIN IMMEDIATE") {
        return Attempt::Failed {
            stage: "begun",
            error,
        };
    }
    let mut replies = Vec::with_capacity(jobs.len());
    for (index, job) in jobs.iter().enumerate() {
        match apply_batch(conn, &job.writes) {
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
        return Attempt::Failed {
            stage: "committed",
            error,
        };
    }
    Attempt::Committed(replies)
}

/// Applies one caller's batch inside its own savepoint, undoing all of it on failure.
/// If the failure (or the undo) destroyed the enclosing transaction, the connection is
/// back in autocommit mode and the caller of this function must notice.
fn apply_batch(conn: &Connection, writes: &[Write]) -> Result<Vec<Outcome>, Error> {
    // Cached: these run once per batch, thousands of times a second under load.
    conn.prepare_cached("SAVEPOINT batch")?.execute([])?;
    let mut outcomes = Vec::with_capacity(writes.len());
    let mut inserted = false;
    for (index, write) in writes.iter().enumerate() {
        let conditional = matches!(
            write,
            Write::AppendEventIfInserted(_) | Write::UpsertStepIfInserted(_)
        );
        if conditional && !inserted {
            outcomes.push(Outcome::Done);
            continue;
        }
        match write.apply(conn) {
            Ok(outcome) => {
                inserted |= outcome == Outcome::RunInserted;
                outcomes.push(outcome)
            }
            Err(source) => {
                if !conn.is_autocommit() {
                    let undone = conn.execute_batch("ROLLBACK TO batch; RELEASE batch");
                    if undone.is_err() && !conn.is_autocommit() {
                        // The savepoint cannot be undone, so the only safe way to keep
                        // this batch out is to drop the transaction and retry the rest.
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                }
                return Err(Error::Write {
                    index,
                    write: write.name(),
                    source,
                });
            }
        }
    }
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
