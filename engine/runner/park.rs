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
//! On a shared store (several replicas) a parked run holds no lease: its lease is
//! parked (`Write::ParkLease`) before the run is registered here, and whoever
//! drives it on first claims it under the next epoch (`leases::claim_parked_lease`).
//! That is this replica when the decision or the deadline reaches it first, the
//! replica where the decision was made, or any replica whose periodic check
//! ([`unpark_due_elsewhere`]) finds the run decided or past its deadline, also when
//! the replica that parked it is gone. The claim is a compare-and-set, so one of
//! them drives it.
//!
//! Only a top-level human step without `retry` or `loop_until`, in a run that is not
//! a sub-pipeline child, parks; anything else waits inside its task as before (see
//! `step::may_park`). A shutdown leaves parked runs as they are: they are durable
//! `waiting` steps, re-armed by the next start's sweep like any other.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::leases::claim_parked_lease;
use super::{DriveMode, Engine};

/// How often the keeper looks for approvals decided by another process on the same
/// store, and on a shared store for parked runs due anywhere (decisions made in
/// this process unpark at once).
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
        self.drive_unparked(parked.run_id, None);
        true
    }

    /// Drives parked run `run_id` on, after claiming its lease on a shared store
    /// (`expected_epoch`: the parked epoch, when known); a claim lost to another
    /// replica drives nothing.
    pub(crate) fn drive_unparked(self: &Arc<Self>, run_id: String, expected_epoch: Option<u64>) {
        self.active.fetch_add(1, Ordering::SeqCst);
        let engine = self.clone();
        tokio::spawn(async move {
            if !claim_parked_lease(&engine.store, engine.leases(), &run_id, expected_epoch).await {
                engine.release_slot();
                return;
            }
            let _ = engine.drive_counted(&run_id, DriveMode::Unpark, None).await;
        });
    }

    /// On a shared store, drives on a run not parked in this process whose
    /// approval was just decided here (or that was cancelled here): another
    /// replica may have parked it; the claim decides who drives it.
    pub(crate) fn unpark_shared(self: &Arc<Self>, run_id: &str) {
        if self.leases().is_some() && !self.is_shutting_down() {
            self.drive_unparked(run_id.to_string(), None);
        }
    }

    /// Unparks `run_id` wherever it is parked in this process (on any of its
    /// tokens); `false` when it is parked on none here.
    pub(crate) fn unpark_run(self: &Arc<Self>, run_id: &str) -> bool {
        let tokens: Vec<String> = self
            .parking()
            .by_token
            .iter()
            .filter(|(_, p)| p.run_id == run_id)
            .map(|(t, _)| t.clone())
            .collect();
        for t in &tokens {
            self.unpark(t);
        }
        !tokens.is_empty()
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
        if tokio::time::Instant::now() >= next_foreign_check {
            if engine.parked_runs() > 0 {
                unpark_decided_elsewhere(&engine);
            }
            if engine.leases().is_some() {
                unpark_due_elsewhere(&engine);
            }
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

/// On a shared store: drives on every parked run, parked by any replica, whose
/// approval was decided or whose deadline passed, so neither waits on the replica
/// that parked it (which may be gone). Runs parked here go through their entry.
fn unpark_due_elsewhere(engine: &Arc<Engine>) {
    let due = match engine.store.parked_due(engine.now_ms()) {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!(error = %e, "Could not read the parked runs; they are checked again later.");
            return;
        }
    };
    for (run_id, epoch) in due {
        if !engine.unpark_run(&run_id) {
            engine.drive_unparked(run_id, Some(epoch));
        }
    }
}
