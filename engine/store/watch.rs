//! Who waits for a run's next log entry (the events stream of the web UI), so
//! a follower is woken by a commit that appended to its own run's log, not by
//! every commit of the store. The writer thread bumps the counter of each such
//! run after the commit; a follower waits on its `watch` receiver, which
//! remembers a change made between its last read and its wait, so no wake-up is
//! lost. Only runs somebody follows are in the map; writes of other processes or
//! replicas are not seen here (the follower polls for those).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

#[derive(Default)]
pub struct RunWatchers {
    map: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl RunWatchers {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        match self.map.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Follows `run_id` until the returned watch is dropped.
    pub fn subscribe(self: &Arc<Self>, run_id: &str) -> RunWatch {
        let rx = self
            .lock()
            .entry(run_id.to_string())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        RunWatch {
            rx,
            run_id: run_id.to_string(),
            owner: Arc::clone(self),
        }
    }

    /// After a commit: wakes the followers of these runs.
    pub(super) fn committed<'a>(&self, run_ids: impl Iterator<Item = &'a str>) {
        let map = self.lock();
        if map.is_empty() {
            return;
        }
        for id in run_ids {
            if let Some(tx) = map.get(id) {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// How many runs are followed (tests check it returns to zero).
    pub fn followed(&self) -> usize {
        self.lock().len()
    }
}

/// A follower of one run's log.
pub struct RunWatch {
    rx: watch::Receiver<u64>,
    run_id: String,
    owner: Arc<RunWatchers>,
}

impl RunWatch {
    /// Resolves once this process committed to the run's log since the last
    /// call (at once if it already has).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            // The sender lives in the map as long as a watch does; never here.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for RunWatch {
    fn drop(&mut self) {
        let mut map = self.owner.lock();
        // This watch is the last receiver: nobody follows the run any more.
        if map
            .get(&self.run_id)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            map.remove(&self.run_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_follower_is_woken_by_its_runs_commits_only_and_leaves_no_entry() {
        let w = Arc::new(RunWatchers::default());
        let mut a = w.subscribe("a");
        let b = w.subscribe("b");
        let b2 = w.subscribe("b");
        assert_eq!(w.followed(), 2);
        w.committed(["b"].into_iter());
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(50), a.changed()).await;
        assert!(quiet.is_err(), "a commit to b does not wake a");
        // A commit made before the wait is not lost.
        w.committed(["x", "a"].into_iter());
        tokio::time::timeout(std::time::Duration::from_secs(1), a.changed())
            .await
            .expect("woken");
        drop(b);
        assert_eq!(w.followed(), 2, "b is still followed by b2");
        drop(b2);
        drop(a);
        assert_eq!(w.followed(), 0);
    }
}
