//! The startup sweep (SPEC 6.3): for every run left `running`, decide whether to
//! resume it or mark it `interrupted`, and say why. `decide` is pure so
//! `vectorstep sweep --dry-run` prints exactly what a start would do.

use std::sync::Arc;

use serde_json::json;

use super::records::event;
use super::{Engine, Error};
use crate::config::Config;
use crate::pipeline::PipelineSet;
use crate::store::{RunRecord, Write};

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Resume,
    Interrupt {
        /// `run_interrupted`, `resume_skipped_config_changed`, ...
        event: &'static str,
        /// The label of `vectorstep_runs_interrupted_total`.
        reason: &'static str,
        message: String,
        fields: serde_json::Value,
    },
}

/// Decides one run. `now_ms` is the sweep's time.
pub fn decide(run: &RunRecord, pipelines: &PipelineSet, config: &Config, now_ms: i64) -> Decision {
    let Some(p) = pipelines.get(&run.pipeline_name) else {
        return Decision::Interrupt {
            event: "run_interrupted",
            reason: "pipeline_missing",
            message: format!("Service restarted while this run was in progress; pipeline `{}` is no longer loaded.", run.pipeline_name),
            fields: json!({"reason": "pipeline_missing"}),
        };
    };
    let Some(durable) = &p.durable else {
        return Decision::Interrupt {
            event: "run_interrupted",
            reason: "not_durable",
            message:
                "Service restarted while this run was in progress; the pipeline is not durable."
                    .into(),
            fields: json!({"reason": "not_durable"}),
        };
    };
    if run.config_fingerprint != p.fingerprint {
        return Decision::Interrupt {
            event: "resume_skipped_config_changed",
            reason: "config_changed",
            message: "Pipeline steps changed while this run was down; resuming under different semantics is refused.".into(),
            fields: json!({"stored_fingerprint": run.config_fingerprint, "current_fingerprint": p.fingerprint}),
        };
    }
    let limit = durable
        .max_resume_age_seconds
        .unwrap_or(config.durability.max_resume_age_seconds);
    let age_seconds = (now_ms - run.triggered_at).max(0) as f64 / 1000.0;
    if age_seconds > limit as f64 {
        return Decision::Interrupt {
            event: "resume_skipped_max_age_exceeded",
            reason: "max_age_exceeded",
            message: format!(
                "Run is {age_seconds:.0}s old, over max_resume_age_seconds={limit}; not resumed."
            ),
            fields: json!({"age_seconds": age_seconds, "max_resume_age_seconds": limit}),
        };
    }
    let max = config.durability.max_resume_attempts;
    if run.resume_count >= max {
        return Decision::Interrupt {
            event: "resume_attempts_exhausted",
            reason: "resume_attempts_exhausted",
            message: format!("Run was already resumed {} time(s) (max_resume_attempts={max}); not resumed again.", run.resume_count),
            fields: json!({"resume_count": run.resume_count, "max_resume_attempts": max}),
        };
    }
    Decision::Resume
}

/// Applies the sweep: interrupts what cannot resume and returns the runs to resume,
/// oldest first. Nothing is started here.
pub async fn sweep(engine: &Arc<Engine>) -> Result<Vec<RunRecord>, Error> {
    let runs = engine.store.runs_with_status("running")?;
    let pipelines = engine.pipelines();
    let now = engine.now_ms();
    let mut resume = Vec::new();
    let mut writes = Vec::new();
    let mut interrupted = Vec::new();
    for run in runs {
        match decide(&run, &pipelines, &engine.config, now) {
            Decision::Resume => resume.push(run),
            Decision::Interrupt {
                event: name,
                reason,
                message,
                fields,
            } => {
                tracing::warn!(run_id = %run.id, pipeline = %run.pipeline_name, reason, "Run not resumed: {message}");
                crate::telemetry::run_interrupted(&run.pipeline_name, reason);
                writes.push(event(&run.id, now, "warn", name, message.clone(), fields));
                if name != "run_interrupted" {
                    writes.push(event(
                        &run.id,
                        now,
                        "warn",
                        "run_interrupted",
                        "Service restarted while this run was in progress.",
                        json!({"reason": reason}),
                    ));
                }
                writes.push(Write::FinishRun {
                    run_id: run.id.clone(),
                    status: "interrupted".into(),
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
        crate::telegram::announce_closed(engine, id);
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
