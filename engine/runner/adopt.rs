//! The orphan sweep of a replica on a shared store (SPEC 11.2): at start-up and
//! then every heartbeat, find the running runs nobody drives any more and take
//! them over, with the start-up sweep's own decisions and events.
//!
//! A run is an orphan when its lease is free: never leased, released at a step
//! boundary by a replica shutting down (a clean handoff), expired (its holder
//! stopped heartbeating: frozen, partitioned, dead), or held by a replica whose
//! database session has ended (killed: its liveness lock is free, so the run is
//! taken at once instead of after `lease_seconds`). What to do with each run is
//! `run::lease::orphan`; taking it is a compare-and-set of its epoch
//! (`Write::ClaimRun`), so of several replicas sweeping at once exactly one wins
//! each run. Then the claimed runs are decided as the start-up sweep decides
//! (`sweep::decide`: resume, or interrupt with its reason) and resumed in waves.
//!
//! Runs of a `vectorstep run` process (a lock-file owner) are not touched here yet:
//! on PostgreSQL such a process does not register as a replica.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::leases::{Adoption, Held, LeaseBook};
use super::{sweep, Engine, Error};
use crate::domain::RunStatus;
use crate::run::lease::{orphan, Lease, Orphan, Replica};
use crate::store::{Outcome, RunLeaseRow, RunRecord, Write};

/// What started a pass of the orphan sweep (logged with each run it adopts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepCause {
    /// This replica's start.
    Start,
    /// The heartbeat's timer.
    Heartbeat,
    /// Another replica let runs go (`LISTEN`/`NOTIFY` on the work channel).
    Notified,
}

impl SweepCause {
    fn as_str(self) -> &'static str {
        match self {
            SweepCause::Start => "start",
            SweepCause::Heartbeat => "heartbeat",
            SweepCause::Notified => "notified",
        }
    }
}

/// One pass: claims the orphans this replica may take, settles them and returns
/// those to resume, oldest first.
pub async fn claim_orphans(
    engine: &Arc<Engine>,
    cause: SweepCause,
) -> Result<Vec<RunRecord>, Error> {
    let Some(book) = engine.leases() else {
        return Ok(Vec::new());
    };
    let rows = engine.store.running_leases()?;
    if rows.iter().all(|r| book.holds(&r.run_id)) {
        return Ok(Vec::new());
    }
    let now = engine.store.db_now_ms()?;
    let timing = super::replica::timing(engine);
    // The other replicas that may still drive runs: not stopped, and neither
    // silent for a lease nor seen with their database session ended (probed
    // once per pass, and the answer kept for their leases below).
    let mut gone: HashMap<String, bool> = HashMap::new();
    let others: Vec<Replica> = engine
        .store
        .replicas()?
        .iter()
        .filter(|r| r.stopped_at.is_none() && r.id != book.replica())
        .map(Replica::from)
        .filter(|r| timing.live(r, now) && !probe(engine, &mut gone, &r.id))
        .collect();
    let mine: BTreeSet<String> = super::replica::loaded_fingerprints(engine);
    let mut claimed = Vec::new();
    for row in rows {
        if book.holds(&row.run_id) || row.cli_owner.is_some() {
            continue;
        }
        let (lease, holder_gone) = judge_holder(engine, book, &row, now, &mut gone);
        let decision = orphan(
            &row.fingerprint,
            lease.as_ref(),
            book.replica(),
            &mine,
            &others,
            timing,
            now,
        );
        let Orphan::Claim {
            epoch: _,
            from_replica,
            clean_handoff,
        } = decision
        else {
            if let Orphan::LeaveFor { replica } = decision {
                tracing::debug!(run_id = %row.run_id, replica = %replica, "Run left for the replica that has its pipeline version loaded.");
            }
            continue;
        };
        let claim = Write::ClaimRun {
            run_id: row.run_id.clone(),
            replica: book.replica().to_string(),
            expected_epoch: lease.as_ref().map_or(0, |l| l.epoch),
            lease_ms: book.lease_ms(),
            holder_gone,
        };
        if let Some(Outcome::Claimed { epoch }) = engine.store.commit(vec![claim]).await?.first() {
            book.hold(
                &row.run_id,
                Held {
                    epoch: *epoch,
                    adopted: Some(Adoption {
                        from_replica: from_replica.clone(),
                        clean_handoff,
                    }),
                },
            );
            claimed.push((row, from_replica, clean_handoff));
        }
    }
    if claimed.is_empty() {
        return Ok(Vec::new());
    }
    let mut runs = Vec::new();
    let mut uncounted = HashSet::new();
    for (row, from_replica, clean_handoff) in claimed {
        // Read now that it is ours: nothing else changes it any more.
        match engine.store.run(&row.run_id)? {
            Some(run) if run.status == RunStatus::Running => {
                tracing::warn!(run_id = %run.id, pipeline = %run.pipeline_name, from_replica = from_replica.as_deref().unwrap_or(""), clean_handoff, sweep = cause.as_str(), "Adopting a run nobody drives any more.");
                if from_replica.is_some() {
                    crate::telemetry::run_adopted(&run.pipeline_name);
                }
                if clean_handoff {
                    uncounted.insert(run.id.clone());
                }
                runs.push(run);
            }
            _ => book.forget(&row.run_id),
        }
    }
    let ids: Vec<String> = runs.iter().map(|r| r.id.clone()).collect();
    let resume = sweep::settle(engine, runs, &HashSet::new(), &uncounted).await?;
    let resumed: HashSet<&str> = resume.iter().map(|r| r.id.as_str()).collect();
    for id in ids.iter().filter(|id| !resumed.contains(id.as_str())) {
        // Interrupted by the settle: ended, nothing more to fence.
        book.forget(id);
    }
    Ok(resume)
}

/// The lease of `row` as the decision sees it: a holder whose database session
/// has ended (probed once per pass) counts as expired, and the claim may then take
/// its unexpired lease (`holder_gone`).
fn judge_holder(
    engine: &Engine,
    book: &LeaseBook,
    row: &RunLeaseRow,
    now: i64,
    gone: &mut HashMap<String, bool>,
) -> (Option<Lease>, bool) {
    let Some(mut lease) = row.lease.clone().map(Lease::from) else {
        return (None, false);
    };
    if lease.released || lease.expires_at <= now || lease.owner == book.replica() {
        return (Some(lease), false);
    }
    let holder_gone = probe(engine, gone, &lease.owner);
    if holder_gone {
        lease.expires_at = now;
    }
    (Some(lease), holder_gone)
}

/// Whether `replica`'s database session has ended, asked once per pass. Not
/// knowing counts as alive: its leases then run out by time.
fn probe(engine: &Engine, gone: &mut HashMap<String, bool>, replica: &str) -> bool {
    *gone
        .entry(replica.to_string())
        .or_insert_with(|| engine.store.replica_gone(replica).unwrap_or(false))
}

/// Sweeps for orphans every `replica.heartbeat_seconds` until shutdown, and at
/// once when another replica lets runs go (it notifies the work channel as it
/// releases them), and resumes what it claims.
pub async fn watch(engine: Arc<Engine>) {
    let every = Duration::from_millis(
        u64::try_from(super::replica::timing(&engine).heartbeat_ms).unwrap_or(1000),
    );
    let woken = Arc::new(tokio::sync::Notify::new());
    if let Some(url) = &engine.config.database_url {
        if let Err(e) = crate::store::listen_for_work(url, woken.clone()) {
            tracing::warn!(error = %e, "Cannot listen for runs other replicas let go; they are found by the heartbeat's sweep.");
        }
    }
    let mut shutdown = engine.shutdown_signal();
    loop {
        let cause = tokio::select! {
            _ = tokio::time::sleep(every) => SweepCause::Heartbeat,
            _ = woken.notified() => SweepCause::Notified,
            _ = shutdown.changed() => return,
        };
        if engine.is_shutting_down() {
            return;
        }
        cancel_requested_elsewhere(&engine);
        match claim_orphans(&engine, cause).await {
            Ok(runs) if !runs.is_empty() => sweep::resume_all(&engine, runs).await,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "Could not sweep for runs nobody drives; trying again at the next heartbeat.");
            }
        }
    }
}

/// Cancels the runs this replica drives that were cancelled through another
/// replica (which stored the request, `runner::cancel_request_key`): they stop at
/// their next step boundary here, where they are driven.
fn cancel_requested_elsewhere(engine: &Arc<Engine>) {
    let Some(book) = engine.leases() else {
        return;
    };
    let prefix = super::cancel_request_key("");
    let requests = match engine.store.kv_prefixed(&prefix) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "Could not read cancel requests; looking again at the next heartbeat.");
            return;
        }
    };
    for (key, by) in requests {
        let Some(run_id) = key.strip_prefix(&prefix) else {
            continue;
        };
        if book.holds(run_id) && !engine.is_cancelled(run_id) {
            let by = Some(by).filter(|b| !b.is_empty());
            engine.cancel_by(run_id, by.as_deref());
        }
    }
}

/// Releases every lease this replica still holds, at shutdown once no step is in
/// flight: the others take the runs at once, and the handoff is not counted as a
/// resume attempt.
pub async fn release_all(engine: &Engine) {
    let Some(book) = engine.leases() else {
        return;
    };
    let releases = book.releases();
    if releases.is_empty() {
        return;
    }
    let n = releases.len();
    match engine.store.commit(releases).await {
        Ok(_) => {
            tracing::info!(
                runs = n,
                "Released the leases of {n} run(s) for the other replicas to take at once."
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, "Could not release the run leases; the other replicas take the runs once the leases expire.");
        }
    }
}
