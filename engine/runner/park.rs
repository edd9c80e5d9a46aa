//! Runs parked on a human approval hold no task.
//!
//! A run whose next move is a person's decision can wait for hours, and thousands
//! of them can wait at once. Instead of keeping each run's driver (its future, its
//! records, its plan) alive for the whole wait, `serve` parks it: once the approval
//! row and the step's `waiting` record are committed, the driver registers the
//! token here and ends. What stays in memory is the token, the run id and the
//! deadline. The run is driven again (see [`Engine::unpark`]) when
//! - its approval is decided in this process (page, API, CLI, Telegram),
//! - its deadline passes (the keeper below keeps one timer for all of them),
//! - the run is cancelled, or
//! - the keeper's periodic check finds it decided by another process.
//!
//! The new driver plans the run from its records exactly as a resume would (the
//! step is `waiting`, so it is re-armed with the same token), but logs nothing
//! about a restart: to the run log a parked wait is one uninterrupted wait.
//!
//! Ownership is the map entry: whoever removes a token's entry drives the run on,
//! so a decision racing the driver that is parking never yields two drivers.
//!
//! Only a top-level human step without `retry` or `loop_until`, in a run that is not
//! a sub-pipeline child, parks; anything else waits inside its task as before (see
//! `step::may_park`). A shutdown leaves parked runs as they are: they are durable
//! `waiting` steps, re-armed by the next start's sweep like any other.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{DriveMode, Engine};

/// How often the keeper looks for approvals decided by another process on the same
/// store (decisions made in this process unpark at once).
const FOREIGN_DECISIONS_EVERY: Duration = Duration::from_secs(5);

/// One parked run.
pub(super) struct Parked {
    run_id: String,
    deadline_at: i64,
}

/// The parked runs, by token and by deadline.
#[derive(Default)]
pub(crate) struct Parking {
    by_token: HashMap<String, Parked>,
    /// `(deadline_at, token)`, so the keeper finds the next deadline without a scan.
    by_deadline: BTreeSet<(i64, String)>,
}

impl Parking {
    pub(crate) fn len(&self) -> usize {
        self.by_token.len()
    }

    /// Adds a parked run; `true` when its deadline is now the earliest.
    pub(super) fn insert(&mut self, token: &str, run_id: &str, deadline_at: i64) -> bool {
        let before = self.by_deadline.first().map(|(d, _)| *d);
        self.by_token.insert(
            token.to_string(),
            Parked {
                run_id: run_id.to_string(),
                deadline_at,
            },
        );
        self.by_deadline.insert((deadline_at, token.to_string()));
        before.is_none_or(|d| deadline_at < d)
    }

    pub(super) fn remove(&mut self, token: &str) -> Option<Parked> {
        let parked = self.by_token.remove(token)?;
        self.by_deadline
            .remove(&(parked.deadline_at, token.to_string()));
        if self.by_token.is_empty() && self.by_token.capacity() > 1024 {
            // A burst grew the table; do not keep its peak size.
            self.by_token.shrink_to_fit();
        }
        Some(parked)
    }
}

impl Engine {
    /// Lets human steps park their runs instead of waiting in a task (`serve`),
    /// and starts the keeper that acts on their deadlines. Off by default:
    /// `vectorstep run` and embedders drive a run to its end.
    pub fn enable_parking(self: &Arc<Self>) {
        if self.turn_parking_on() {
            tokio::spawn(keeper(self.clone()));
        }
    }

    /// Drives the run parked on `token` again, if one is; `false` when none is
    /// parked on it here (it is waiting in a task, or nothing waits on it).
    pub(crate) fn unpark(self: &Arc<Self>, token: &str) -> bool {
        if self.is_shutting_down() {
            // Not driven now: the run stays `waiting` in the store and the next
            // start re-arms it.
            return false;
        }
        let Some(parked) = self.parking().remove(token) else {
            return false;
        };
        self.active.fetch_add(1, Ordering::SeqCst);
        let engine = self.clone();
        tokio::spawn(async move {
            engine
                .drive_counted(&parked.run_id, DriveMode::Unpark, None)
                .await
        });
        true
    }

    /// Unparks every run parked on one of the tokens of `run_id` (cancellation).
    pub(crate) fn unpark_run(self: &Arc<Self>, run_id: &str) {
        let tokens: Vec<String> = self
            .parking()
            .by_token
            .iter()
            .filter(|(_, p)| p.run_id == run_id)
            .map(|(t, _)| t.clone())
            .collect();
        for t in tokens {
            self.unpark(&t);
        }
    }
}

/// One timer for every parked deadline, plus the check for foreign decisions.
/// Started with parking (`serve`); ends at shutdown.
async fn keeper(engine: Arc<Engine>) {
    let mut shutdown = engine.shutdown_signal();
    let mut next_foreign_check = tokio::time::Instant::now() + FOREIGN_DECISIONS_EVERY;
    loop {
        let changed = engine.parking_changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if engine.is_shutting_down() {
            return;
        }
        let now = engine.now_ms();
        let due: Vec<String> = {
            let p = engine.parking();
            p.by_deadline
                .iter()
                .take_while(|(d, _)| *d <= now)
                .map(|(_, t)| t.clone())
                .collect()
        };
        for token in due {
            engine.unpark(&token);
        }
        if tokio::time::Instant::now() >= next_foreign_check && engine.parked_runs() > 0 {
            unpark_decided_elsewhere(&engine);
            next_foreign_check = tokio::time::Instant::now() + FOREIGN_DECISIONS_EVERY;
        }
        let next_deadline = engine.parking().by_deadline.first().map(|(d, _)| *d);
        let until_deadline = next_deadline
            .map(|d| Duration::from_millis((d - engine.now_ms()).max(0) as u64))
            .unwrap_or(FOREIGN_DECISIONS_EVERY);
        let until_check = next_foreign_check.saturating_duration_since(tokio::time::Instant::now());
        tokio::select! {
            _ = tokio::time::sleep(until_deadline.min(until_check)) => {}
            _ = &mut changed => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Unparks runs whose approval is no longer pending in the store although nobody
/// here decided it: another process on the same database did.
fn unpark_decided_elsewhere(engine: &Arc<Engine>) {
    let pending: HashSet<String> = match engine.store.pending_approval_tokens() {
        Ok(t) => t.into_iter().collect(),
        Err(e) => {
            tracing::warn!(error = %e, "Could not read pending approvals; parked runs are checked again later.");
            return;
        }
    };
    let decided: Vec<String> = engine
        .parking()
        .by_token
        .keys()
        .filter(|t| !pending.contains(*t))
        .cloned()
        .collect();
    for token in decided {
        engine.unpark(&token);
    }
}
