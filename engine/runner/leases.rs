//! The run leases this process holds as a replica of a shared (PostgreSQL) store
//! (SPEC 11.1), and the fence every write for such a run carries.
//!
//! A run this replica creates is leased to it in the run's own commit
//! (`Write::LeaseNewRun`, epoch 1); a run it adopts is claimed first
//! (`Write::ClaimRun`, the next epoch; see `sweep::claim_orphans`). From then on
//! every commit for the run starts with `Write::Fence` of that epoch
//! (`persist::commit`), so once another replica has taken the run over, the next
//! commit of this one is refused whole and its driver stops without writing.
//!
//! The book forgets a run when its driver ends it, or when a fence was refused;
//! the heartbeat (`replica`) renews every lease this replica holds in the store
//! with one statement, so the book need not list them for that. On SQLite there is
//! no book: one process, nothing to fence.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::store::{Outcome, Store, Write};

/// One lease this replica holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub epoch: u64,
    /// How the run came to this replica, until its resume has been announced
    /// (`run_resumed.from_replica`); `None` for a run it created.
    pub adopted: Option<Adoption>,
}

/// A run taken from another replica (or from nobody, e.g. a run an older single
/// node left running).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoption {
    pub from_replica: Option<String>,
    /// Released at a step boundary by its previous holder: the resume is not
    /// counted toward `max_resume_attempts`.
    pub clean_handoff: bool,
}

/// The leases of this replica, by run id.
pub struct LeaseBook {
    replica: String,
    lease_ms: u64,
    held: Mutex<HashMap<String, Held>>,
}

impl LeaseBook {
    pub fn new(replica: &str, lease_ms: u64) -> LeaseBook {
        LeaseBook {
            replica: replica.to_string(),
            lease_ms,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// This replica's id.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        match self.held.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    pub fn hold(&self, run_id: &str, held: Held) {
        self.map().insert(run_id.to_string(), held);
    }

    pub fn holds(&self, run_id: &str) -> bool {
        self.map().contains_key(run_id)
    }

    /// Forgets `run_id` (ended, or lost to another replica).
    pub fn forget(&self, run_id: &str) {
        let mut map = self.map();
        map.remove(run_id);
        if map.is_empty() && map.capacity() > 1024 {
            map.shrink_to_fit();
        }
    }

    /// How `run_id` was adopted, once: the resume that announces it takes it.
    pub fn take_adoption(&self, run_id: &str) -> Option<Adoption> {
        self.map().get_mut(run_id).and_then(|h| h.adopted.take())
    }

    /// The fence a commit for `run_id` starts with, if this replica leases it.
    pub fn fence(&self, run_id: &str) -> Option<Write> {
        let epoch = self.map().get(run_id)?.epoch;
        Some(Write::Fence {
            run_id: run_id.to_string(),
            replica: self.replica.clone(),
            epoch,
        })
    }

    /// The write that parks `run_id`'s lease (its run now waits on a human), if
    /// this replica leases it; the book keeps it until that write is committed.
    pub fn park(&self, run_id: &str) -> Option<Write> {
        let epoch = self.map().get(run_id)?.epoch;
        Some(Write::ParkLease {
            run_id: run_id.to_string(),
            replica: self.replica.clone(),
            epoch,
        })
    }

    /// Releases for every lease held, for a clean handoff at shutdown.
    pub fn releases(&self) -> Vec<Write> {
        self.map()
            .iter()
            .map(|(run_id, h)| Write::ReleaseLease {
                run_id: run_id.clone(),
                replica: self.replica.clone(),
                epoch: h.epoch,
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// On a shared store, parks the lease of `run_id` before the run parks on an
/// approval: from now on no replica holds it. `false`: the lease is not this
/// replica's any more, or the store did not take the write; the run then waits in
/// its task, still leased. Always `true` with no leases (SQLite).
pub(super) async fn park_lease(store: &Store, book: Option<&LeaseBook>, run_id: &str) -> bool {
    let Some(book) = book else {
        return true;
    };
    let Some(write) = book.park(run_id) else {
        return false;
    };
    match store.commit(vec![write]).await {
        Ok(outcomes) if outcomes.first() == Some(&Outcome::Done) => {
            book.forget(run_id);
            true
        }
        Ok(_) => false,
        Err(e) => {
            tracing::warn!(run_id = %run_id, error = %e, "Could not park the run's lease; it waits in its task.");
            false
        }
    }
}

/// On a shared store, claims the parked lease of `run_id` (under the epoch after
/// `expected_epoch`, or after the parked one read now), so this replica may drive
/// it on. `false`: it is not parked any more (another replica claimed it first),
/// or the store did not answer. Always `true` with no leases (SQLite).
pub(super) async fn claim_parked_lease(
    store: &Store,
    book: Option<&LeaseBook>,
    run_id: &str,
    expected_epoch: Option<u64>,
) -> bool {
    let Some(book) = book else {
        return true;
    };
    let expected = match expected_epoch {
        Some(e) => e,
        None => match store.lease(run_id) {
            Ok(Some(l)) if l.parked => l.epoch,
            Ok(_) => return false,
            Err(e) => {
                tracing::warn!(run_id = %run_id, error = %e, "Could not read a parked run's lease; it is checked again later.");
                return false;
            }
        },
    };
    let claim = Write::ClaimRun {
        run_id: run_id.to_string(),
        replica: book.replica().to_string(),
        expected_epoch: expected,
        lease_ms: book.lease_ms(),
        holder_gone: false,
    };
    match store.commit(vec![claim]).await {
        Ok(outcomes) => match outcomes.first() {
            Some(Outcome::Claimed { epoch }) => {
                book.hold(
                    run_id,
                    Held {
                        epoch: *epoch,
                        adopted: None,
                    },
                );
                true
            }
            _ => false,
        },
        Err(e) => {
            tracing::warn!(run_id = %run_id, error = %e, "Could not claim a parked run; it is checked again later.");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_run_is_fenced_by_its_epoch_until_forgotten() {
        let book = LeaseBook::new("a", 30_000);
        assert_eq!(book.fence("r1"), None, "not leased: no fence");
        book.hold(
            "r1",
            Held {
                epoch: 4,
                adopted: Some(Adoption {
                    from_replica: Some("b".into()),
                    clean_handoff: true,
                }),
            },
        );
        assert_eq!(
            book.fence("r1"),
            Some(Write::Fence {
                run_id: "r1".into(),
                replica: "a".into(),
                epoch: 4
            })
        );
        let adoption = book.take_adoption("r1").expect("adopted");
        assert_eq!(adoption.from_replica.as_deref(), Some("b"));
        assert_eq!(book.take_adoption("r1"), None, "announced once");
        assert!(
            book.fence("r1").is_some(),
            "still held after the announcement"
        );
        assert_eq!(
            book.releases(),
            vec![Write::ReleaseLease {
                run_id: "r1".into(),
                replica: "a".into(),
                epoch: 4
            }]
        );
        book.forget("r1");
        assert_eq!(book.fence("r1"), None);
        assert!(book.is_empty());
    }
}
