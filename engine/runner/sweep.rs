//! The startup sweep (SPEC 6.3): for every run left `running`, decide whether to
//! resume it or mark it `interrupted`, and say why. `decide` is pure so
//! `vectorstep sweep --dry-run` prints exactly what a start would do.
//!
//! A run created by `vectorstep run` belongs to that process while it holds its
//! lock (`store::lock`): the sweep leaves it alone, and `watch_owners` adopts it
//! with the same decisions once the owner died without ending it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Engine, Error};
use crate::config::Config;
use crate::domain::RunStatus;
use crate::events::Event;
use crate::pipeline::PipelineSet;
use crate::store::lock::{self, FileLock, Probe};
use crate::store::{RunRecord, Write};

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Resume,
    Interrupt {
        /// `run_interrupted`, `resume_skipped_config_changed`, ...
        event: Event,
        /// The label of `vectorstep_runs_interrupted_total`.
        reason: &'static str,
        message: String,
    },
}

/// Decides one run. `now_ms` is the sweep's time.
pub fn decide(run: &RunRecord, pipelines: &PipelineSet, config: &Config, now_ms: i64) -> Decision {
    let Some(p) = pipelines.get(&run.pipeline_name) else {
        return Decision::Interrupt {
            event: Event::RunInterrupted {
                reason: "pipeline_missing".into(),
            },
            reason: "pipeline_missing",
            message: format!("Service restarted while this run was in progress; pipeline `{}` is no longer loaded.", run.pipeline_name),
        };
    };
    let Some(durable) = &p.durable else {
        return Decision::Interrupt {
            event: Event::RunInterrupted {
                reason: "not_durable".into(),
            },
            reason: "not_durable",
            message:
                "Service restarted while this run was in progress; the pipeline is not durable."
                    .into(),
        };
    };
    if run.config_fingerprint != p.fingerprint {
        return Decision::Interrupt {
            event: Event::ResumeSkippedConfigChanged {
                stored_fingerprint: run.config_fingerprint.clone(),
                current_fingerprint: p.fingerprint.clone(),
            },
            reason: "config_changed",
            message: "Pipeline steps changed while this run was down; resuming under different semantics is refused.".into(),
        };
    }
    let limit = durable
        .max_resume_age_seconds
        .unwrap_or(config.durability.max_resume_age_seconds);
    let age_seconds = (now_ms - run.triggered_at).max(0) as f64 / 1000.0;
    if age_seconds > limit as f64 {
        return Decision::Interrupt {
            event: Event::ResumeSkippedMaxAgeExceeded {
                age_seconds,
                max_resume_age_seconds: limit,
            },
            reason: "max_age_exceeded",
            message: format!(
                "Run is {age_seconds:.0}s old, over max_resume_age_seconds={limit}; not resumed."
            ),
        };
    }
    let max = config.durability.max_resume_attempts;
    if run.resume_count >= max {
        return Decision::Interrupt {
            event: Event::ResumeAttemptsExhausted {
                resume_count: run.resume_count,
                max_resume_attempts: max,
            },
            reason: "resume_attempts_exhausted",
            message: format!("Run was already resumed {} time(s) (max_resume_attempts={max}); not resumed again.", run.resume_count),
        };
    }
    Decision::Resume
}

/// Applies the sweep: interrupts what cannot resume and returns the runs to resume,
/// oldest first. Nothing is started here. A run owned by a live `vectorstep run`
/// process is left alone; the runs of an owner that died are adopted like any other.
///
/// On a shared store the start-up sweep is the replica's first orphan sweep
/// instead (`adopt::claim_orphans`): only runs nobody else drives are taken.
pub async fn sweep(engine: &Arc<Engine>) -> Result<Vec<RunRecord>, Error> {
    let listed = engine.store.running_runs_with_owners()?;
    let mut owners = Owners::new(engine.store.path());
    let mut runs = Vec::new();
    let mut adopted = HashSet::new();
    for (run, owner) in listed {
        match owner {
            None => runs.push(run),
            Some(owner) => {
                if owners.gone(&owner) {
                    // Read again now that the owner's lock is ours: it may have
                    // ended the run between the listing and the probe.
                    if let Some(run) = engine
                        .store
                        .run(&run.id)?
                        .filter(|r| r.status == RunStatus::Running)
                    {
                        adopted.insert(run.id.clone());
                        runs.push(run);
                    }
                } else {
                    tracing::info!(run_id = %run.id, pipeline = %run.pipeline_name, owner = %owner, "Run left to the live `vectorstep run` process that owns it.");
                }
            }
        }
    }
    let resume = settle(engine, runs, &adopted, &HashSet::new()).await?;
    // The dead owners' lock files go once their runs are ours.
    drop(owners);
    Ok(resume)
}

/// How often `serve` looks for runs whose `vectorstep run` owner died after the
/// start-up sweep. Cheap: one indexed read of owned running runs and a `flock` try
/// per owner.
pub const OWNER_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// Adopts, every [`OWNER_CHECK_INTERVAL`] until shutdown, the running runs of
/// `vectorstep run` processes that died without ending them: the same decisions and
/// events as the start-up sweep, then resumed in waves.
pub async fn watch_owners(engine: Arc<Engine>) {
    let mut shutdown = engine.shutdown_signal();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(OWNER_CHECK_INTERVAL) => {}
            _ = shutdown.changed() => return,
        }
        if engine.is_shutting_down() {
            return;
        }
        match adopt_orphans(&engine).await {
            Ok(runs) if !runs.is_empty() => resume_all(&engine, runs).await,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "Could not check the owners of `vectorstep run` runs; trying again shortly.");
            }
        }
    }
}

/// One pass of [`watch_owners`]: settles the runs of dead owners and returns those
/// to resume.
pub async fn adopt_orphans(engine: &Arc<Engine>) -> Result<Vec<RunRecord>, Error> {
    let owned = engine.store.owned_running_runs()?;
    if owned.is_empty() {
        return Ok(Vec::new());
    }
    let mut owners = Owners::new(engine.store.path());
    let mut runs = Vec::new();
    let mut adopted = HashSet::new();
    for (run_id, owner) in owned {
        if !owners.gone(&owner) {
            continue;
        }
        // Read after the owner's lock was taken: nothing changes it any more.
        if let Some(run) = engine
            .store
            .run(&run_id)?
            .filter(|r| r.status == RunStatus::Running)
        {
            adopted.insert(run.id.clone());
            runs.push(run);
        }
    }
    if runs.is_empty() {
        return Ok(Vec::new());
    }
    tracing::warn!(
        count = runs.len(),
        "Adopting {} run(s) of a `vectorstep run` process that died without ending them.",
        runs.len()
    );
    let resume = settle(engine, runs, &adopted, &HashSet::new()).await?;
    drop(owners);
    Ok(resume)
}

/// Who owns a running run, as `sweep --dry-run` reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum Ownership {
    /// `serve` owns it (or will, once started).
    Serve,
    /// A live `vectorstep run` process holds its lock: the sweep leaves it alone.
    LiveCli { pid: Option<u32>, lock: PathBuf },
    /// Its `vectorstep run` process died: the sweep adopts it.
    DeadCli,
}

/// Probes the owner of a run without keeping its lock or removing anything.
pub fn ownership(database: &Path, owner: Option<&str>) -> Ownership {
    let Some(owner) = owner else {
        return Ownership::Serve;
    };
    match lock::probe_owner(database, owner) {
        Ok(Probe::Alive { pid, lock }) => Ownership::LiveCli { pid, lock },
        Ok(Probe::Gone(held)) => {
            if let Some(l) = held {
                l.keep_file();
            }
            Ownership::DeadCli
        }
        // Unknown counts as alive: the sweep does not touch what it cannot check.
        Err(_) => Ownership::LiveCli {
            pid: None,
            lock: lock::owner_lock_path(database, owner).unwrap_or_default(),
        },
    }
}

/// The owners probed by one pass, each once. Holds the locks of dead owners until
/// dropped (after their runs were settled), which removes their files.
struct Owners<'a> {
    /// The SQLite file the owners' locks sit beside; `None` on PostgreSQL.
    database: Option<&'a Path>,
    seen: HashMap<String, bool>,
    held: Vec<FileLock>,
}

impl<'a> Owners<'a> {
    fn new(database: Option<&'a Path>) -> Self {
        Owners {
            database,
            seen: HashMap::new(),
            held: Vec::new(),
        }
    }

    /// Whether `owner` died; its lock is kept (if its file was there).
    fn gone(&mut self, owner: &str) -> bool {
        if let Some(gone) = self.seen.get(owner) {
            return *gone;
        }
        let Some(database) = self.database else {
            // PostgreSQL: a `vectorstep run` process holds its run by lease, not
            // by a lock file here (runner::replica); never take it from here.
            return false;
        };
        let gone = match lock::probe_owner(database, owner) {
            Ok(Probe::Alive { .. }) => false,
            Ok(Probe::Gone(held)) => {
                self.held.extend(held);
                true
            }
            Err(e) => {
                // Not knowing is treated as alive: never take a run from a live owner.
                tracing::warn!(owner, error = %e, "Cannot check the lock of a `vectorstep run` process; its runs are left alone.");
                false
            }
        };
        self.seen.insert(owner.to_string(), gone);
        gone
    }
}

/// Interrupts what cannot resume among `runs` and returns the rest, in order. The
/// runs in `adopted` (whose owner died) become `serve`'s: their owner is cleared in
/// the same commit.
///
/// The runs in `uncounted` were handed over cleanly by another replica: taking
/// them is not a resume attempt, so `max_resume_attempts` does not stop them.
pub(super) async fn settle(
    engine: &Arc<Engine>,
    runs: Vec<RunRecord>,
    adopted: &HashSet<String>,
    uncounted: &HashSet<String>,
) -> Result<Vec<RunRecord>, Error> {
    let now = engine.now_ms();
    let mut resume = Vec::new();
    let mut writes = Vec::new();
    let mut interrupted = Vec::new();
    for run in runs {
        if adopted.contains(&run.id) {
            writes.push(Write::SetRunOwner {
                run_id: run.id.clone(),
                owner: None,
            });
        }
        // The definition the run started with when a reload retired it since (an
        // orphan adopted from a replica), else the current one by name.
        let pipelines = PipelineSet {
            pipelines: engine
                .pipeline_for_run(&run.pipeline_name, &run.config_fingerprint)
                .into_iter()
                .collect(),
        };
        let decision = if uncounted.contains(&run.id) {
            let fresh = RunRecord {
                resume_count: 0,
                ..run.clone()
            };
            decide(&fresh, &pipelines, &engine.config, now)
        } else {
            decide(&run, &pipelines, &engine.config, now)
        };
        match decision {
            Decision::Resume => resume.push(run),
            Decision::Interrupt {
                event,
                reason,
                message,
            } => {
                tracing::warn!(run_id = %run.id, pipeline = %run.pipeline_name, reason, "Run not resumed: {message}");
                crate::telemetry::run_interrupted(&run.pipeline_name, reason);
                // A terminal status like any other: finished runs count it too.
                crate::telemetry::run_finished(
                    &run.pipeline_name,
                    crate::domain::RunStatus::Interrupted.as_str(),
                );
                writes.push(event.write(&run.id, now, message.clone()));
                if !matches!(event, Event::RunInterrupted { .. }) {
                    writes.push(
                        Event::RunInterrupted {
                            reason: reason.to_string(),
                        }
                        .write(
                            &run.id,
                            now,
                            "Service restarted while this run was in progress.",
                        ),
                    );
                }
                writes.push(Write::FinishRun {
                    run_id: run.id.clone(),
                    status: RunStatus::Interrupted,
                    completed_at: now,
                    terminal_step: None,
                    reason: Some(message),
                    final_output_json: None,
                });
                writes.push(Write::CloseApprovalsOfRun {
                    run_id: run.id.clone(),
                    at: now,
                });
                interrupted.push(run.id.clone());
            }
        }
    }
    if !writes.is_empty() {
        engine.store.commit(writes).await?;
    }
    for id in &interrupted {
        // Chat messages of the approvals just closed say so (in the background).
        engine.publish(super::ApprovalChange::Closed { run_id: id.clone() });
    }
    if !resume.is_empty() {
        tracing::warn!(
            count = resume.len(),
            "Resuming {} durable run(s) after restart.",
            resume.len()
        );
    }
    Ok(resume)
}

/// How many runs a start-up resumes at once. Resuming reads a run's records, plans
/// it and commits `run_resumed`; with 10,000 runs parked on approvals, starting them
/// all at once kept every run's transient state alive at the same moment (about
/// 120 MB) although each ends up parked in a few hundred bytes.
const RESUME_WAVE: usize = 500;

/// How long a wave may hold back the next: a wave whose runs go on to long steps
/// (an agent call re-run) does not delay the others by more than this.
const WAVE_PATIENCE: std::time::Duration = std::time::Duration::from_millis(250);

/// Counts the runs of a wave that have not settled yet.
struct Wave {
    unsettled: std::sync::atomic::AtomicUsize,
    settled: tokio::sync::Notify,
}

/// One run's place in a wave; dropping it says the run has settled.
pub struct WaveTicket(Arc<Wave>);

impl Drop for WaveTicket {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        if self.0.unsettled.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.settled.notify_waiters();
        }
    }
}

/// Resumes `runs` (what [`sweep`] returned) in waves of [`RESUME_WAVE`]: each wave
/// starts when the previous one has settled (parked, ended, or reached a step that
/// calls out) or after [`WAVE_PATIENCE`]. Returns once every run has been started.
pub async fn resume_all(engine: &Arc<Engine>, runs: Vec<RunRecord>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut runs = runs.into_iter().peekable();
    while runs.peek().is_some() {
        let batch: Vec<RunRecord> = runs.by_ref().take(RESUME_WAVE).collect();
        let wave = Arc::new(Wave {
            unsettled: AtomicUsize::new(batch.len()),
            settled: tokio::sync::Notify::new(),
        });
        let settled = wave.settled.notified();
        tokio::pin!(settled);
        settled.as_mut().enable();
        for run in batch {
            engine.spawn_resume(run.id, WaveTicket(wave.clone()));
        }
        if wave.unsettled.load(Ordering::SeqCst) > 0 {
            let _ = tokio::time::timeout(WAVE_PATIENCE, settled).await;
        }
    }
}
