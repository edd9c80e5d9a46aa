//! What the engine remembers about a run only while it is being driven: whether it
//! was asked to stop (and by whom), the wake-ups of its approval waits, and the
//! approval rows its human steps already used. Everything is keyed by run and
//! dropped when the run's driver ends (see [`RunSignals::forget_run`]), so a
//! long-lived `serve` does not keep an entry per run it ever drove.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct RunSignals {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Runs asked to stop, with who asked (when known).
    cancelled: HashMap<String, Option<String>>,
    /// The wake-up of each approval token something (a wait, a delivery) listens on.
    approvals: HashMap<String, Arc<Notify>>,
    /// Approval tokens whose outcome a human step in this process has already used
    /// (see `human`): a retry or the next loop iteration asks afresh instead.
    used: HashSet<String>,
    /// The tokens of `approvals` and `used` by run, so a run's end drops them.
    tokens_of: HashMap<String, Vec<String>>,
}

/// How many entries [`RunSignals`] holds; all zero when no run is in progress.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetainedSizes {
    pub cancelled: usize,
    pub approval_signals: usize,
    pub approvals_used: usize,
    pub runs_indexed: usize,
}

impl RunSignals {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    pub fn cancel(&self, run_id: &str, by: Option<&str>) {
        self.lock()
            .cancelled
            .insert(run_id.to_string(), by.map(str::to_string));
    }

    pub fn is_cancelled(&self, run_id: &str) -> bool {
        self.lock().cancelled.contains_key(run_id)
    }

    pub fn cancelled_by(&self, run_id: &str) -> Option<String> {
        self.lock().cancelled.get(run_id).cloned().flatten()
    }

    /// The wake-up of `token` (an approval of `run_id`), created on first use.
    pub fn approval(&self, run_id: &str, token: &str) -> Arc<Notify> {
        let mut inner = self.lock();
        if let Some(n) = inner.approvals.get(token) {
            return n.clone();
        }
        let n = Arc::new(Notify::new());
        inner.approvals.insert(token.to_string(), n.clone());
        inner.index(run_id, token);
        n
    }

    /// The wake-up of `token` if something listens on it. Notifying a wake-up
    /// nobody waits on does nothing, so callers that only notify use this and do
    /// not create an entry.
    pub fn existing_approval(&self, token: &str) -> Option<Arc<Notify>> {
        self.lock().approvals.get(token).cloned()
    }

    /// Nobody waits on `token` any more; a late decision finds no entry.
    pub fn drop_approval(&self, token: &str) {
        self.lock().approvals.remove(token);
    }

    /// How many approval wake-ups exist (about the number of waits in tasks).
    pub fn approval_waiters(&self) -> usize {
        self.lock().approvals.len()
    }

    pub fn mark_used(&self, run_id: &str, token: &str) {
        let mut inner = self.lock();
        if inner.used.insert(token.to_string()) {
            inner.index(run_id, token);
        }
    }

    pub fn is_used(&self, token: &str) -> bool {
        self.lock().used.contains(token)
    }

    /// Drops everything kept for `run_id`: its driver has ended and nothing in this
    /// process will ask about it again (a new drive of the run starts afresh).
    pub fn forget_run(&self, run_id: &str) {
        let mut inner = self.lock();
        inner.cancelled.remove(run_id);
        if let Some(tokens) = inner.tokens_of.remove(run_id) {
            for t in tokens {
                inner.approvals.remove(&t);
                inner.used.remove(&t);
            }
        }
    }

    pub fn sizes(&self) -> RetainedSizes {
        let inner = self.lock();
        RetainedSizes {
            cancelled: inner.cancelled.len(),
            approval_signals: inner.approvals.len(),
            approvals_used: inner.used.len(),
            runs_indexed: inner.tokens_of.len(),
        }
    }
}

impl Inner {
    fn index(&mut self, run_id: &str, token: &str) {
        let tokens = self.tokens_of.entry(run_id.to_string()).or_default();
        if !tokens.iter().any(|t| t == token) {
            tokens.push(token.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_end_drops_everything_kept_for_it() {
        let s = RunSignals::default();
        s.cancel("r1", Some("alice"));
        s.cancel("r2", None);
        let _ = s.approval("r1", "t1");
        let _ = s.approval("r1", "t1");
        let _ = s.approval("r2", "t2");
        s.mark_used("r1", "t1");
        s.mark_used("r1", "t3");
        assert_eq!(
            s.sizes(),
            RetainedSizes {
                cancelled: 2,
                approval_signals: 2,
                approvals_used: 2,
                runs_indexed: 2
            }
        );
        assert_eq!(s.cancelled_by("r1").as_deref(), Some("alice"));
        s.forget_run("r1");
        assert!(!s.is_cancelled("r1") && s.is_cancelled("r2"));
        assert!(!s.is_used("t1") && s.existing_approval("t1").is_none());
        assert!(s.existing_approval("t2").is_some());
        s.forget_run("r2");
        assert_eq!(s.sizes(), RetainedSizes::default());
    }
}
