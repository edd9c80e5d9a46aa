//! A run's commits outlast a store that cannot write for a while.
//!
//! A commit that fails for a transient reason (another process holding the lock past
//! the busy timeout, a full disk, an I/O error, a database file that was moved away)
//! is submitted again with backoff, with the same writes, until it succeeds or
//! shutdown begins; the driver simply waits, so the run is neither lost nor left
//! `running` without a driver. A run that truly cannot continue (a write the store
//! refuses, an unreadable record) is closed as `failed` with the reason instead, once
//! the store accepts writes again (see [`close_failed`]).

use std::time::Duration;

use super::{Error, Services};
use crate::domain::RunStatus;
use crate::events::Event;
use crate::store::{Outcome, Write};

/// The first wait after a failed commit; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Commits `writes` for `run_id`, waiting out transient store failures. Returns the
/// error when it is not transient, or when shutdown began while waiting (the run then
/// stays `running` and the next start resumes it).
pub(super) async fn commit(
    engine: &Services,
    run_id: &str,
    writes: Vec<Write>,
) -> Result<Vec<Outcome>, Error> {
    let mut writes = writes;
    // A leased run's commit is fenced by its epoch (see `leases`); the fence's own
    // outcome is not the caller's.
    let fenced = match engine.leases().and_then(|b| b.fence(run_id)) {
        Some(fence) => {
            writes.insert(0, fence);
            true
        }
        None => false,
    };
    let mut delay = FIRST_BACKOFF;
    let mut failures: u64 = 0;
    loop {
        let rejected = match engine.store.commit_or_return(writes).await {
            Ok(mut outcomes) => {
                if fenced && !outcomes.is_empty() {
                    outcomes.remove(0);
                }
                if failures > 0 {
                    tracing::info!(
                        run_id,
                        failures,
                        "The store took the run's writes after waiting; the run goes on."
                    );
                }
                return Ok(outcomes);
            }
            Err(r) => r,
        };
        if matches!(rejected.error, crate::store::Error::Fenced { .. }) {
            // Another replica holds the run now: this one stops driving it.
            if let Some(book) = engine.leases() {
                book.forget(run_id);
            }
            return Err(rejected.error.into());
        }
        if !rejected.error.is_retriable() || engine.is_shutting_down() {
            return Err(rejected.error.into());
        }
        failures += 1;
        if failures == 1 {
            tracing::warn!(run_id, error = %rejected.error, "The store cannot take the run's writes; the run waits and tries again.");
        }
        writes = rejected.writes;
        if !wait_unless_shutdown(engine, delay).await {
            return Err(rejected.error.into());
        }
        delay = (delay * 2).min(MAX_BACKOFF);
    }
}

/// A read the driver cannot go on without (its run, its step records), tried again
/// with backoff like [`commit`] when it fails for a transient reason.
pub(super) async fn read<T>(
    engine: &Services,
    run_id: &str,
    f: impl Fn() -> Result<T, crate::store::Error>,
) -> Result<T, Error> {
    let mut delay = FIRST_BACKOFF;
    let mut failures: u64 = 0;
    loop {
        let error = match f() {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if !error.is_retriable() || engine.is_shutting_down() {
            return Err(error.into());
        }
        failures += 1;
        if failures == 1 {
            tracing::warn!(run_id, error = %error, "The store cannot be read for the run; the run waits and tries again.");
        }
        if !wait_unless_shutdown(engine, delay).await {
            return Err(error.into());
        }
        delay = (delay * 2).min(MAX_BACKOFF);
    }
}

/// Sleeps for `delay`; `false` if shutdown began first.
async fn wait_unless_shutdown(engine: &Services, delay: Duration) -> bool {
    let mut signal = engine.shutdown_signal();
    if *signal.borrow() {
        return false;
    }
    tokio::select! {
        _ = tokio::time::sleep(delay) => !engine.is_shutting_down(),
        _ = signal.wait_for(|down| *down) => false,
    }
}

/// Whether a run whose driver ended with `e` must be closed now: always, except for a
/// run that does not exist and for a transient store failure the driver stopped
/// waiting out because shutdown began (the next start resumes that run).
pub(super) fn must_close(engine: &Services, e: &Error) -> bool {
    match e {
        // Not ours to close any more: the replica that took it over drives it.
        Error::Store(crate::store::Error::Fenced { .. }) => false,
        Error::Store(s) => !(s.is_retriable() && engine.is_shutting_down()),
        Error::UnknownRun(_) => false,
        Error::UnknownPipeline(_) | Error::CorruptRun { .. } => true,
    }
}

/// Whether a driver ended because another replica took its run over (a refused
/// fence): it stops without writing anything more for the run.
pub(super) fn lost_lease(e: &Error) -> bool {
    matches!(e, Error::Store(crate::store::Error::Fenced { .. }))
}

/// Closes a run whose driver failed for good as `failed`, with the reason in the
/// run and in `run_finished`, waiting for the store like [`commit`] does. The writes
/// that failed are not retried; the run's earlier records stay as they were.
pub(super) async fn close_failed(engine: &Services, run_id: &str, cause: &Error) {
    let now = engine.now_ms();
    let reason = format!("The run could not continue: {cause}");
    let pipeline = match engine.store.run(run_id) {
        Ok(Some(run)) => run.pipeline_name,
        _ => String::new(),
    };
    let writes = vec![
        Write::FinishRun {
            run_id: run_id.to_string(),
            status: RunStatus::Failed,
            completed_at: now,
            terminal_step: None,
            reason: Some(reason.clone()),
            final_output_json: None,
        },
        Event::RunFailedUnrecorded {
            status: RunStatus::Failed,
            terminal_step: None,
            reason: reason.clone(),
        }
        .write(
            run_id,
            now,
            format!("Pipeline finished: {}", RunStatus::Failed),
        ),
        Write::CloseApprovalsOfRun {
            run_id: run_id.to_string(),
            at: now,
        },
    ];
    match commit(engine, run_id, writes).await {
        Ok(outcomes) => {
            if outcomes.first() == Some(&Outcome::Done) {
                crate::telemetry::run_finished(&pipeline, RunStatus::Failed.as_str());
                tracing::error!(run_id, reason = %reason, "Run failed: its driver could not go on.");
            }
        }
        Err(e) => {
            tracing::error!(run_id, error = %e, cause = %cause, "A run whose driver failed could not be closed either; it stays running until the next start.");
        }
    }
}
