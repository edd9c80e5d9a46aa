//! This process as a replica of a shared (PostgreSQL) store (SPEC 11): it has an id
//! of its own for this boot, and a heartbeat that tells the others it lives.
//!
//! Every `replica.heartbeat_seconds` one `Write::Heartbeat` records the time (the
//! database's clock), the fingerprints of the pipelines this process has loaded (so
//! a run of a pipeline version it lacks can be left for one that has it) and, in
//! the same statement's batch, renews every run lease it holds. A replica that
//! stops heartbeating is seen as dead once `replica.lease_seconds` have passed; one
//! that stops cleanly records `stopped_at` on its way out.
//!
//! The heartbeat also keeps the `vectorstep_replicas` gauge: the replicas seen
//! alive at the last beat, this one included.

use std::sync::Arc;
use std::time::Duration;

use super::Engine;
use crate::run::lease::{Replica, Timing};
use crate::store::{lock_replica, Outcome, ReplicaKind, ReplicaRecord, SessionLock, Write};

/// This boot's replica id: a time-ordered UUID, so ids sort by start.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// The machine's host name, if the system says (shown in `replicas list`).
pub fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// The lease settings in milliseconds.
pub fn timing(engine: &Engine) -> Timing {
    let r = engine.config.replica;
    Timing {
        lease_ms: i64::try_from(r.lease_seconds.saturating_mul(1000)).unwrap_or(i64::MAX),
        heartbeat_ms: i64::try_from(r.heartbeat_seconds.saturating_mul(1000)).unwrap_or(i64::MAX),
    }
}

/// How many of `replicas` are alive at `now`: heartbeat within one lease, not
/// stopped.
pub fn live_count(replicas: &[ReplicaRecord], timing: Timing, now: i64) -> usize {
    replicas
        .iter()
        .filter(|r| r.stopped_at.is_none() && timing.live(&Replica::from(*r), now))
        .count()
}

/// The fingerprints of the pipelines this process has loaded: what it publishes
/// in its heartbeat, and which runs its orphan sweep may resume.
pub fn loaded_fingerprints<C: FromIterator<String>>(engine: &Engine) -> C {
    // With the definitions a reload retired: runs started on them still resume here.
    engine.known_fingerprints().into_iter().collect()
}

/// The heartbeat write of this replica now.
fn beat(engine: &Engine, id: &str, kind: ReplicaKind, host: &Option<String>) -> Write {
    let fingerprints: Vec<String> = loaded_fingerprints(engine);
    Write::Heartbeat {
        replica: id.to_string(),
        kind,
        fingerprints_json: serde_json::Value::from(fingerprints).to_string(),
        host: host.clone(),
        lease_ms: u64::try_from(timing(engine).lease_ms).unwrap_or(0),
    }
}

/// This replica's liveness lock (`store::lock_replica`): while its database
/// session lives, the others know it does; once it ends (a kill, a lost
/// connection) they may take its runs before the leases expire. Taken again after
/// a database restart ended the session.
pub struct Liveness {
    url: Option<String>,
    lock: Option<SessionLock>,
}

impl Liveness {
    fn take(url: &Option<String>, id: &str) -> Liveness {
        let lock = url.as_deref().and_then(|u| match lock_replica(u, id) {
            Ok(lock) => lock,
            Err(e) => {
                tracing::warn!(replica = id, error = %e, "Could not take this replica's liveness lock; its runs are taken over only once their leases expire.");
                None
            }
        });
        Liveness {
            url: url.clone(),
            lock,
        }
    }

    /// Whether the lock is held now.
    pub fn is_held(&self) -> bool {
        self.lock.as_ref().is_some_and(SessionLock::is_held)
    }

    /// Takes the lock again if its session ended.
    fn keep(&mut self, id: &str) {
        if self.lock.as_ref().is_some_and(SessionLock::is_held) || self.url.is_none() {
            return;
        }
        if let Some(url) = &self.url {
            self.lock = lock_replica(url, id).ok().flatten();
            if self.lock.is_some() {
                tracing::info!(replica = id, "This replica's liveness lock is held again.");
            }
        }
    }
}

/// Registers this replica: its liveness lock, then its first heartbeat, committed
/// before the process says it is ready.
pub async fn register(
    engine: &Engine,
    id: &str,
    kind: ReplicaKind,
) -> Result<Liveness, super::Error> {
    let liveness = Liveness::take(&engine.config.database_url, id);
    engine
        .store
        .commit(vec![beat(engine, id, kind, &host_name())])
        .await?;
    tracing::info!(replica = id, "Registered as a replica of the shared store.");
    Ok(liveness)
}

/// Heartbeats until `stop` turns true, then records that this replica stopped.
/// `serve` stops it only after its drain and its lease release: while steps
/// still finish, its leases are renewed and its liveness lock held, so no other
/// replica takes a run in flight.
pub async fn heartbeat(
    engine: Arc<Engine>,
    id: String,
    kind: ReplicaKind,
    liveness: Liveness,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut liveness = liveness;
    let host = host_name();
    let every = Duration::from_millis(u64::try_from(timing(&engine).heartbeat_ms).unwrap_or(1000));
    let mut failing = false;
    while !*stop.borrow() {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => break,
        }
        liveness.keep(&id);
        match engine
            .store
            .commit(vec![beat(&engine, &id, kind, &host)])
            .await
        {
            Ok(outcomes) => {
                if failing {
                    tracing::info!(replica = %id, "The heartbeat is committed again.");
                    failing = false;
                }
                if let Some(Outcome::Renewed { runs }) = outcomes.first() {
                    tracing::debug!(replica = %id, runs, "Heartbeat.");
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(replica = %id, error = %e, "The heartbeat could not be committed; other replicas see this one as dead once its lease ends.");
                }
                failing = true;
                continue;
            }
        }
        refresh_gauge(&engine).await;
    }
    let stop = Write::StopReplica {
        replica: id.clone(),
    };
    if let Err(e) = engine.store.commit(vec![stop]).await {
        tracing::warn!(replica = %id, error = %e, "Could not record that this replica stopped; it is seen as dead once its lease ends.");
    }
}

/// Sets `vectorstep_replicas` from the table (read off the async workers: the
/// table holds every replica that ever ran until it is pruned).
async fn refresh_gauge(engine: &Arc<Engine>) {
    let store = engine.store.clone();
    let timing = timing(engine);
    let read = tokio::task::spawn_blocking(move || {
        let now = store.db_now_ms()?;
        Ok::<_, crate::store::Error>(live_count(&store.replicas()?, timing, now))
    })
    .await;
    if let Ok(Ok(n)) = read {
        crate::telemetry::replicas(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, heartbeat_at: i64, stopped_at: Option<i64>) -> ReplicaRecord {
        ReplicaRecord {
            id: id.into(),
            kind: ReplicaKind::Serve,
            started_at: 0,
            heartbeat_at,
            stopped_at,
            host: None,
            fingerprints: Vec::new(),
            runs: Vec::new(),
        }
    }

    #[test]
    fn a_replica_counts_as_live_within_one_lease_of_its_heartbeat_until_it_stops() {
        let t = Timing {
            lease_ms: 30_000,
            heartbeat_ms: 5_000,
        };
        let now = 100_000;
        let cases = [
            (vec![], 0),
            (vec![rec("a", now, None)], 1),
            (vec![rec("a", now - 29_999, None)], 1),
            (vec![rec("a", now - 30_000, None)], 0),
            (vec![rec("a", now, Some(now))], 0),
            (
                vec![
                    rec("a", now, None),
                    rec("b", now - 1_000, None),
                    rec("c", now - 60_000, None),
                ],
                2,
            ),
        ];
        for (replicas, want) in cases {
            assert_eq!(live_count(&replicas, t, now), want, "{replicas:?}");
        }
    }
}
