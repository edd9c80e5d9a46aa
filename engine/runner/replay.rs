//! Replaying a run from a step (SPEC 12): `run::replay` decides whether the
//! replay may happen and what it copies; this records the new run with the copied
//! rows in one commit (`create`). Driving it is the caller's (an admission's
//! `spawn`, like any new run): the drive plans it from the copied rows as a resume
//! would, so those steps never run again and their outputs rebuild the context,
//! but nothing counts it as resumed.

use super::create::ReplayOf;
use super::{Created, Engine};
use crate::domain::RunId;
use crate::events::Event;
use crate::run::context::Normalised;
use crate::run::replay::{self, Refusal};
use crate::store::Write;

/// Why [`Engine::replay`] started no run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayRefusal {
    #[error("run `{0}` does not exist")]
    UnknownRun(String),
    /// The replay is not allowed; the message says why and what to do instead.
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("stored run `{run_id}` is unreadable: {detail}")]
    CorruptRun { run_id: String, detail: String },
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

impl Engine {
    /// Records a new run of `old_run_id`'s pipeline and trigger that starts at
    /// `from_step` (a top-level entry), with the old run's records of the entries
    /// before it copied as they were (`step_reused` for each) and `replay_of` set;
    /// `by` is who asked, recorded in `run_started`. The run, the copied rows, their
    /// events and the first log line are one commit, with the run's lease on a
    /// shared store. Not driven yet: hand the id to an admission's `spawn`.
    pub async fn replay(
        &self,
        old_run_id: &str,
        from_step: &str,
        by: Option<&str>,
    ) -> Result<RunId, ReplayRefusal> {
        // The old run's whole record, journals included: off the async threads.
        let store = self.store.clone();
        let id = old_run_id.to_string();
        let (old, records, journals) = tokio::task::spawn_blocking(move || {
            let Some(old) = store.run(&id)? else {
                return Ok(None);
            };
            let records = store.steps(&id)?;
            let journals = store.journals_of_run(&id)?;
            Ok::<_, crate::store::Error>(Some((old, records, journals)))
        })
        .await
        .map_err(|_| crate::store::Error::WriterGone)??
        .ok_or_else(|| ReplayRefusal::UnknownRun(old_run_id.to_string()))?;
        let pipeline = self.pipeline(&old.pipeline_name);
        let copy = replay::decide(pipeline.as_deref(), &old, &records, from_step)?;
        let Some(pipeline) = pipeline else {
            // `decide` has refused this already.
            return Err(Refusal::PipelineMissing {
                run_id: old.id.clone(),
                pipeline: old.pipeline_name.clone(),
            }
            .into());
        };
        let trigger: Normalised =
            serde_json::from_str(&old.context_json).map_err(|e| ReplayRefusal::CorruptRun {
                run_id: old.id.clone(),
                detail: format!("context_json: {e}"),
            })?;

        let new_id = uuid::Uuid::now_v7().to_string();
        let now = self.now_ms();
        let rows: Vec<_> = copy
            .records
            .iter()
            .map(|r| replay::rebase_step(r, &new_id))
            .collect();
        let mut writes: Vec<Write> = rows.iter().cloned().map(Write::UpsertStep).collect();
        for j in journals.iter().filter(|j| copy.covers(&j.step_path)) {
            let j = replay::rebase_journal(j, &new_id);
            writes.extend(j.turns.into_iter().map(Write::UpsertTurn));
            writes.extend(j.calls.into_iter().map(Write::UpsertToolCall));
            writes.extend(j.delegations.into_iter().map(Write::UpsertDelegation));
        }
        for step in &copy.reused {
            writes.push(
                Event::StepReused {
                    step: step.clone(),
                    from_run: old.id.clone(),
                }
                .write(
                    &new_id,
                    now,
                    format!("Step {step} reused from run {}", old.id),
                ),
            );
        }
        let replay_of = ReplayOf {
            old_run_id: old.id.clone(),
            by: by.map(str::to_string),
            stage: old.stage.clone(),
            usage: copy.usage,
            records: rows,
            writes,
        };
        let mut new = self.new_run(
            new_id,
            &pipeline,
            &trigger,
            old.payload_json.clone(),
            None,
            None,
            Some(replay_of),
        );
        let writes = std::mem::take(&mut new.writes);
        let outcomes = self.store.commit(writes).await?;
        match self.recorded(new, outcomes.into_iter().next()) {
            Created::Inserted(id) => {
                tracing::info!(run_id = %id, replay_of = %old.id, from_step, by = by.unwrap_or(""), reused = copy.reused.len(), "Replay started.");
                Ok(id)
            }
            // Never deduplicated (no fingerprint), so not reached.
            Created::Duplicate { run_id, .. } => Ok(run_id),
        }
    }
}
