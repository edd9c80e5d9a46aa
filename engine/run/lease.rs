//! Leases of runs among several replicas on one PostgreSQL store: the decisions
//! only (the store applies them in SQL, the runner acts on them).
//!
//! A replica drives a run only while it holds the run's lease: `(owner, epoch,
//! expires_at)`. Every write for the run carries the epoch it was leased under and
//! is refused once the epoch moved on ([`fence`]), so a replica that was frozen past
//! its lease (SIGSTOP, a long GC-like pause, a partition) and wakes up cannot
//! change a run another replica has adopted. Times are the database's clock, so
//! replicas with skewed clocks still agree on who holds what.
//!
//! What a replica does with a `running` run it comes across is [`orphan`]:
//! - a live lease of another replica: leave it ([`Orphan::Held`]);
//! - a run whose pipeline fingerprint this replica has not loaded, while a live
//!   replica has it (a rolling deploy): leave it for that one ([`Orphan::LeaveFor`]);
//! - otherwise claim it under the next epoch ([`Orphan::Claim`]) and then decide it
//!   as the start-up sweep does (`runner::sweep::decide`): resume, or interrupt it
//!   (a fingerprint nobody live has loaded is `resume_skipped_config_changed`).
//!
//! A lease released at a step boundary (SIGTERM) is a clean handoff: nothing was in
//! flight, so the adoption does not count toward `max_resume_attempts`.
//!
//! A run waiting on a human holds no lease: its lease is parked when the run
//! parks, and the sweep leaves it ([`Orphan::Parked`]) while the replica that
//! parked it lives. Whichever replica first sees its decision or its deadline (the
//! one deciding, or any replica's periodic check) claims it under the next epoch
//! and drives it on; once the parking replica is gone, the sweep adopts the run to
//! re-arm its wait (the deadline's timer, a message still owed), uncounted.
//!
//! A replica that cannot renew its leases (the database is unreachable) cannot
//! commit either, and every effect starts only after a commit (a step's `running`
//! record, a tool call's `started`), so it starts nothing new while cut off; when
//! it reaches the database again, a run adopted meanwhile refuses its fence.

use std::collections::BTreeSet;

/// A run's lease as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub owner: String,
    pub epoch: u64,
    /// Milliseconds on the database's clock.
    pub expires_at: i64,
    /// Given up at a step boundary by a replica shutting down.
    pub released: bool,
    /// The run waits on a human and nobody holds it (`Orphan::Parked`).
    pub parked: bool,
}

/// Another replica as the `replicas` table shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Replica {
    pub id: String,
    pub heartbeat_at: i64,
    /// The fingerprints of the pipelines it has loaded.
    pub fingerprints: BTreeSet<String>,
}

/// The lease settings (`replica.lease_seconds`, `replica.heartbeat_seconds`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    pub lease_ms: i64,
    pub heartbeat_ms: i64,
}

impl Timing {
    /// Whether `r` is alive at `now`: it heartbeat within one lease.
    pub fn live(&self, r: &Replica, now: i64) -> bool {
        now - r.heartbeat_at < self.lease_ms
    }
}

/// What a replica does with a `running` run it has come across.
#[derive(Debug, Clone, PartialEq)]
pub enum Orphan {
    /// Another replica's live lease: not this replica's run.
    Held { owner: String },
    /// Waits on a human with its lease parked: claimed by whoever acts on its
    /// decision or deadline, not by the sweep.
    Parked,
    /// Left for a live replica that has the run's pipeline version loaded.
    LeaveFor { replica: String },
    /// Take it under `epoch`, then decide it as the start-up sweep does.
    Claim {
        epoch: u64,
        /// The replica that held it before, if any (`run_resumed.from_replica`).
        from_replica: Option<String>,
        /// Released at a step boundary: not counted toward `max_resume_attempts`.
        clean_handoff: bool,
    },
}

/// What this replica (`me`, with `mine` loaded) does with a running run of
/// pipeline version `fingerprint` whose lease is `lease`, at `now`, given the
/// replicas it can see (`others`, itself excluded).
pub fn orphan(
    fingerprint: &str,
    lease: Option<&Lease>,
    me: &str,
    mine: &BTreeSet<String>,
    others: &[Replica],
    timing: Timing,
    now: i64,
) -> Orphan {
    // A parked run is left to its decision and deadline while the replica that
    // parked it lives (it keeps the deadline's timer and the delivery); once that
    // one is gone, another adopts it to re-arm both, uncounted like a handoff.
    let parked_by_live = lease.is_some_and(|l| {
        l.parked
            && (l.owner == me
                || others
                    .iter()
                    .any(|r| r.id == l.owner && timing.live(r, now)))
    });
    if parked_by_live {
        return Orphan::Parked;
    }
    let expired = lease.is_none_or(|l| l.released || l.parked || l.expires_at <= now);
    if let Some(l) = lease.filter(|_| !expired) {
        if l.owner != me {
            return Orphan::Held {
                owner: l.owner.clone(),
            };
        }
    }
    if !mine.contains(fingerprint) {
        let other = others
            .iter()
            .filter(|r| r.id != me && timing.live(r, now))
            .filter(|r| r.fingerprints.contains(fingerprint))
            .min_by(|a, b| a.id.cmp(&b.id));
        if let Some(r) = other {
            return Orphan::LeaveFor {
                replica: r.id.clone(),
            };
        }
    }
    Orphan::Claim {
        epoch: lease.map_or(1, |l| l.epoch + 1),
        from_replica: lease.map(|l| l.owner.clone()).filter(|o| o != me),
        clean_handoff: lease.is_some_and(|l| l.released || l.parked),
    }
}

/// Whether a write for a run, made by `writer` under `epoch`, may be applied to a
/// run whose lease is now `current`.
#[derive(Debug, Clone, PartialEq)]
pub enum Fence {
    Accept,
    /// Someone else leased the run since: the writer must stop driving it.
    Refuse {
        owner: String,
        epoch: u64,
    },
}

pub fn fence(current: &Lease, writer: &str, epoch: u64) -> Fence {
    if current.owner == writer && current.epoch == epoch && !current.released && !current.parked {
        Fence::Accept
    } else {
        Fence::Refuse {
            owner: current.owner.clone(),
            epoch: current.epoch,
        }
    }
}

/// The configuration is usable: a heartbeat leaves room for at least two renewals
/// per lease, so one lost heartbeat does not cost a replica its runs.
pub fn check_timing(lease_seconds: u64, heartbeat_seconds: u64) -> Result<Timing, String> {
    if heartbeat_seconds == 0 || lease_seconds < 2 * heartbeat_seconds + 1 {
        return Err(format!(
            "replica.lease_seconds ({lease_seconds}) must be more than twice \
             replica.heartbeat_seconds ({heartbeat_seconds}), which must be at least 1"
        ));
    }
    Ok(Timing {
        lease_ms: lease_seconds as i64 * 1000,
        heartbeat_ms: heartbeat_seconds as i64 * 1000,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing {
        lease_ms: 30_000,
        heartbeat_ms: 5_000,
    };
    const NOW: i64 = 1_000_000;

    fn lease(owner: &str, epoch: u64, expires_at: i64) -> Lease {
        Lease {
            owner: owner.into(),
            epoch,
            expires_at,
            released: false,
            parked: false,
        }
    }

    fn replica(id: &str, heartbeat_at: i64, fps: &[&str]) -> Replica {
        Replica {
            id: id.into(),
            heartbeat_at,
            fingerprints: fps.iter().map(|f| f.to_string()).collect(),
        }
    }

    fn set(fps: &[&str]) -> BTreeSet<String> {
        fps.iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn orphans() {
        let live_b = replica("b", NOW - 1_000, &["v2"]);
        let dead_c = replica("c", NOW - 60_000, &["v2"]);
        let released = Lease {
            released: true,
            ..lease("b", 4, NOW + 20_000)
        };
        let parked = Lease {
            parked: true,
            ..lease("b", 6, NOW - 1)
        };
        let claim = |epoch, from: Option<&str>, clean| Orphan::Claim {
            epoch,
            from_replica: from.map(str::to_string),
            clean_handoff: clean,
        };
        /// (what, fingerprint, lease, loaded here, other replicas, decision)
        type Row<'a> = (
            &'a str,
            &'a str,
            Option<Lease>,
            &'a [&'a str],
            Vec<Replica>,
            Orphan,
        );
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            ("never leased: claimed under epoch 1",
             "v1", None, &["v1"], vec![], claim(1, None, false)),
            ("a live lease of another replica is left alone",
             "v1", Some(lease("b", 3, NOW + 1)), &["v1"], vec![live_b.clone()],
             Orphan::Held { owner: "b".into() }),
            ("an expired lease is adopted under the next epoch, naming the old owner",
             "v1", Some(lease("b", 3, NOW)), &["v1"], vec![], claim(4, Some("b"), false)),
            ("a released lease is a clean handoff, taken at once",
             "v1", Some(released), &["v1"], vec![live_b.clone()], claim(5, Some("b"), true)),
            ("a version this replica lacks goes to a live replica that has it",
             "v2", Some(lease("x", 1, NOW - 1)), &["v1"], vec![live_b.clone()],
             Orphan::LeaveFor { replica: "b".into() }),
            ("a dead replica with that version does not count: claimed (then interrupted)",
             "v2", Some(lease("x", 1, NOW - 1)), &["v1"], vec![dead_c], claim(2, Some("x"), false)),
            ("a run parked by a live replica is left to its decision and deadline",
             "v1", Some(parked.clone()), &["v1"], vec![live_b.clone()], Orphan::Parked),
            ("so is one this replica parked",
             "v1", Some(Lease { owner: "a".into(), ..parked.clone() }), &["v1"], vec![], Orphan::Parked),
            ("a run parked by a replica now gone is adopted to re-arm it, uncounted",
             "v1", Some(parked.clone()), &["v1"], vec![], claim(7, Some("b"), true)),
            ("parked by a gone replica, a version this one lacks: left for one that has it",
             "v2", Some(parked), &["v1"], vec![replica("d", NOW, &["v2"])],
             Orphan::LeaveFor { replica: "d".into() }),
            ("its own unexpired lease (found again after a restart of the sweep)",
             "v1", Some(lease("a", 7, NOW + 5)), &["v1"], vec![], claim(8, None, false)),
        ];
        for (what, fp, l, mine, others, want) in rows {
            let got = orphan(fp, l.as_ref(), "a", &set(mine), &others, T, NOW);
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn the_lowest_id_of_several_replicas_with_the_version_is_named() {
        let others = [
            replica("c", NOW, &["v2"]),
            replica("b", NOW, &["v2"]),
            replica("d", NOW, &["v3"]),
        ];
        let got = orphan("v2", None, "a", &set(&["v1"]), &others, T, NOW);
        assert_eq!(
            got,
            Orphan::LeaveFor {
                replica: "b".into()
            }
        );
    }

    #[test]
    fn fences() {
        let current = lease("a", 3, NOW);
        assert_eq!(fence(&current, "a", 3), Fence::Accept);
        let refuse = Fence::Refuse {
            owner: "a".into(),
            epoch: 3,
        };
        assert_eq!(fence(&current, "a", 2), refuse, "an older epoch of its own");
        assert_eq!(fence(&current, "z", 3), refuse, "another replica");
        let released = Lease {
            released: true,
            ..current.clone()
        };
        assert!(matches!(fence(&released, "a", 3), Fence::Refuse { .. }));
        let parked = Lease {
            parked: true,
            ..current
        };
        assert!(
            matches!(fence(&parked, "a", 3), Fence::Refuse { .. }),
            "a parked run is nobody's to write"
        );
    }

    #[test]
    fn timings() {
        assert_eq!(check_timing(30, 5), Ok(T));
        assert!(check_timing(11, 5).is_ok());
        for (lease, hb) in [(10, 5), (5, 5), (30, 0)] {
            let e = check_timing(lease, hb).expect_err("refused");
            assert!(e.contains("replica.lease_seconds"), "{e}");
        }
    }

    #[test]
    fn liveness() {
        assert!(T.live(&replica("b", NOW - T.lease_ms + 1, &[]), NOW));
        assert!(!T.live(&replica("b", NOW - T.lease_ms, &[]), NOW));
    }
}
