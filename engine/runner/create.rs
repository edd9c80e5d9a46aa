//! Recording a new run: one commit holds the run, its first log line, its owner,
//! its first step's `running` record and (on a shared store) its lease, so no
//! process ever sees half of a new run. A cron tick's run also carries the
//! schedule's advance past the tick, first in the same commit; a replay's run
//! (`replay`) carries the rows it copies from the run it replays.

use super::{leases, step, Created, Engine, Error, FreshRun, ParentLink};
use crate::domain::RunStatus;
use crate::events::Event;
use crate::pipeline::Pipeline;
use crate::run::context::Normalised;
use crate::run::Usage;
use crate::store::{Outcome, RunRecord, StepRecord, Write};

/// What makes a new run a replay of another (see `replay`): the old run, who
/// asked, what the new run keeps of the old one, and the rows it starts with.
pub(super) struct ReplayOf {
    pub old_run_id: String,
    pub by: Option<String>,
    /// The old run's stage (the pipeline's may have changed since; it is not in
    /// the fingerprint).
    pub stage: String,
    /// The usage of the copied steps, which the new run's totals start from.
    pub usage: Usage,
    /// The copied step rows, already the new run's: the drive plans from them.
    pub records: Vec<StepRecord>,
    /// Everything else the copy commits after `run_started`: those rows, the
    /// journal rows of copied agent steps and the `step_reused` events.
    pub writes: Vec<Write>,
}

/// A new run's batch before it is committed, and what is kept of it after.
pub(super) struct NewRun {
    pub id: String,
    pipeline: String,
    pub writes: Vec<Write>,
    fresh: FreshRun,
}

impl Engine {
    /// Records a new run (status `running`, `run_started`) without starting it.
    pub async fn create_run(
        &self,
        pipeline: &Pipeline,
        trigger: &Normalised,
        payload: &serde_json::Value,
        parent: Option<ParentLink>,
        dedup_window_seconds: Option<u64>,
    ) -> Result<Created, Error> {
        self.create_run_from(
            pipeline,
            trigger,
            payload.to_string(),
            parent,
            dedup_window_seconds,
        )
        .await
    }

    /// [`Engine::create_run`] with the payload already serialised: a webhook's body
    /// is stored as it arrived instead of being parsed and printed again.
    pub async fn create_run_from(
        &self,
        pipeline: &Pipeline,
        trigger: &Normalised,
        payload_json: String,
        parent: Option<ParentLink>,
        dedup_window_seconds: Option<u64>,
    ) -> Result<Created, Error> {
        // Time-ordered (v7): consecutive runs land next to each other in every index
        // keyed by run id (runs, steps, events), so a commit of many new runs dirties
        // a few B-tree pages instead of one random page per run. Run ids are not
        // secrets; approval tokens, which are, come from a CSPRNG.
        let id = uuid::Uuid::now_v7().to_string();
        let mut new = self.new_run(
            id,
            pipeline,
            trigger,
            payload_json,
            parent,
            dedup_window_seconds,
            None,
        );
        let writes = std::mem::take(&mut new.writes);
        let outcomes = self.store.commit(writes).await?;
        Ok(self.recorded(new, outcomes.into_iter().next()))
    }

    /// Records the run of cron tick `due` of `pipeline` in the same commit as the
    /// schedule's advance past it (`advance`, an `AdvanceSchedule`): the run exists
    /// exactly when this replica's advance won, so a tick fires once across
    /// replicas and a crash between the two cannot lose it. Its id is derived from
    /// (pipeline, tick) ([`super::schedule::tick_run_id`]), so no second run of
    /// the tick can be inserted. `None`: another replica fired the tick.
    pub async fn create_tick_run(
        &self,
        pipeline: &Pipeline,
        trigger: &Normalised,
        due: i64,
        advance: Write,
    ) -> Result<Option<String>, Error> {
        let id = super::schedule::tick_run_id(&pipeline.name, due);
        let mut new = self.new_run(id, pipeline, trigger, "{}".into(), None, None, None);
        let mut writes = Vec::with_capacity(new.writes.len() + 1);
        writes.push(advance);
        writes.append(&mut new.writes);
        let mut outcomes = self.store.commit(writes).await?.into_iter();
        if outcomes.next() != Some(Outcome::ScheduleAdvanced) {
            return Ok(None);
        }
        Ok(match self.recorded(new, outcomes.next()) {
            Created::Inserted(id) => Some(id),
            Created::Duplicate { .. } => None,
        })
    }

    /// The batch that records run `id` (a replay of another with `replay`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_run(
        &self,
        id: String,
        pipeline: &Pipeline,
        trigger: &Normalised,
        payload_json: String,
        parent: Option<ParentLink>,
        dedup_window_seconds: Option<u64>,
        mut replay: Option<ReplayOf>,
    ) -> NewRun {
        let now = self.now_ms();
        // A replay is triggered now: its age (`max_resume_age_seconds`) counts
        // from the replay, though its trigger is the old run's.
        let triggered_at = match &replay {
            Some(_) => now,
            None => chrono::DateTime::parse_from_rfc3339(&trigger.received_at)
                .map(|t| t.timestamp_millis())
                .unwrap_or(now),
        };
        let mut trigger = trigger.clone();
        if trigger.received_at.is_empty() {
            trigger.received_at = crate::clock::rfc3339(now);
        }
        let mut record = RunRecord {
            id: id.clone(),
            pipeline_name: pipeline.name.clone(),
            status: RunStatus::Running,
            source: trigger.source.clone(),
            team: trigger.team.clone(),
            stage: pipeline.stage.as_str().into(),
            triggered_at,
            completed_at: None,
            resumed_at: None,
            resume_count: 0,
            config_fingerprint: pipeline.fingerprint.clone(),
            parent_run_id: parent.as_ref().map(|p| p.run_id.clone()),
            parent_step_path: parent.as_ref().map(|p| p.step_path.clone()),
            dedup_fingerprint: trigger.fingerprint.clone().filter(|f| !f.is_empty()),
            context_json: serde_json::to_string(&trigger).unwrap_or_else(|_| "{}".into()),
            payload_json,
            tokens_used: 0,
            cost_usd: 0.0,
            terminal_step: None,
            reason: None,
            final_output_json: None,
            replay_of: None,
        };
        if let Some(r) = &replay {
            // Never deduplicated: a replay is asked for by name, and must not
            // fold future alerts into itself either.
            record.dedup_fingerprint = None;
            record.replay_of = Some(r.old_run_id.clone());
            record.stage = r.stage.clone();
            record.tokens_used = r.usage.tokens();
            record.cost_usd = r.usage.cost_usd.unwrap_or(0.0);
        }
        let msg = match &replay {
            Some(r) => format!(
                "Run started for pipeline {}: a replay of run {}{}",
                pipeline.name,
                r.old_run_id,
                r.by.as_deref()
                    .map(|b| format!(", asked by {b}"))
                    .unwrap_or_default()
            ),
            None => format!("Run started for pipeline {}", pipeline.name),
        };
        let started = Event::RunStarted {
            pipeline: pipeline.name.clone(),
            source: trigger.source.clone(),
            config_fingerprint: pipeline.fingerprint.clone(),
            parent_run_id: record.parent_run_id.clone(),
            replay_of: record.replay_of.clone(),
            by: replay.as_ref().and_then(|r| r.by.clone()),
        }
        .write(&id, now, msg);
        let fresh_run = RunRecord {
            context_json: String::new(),
            payload_json: String::new(),
            ..record.clone()
        };
        let insert = match dedup_window_seconds {
            Some(w) => Write::InsertRunDedup {
                run: record,
                window_start: now - (w as i64) * 1000,
            },
            None => Write::InsertRun(record),
        };
        // The first log line commits with the run, and only if the run was inserted.
        let started = match started {
            Write::AppendEvent(e) => Write::AppendEventIfInserted(e),
            other => other,
        };
        let mut writes = vec![insert, started];
        // The copied rows, after the first log line, in the run's own commit.
        let copied = match replay.as_mut() {
            Some(r) => {
                writes.append(&mut r.writes);
                Some(std::mem::take(&mut r.records))
            }
            None => None,
        };
        // In the run's own commit, so `serve` never sees it running without its owner.
        // A deduplicated insert leaves no row for this fresh id, so the update is moot.
        if let Some(owner) = self.owner.get() {
            writes.push(Write::SetRunOwner {
                run_id: id.clone(),
                owner: Some(owner.clone()),
            });
        }
        // A first step that will certainly run is recorded as started in the same
        // commit: one writer round trip less per run, which is most of what a short
        // run costs. Only if the insert wins dedup, like `run_started`.
        let opened = match pipeline.steps.first() {
            // A replay starts where its copy ends, which the drive plans.
            _ if copied.is_some() => None,
            Some(crate::pipeline::Entry::Step(s)) if s.when.is_none() => {
                let (rec, ev) = step::opening(&id, 0, s, now, 1, false);
                writes.push(Write::UpsertStepIfInserted(rec.clone()));
                if let Write::AppendEvent(e) = ev {
                    writes.push(Write::AppendEventIfInserted(e));
                }
                Some(rec)
            }
            _ => None,
        };
        // On a shared store the run is this replica's from its first commit.
        if let Some(book) = self.leases() {
            writes.push(Write::LeaseNewRun {
                run_id: id.clone(),
                replica: book.replica().to_string(),
                lease_ms: book.lease_ms(),
            });
        }
        NewRun {
            id,
            pipeline: pipeline.name.clone(),
            writes,
            fresh: FreshRun {
                run: fresh_run,
                trigger,
                opened,
                copied: copied.unwrap_or_default(),
            },
        }
    }

    /// What committing `new` came to, given its insert's outcome; an inserted run
    /// is leased here and handed to its driver.
    pub(super) fn recorded(&self, new: NewRun, insert: Option<Outcome>) -> Created {
        match insert {
            Some(Outcome::DuplicateRunning { existing_run_id }) => Created::Duplicate {
                reason: format!("Duplicate of run {existing_run_id} (status=running)"),
                run_id: existing_run_id,
            },
            Some(Outcome::DuplicateRecent {
                existing_run_id,
                status,
            }) => Created::Duplicate {
                reason: format!(
                    "Duplicate of run {existing_run_id} (status={status}) inside the dedup window"
                ),
                run_id: existing_run_id,
            },
            _ => {
                let NewRun {
                    id,
                    pipeline,
                    fresh,
                    ..
                } = new;
                if let Some(book) = self.leases() {
                    book.hold(
                        &id,
                        leases::Held {
                            epoch: 1,
                            adopted: None,
                        },
                    );
                }
                crate::telemetry::run_started(&pipeline);
                tracing::info!(run_id = %id, pipeline = %pipeline, source = %fresh.trigger.source, "Run started.");
                if let Ok(mut map) = self.fresh.lock() {
                    map.insert(id.clone(), Box::new(fresh));
                }
                Created::Inserted(id)
            }
        }
    }
}
