//! `retention.days`: finished runs older than this are deleted with their steps,
//! run log, approvals, notifications and agent journal, at start and every six
//! hours. Running runs are never touched. `days: 0` keeps everything.

use std::sync::Arc;
use std::time::Duration;

use super::Engine;
use crate::store::{Outcome, Write};

/// Deletes what is past retention now; returns how many runs went.
pub async fn prune_once(engine: &Arc<Engine>) -> u64 {
    let days = engine.config.retention_days;
    if days == 0 {
        return 0;
    }
    let cutoff = engine.now_ms() - (days as i64) * 86_400_000;
    match engine
        .store
        .commit(vec![Write::PruneFinishedBefore { cutoff }])
        .await
    {
        Ok(outcomes) => match outcomes.first() {
            Some(Outcome::Pruned { runs }) => {
                if *runs > 0 {
                    tracing::info!(runs, days, "Pruned finished runs past retention.");
                }
                *runs
            }
            _ => 0,
        },
        Err(e) => {
            tracing::error!(error = %e, "Retention pruning failed; will retry later.");
            0
        }
    }
}

/// Prunes at start and then every six hours until shutdown.
pub async fn run(engine: Arc<Engine>) {
    let mut shutdown = engine.shutdown_signal();
    loop {
        prune_once(&engine).await;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(6 * 3600)) => {}
            _ = shutdown.changed() => return,
        }
    }
}
