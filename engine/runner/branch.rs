//! One branch of a parallel group or fan-out, run as its own task: recorded
//! `running` before its executor is called and recorded finished the moment it
//! ends, independently of its siblings.

use std::sync::Arc;

use serde_json::Value;

use super::call::call_once;
use super::records::{self, NewRecord};
use super::unit::{CallFailure, CallSpec, HumanMode, UnitFacts};
use super::{Error, Services};
use crate::domain::{StepKind, StepStatus};
use crate::events::Event;
use crate::pipeline::{Action, Pipeline};
use crate::run::{StepOutput, Usage};
use crate::store::Write;

/// One branch to execute, owning what it needs so it can run as its own task.
pub(super) struct BranchJob {
    pub(super) services: Arc<Services>,
    pub(super) children: Arc<dyn super::unit::ChildRuns>,
    pub(super) team: Option<String>,
    pub(super) stage: String,
    pub(super) trigger: Arc<crate::run::context::Normalised>,
    /// What the run had spent when the group started.
    pub(super) spent: Usage,
    pub(super) pipeline: Arc<Pipeline>,
    pub(super) run_id: String,
    pub(super) group: String,
    pub(super) path: String,
    pub(super) index: u32,
    pub(super) kind: StepKind,
    pub(super) action: Action,
    pub(super) ctx: minijinja::Value,
    pub(super) attempt: u32,
}

pub(super) struct BranchDone {
    pub(super) pos: usize,
    pub(super) output: Value,
    pub(super) confidence: f64,
    pub(super) failed: bool,
    pub(super) usage: Usage,
}

pub(super) enum BranchEnd {
    Done(BranchDone),
    Drained,
}

impl BranchJob {
    pub(super) async fn run(self, pos: usize) -> Result<BranchEnd, Error> {
        let now = self.services.now_ms();
        let mut rec = records::running(NewRecord {
            run_id: &self.run_id,
            path: &self.path,
            index: self.index,
            kind: self.kind,
            action: Some(&self.action),
            started_at: now,
            attempt: self.attempt,
            iteration: 1,
        });
        super::persist::commit(
            &self.services,
            &self.run_id,
            vec![Write::UpsertStep(rec.clone())],
        )
        .await?;
        let key = records::idempotency_key(&self.run_id, &self.path, 1);
        let result = call_once(CallSpec {
            services: &self.services,
            children: &self.children,
            pipeline: &self.pipeline,
            run_id: &self.run_id,
            path: &self.path,
            key: &key,
            attempt: self.attempt,
            action: &self.action,
            ctx: self.ctx,
            // A branch's human step waits in the group's task: parking is for the
            // run as a whole, and the other branches may still be running.
            human: HumanMode::default(),
            facts: UnitFacts {
                record: &rec,
                team: self.team.as_deref(),
                stage: &self.stage,
                trigger: &self.trigger,
                spent: self.spent,
                budget: self.pipeline.budget.as_ref(),
            },
        })
        .await;
        let now = self.services.now_ms();
        let (status, output, usage, error) = match result {
            Ok(o) => (StepStatus::Completed, o.output, o.usage, None),
            // Parked cannot happen (parking is off above); leave it for a restart.
            Err(CallFailure::Drained | CallFailure::Parked) => return Ok(BranchEnd::Drained),
            // A branch runs once: a configuration error fails it like any other.
            Err(
                CallFailure::Error(msg) | CallFailure::Config(msg) | CallFailure::Escalate(msg),
            ) => {
                let mut out = StepOutput::failed(&msg);
                out.extra
                    .insert(StepStatus::Failed.to_string(), Value::Bool(true));
                (StepStatus::Failed, out, Usage::default(), Some(msg))
            }
        };
        records::finish(&mut rec, status, &output, &usage, error.clone(), now);
        let (branch, group, confidence) =
            (self.path.clone(), self.group.clone(), output.confidence);
        let event = if error.is_none() {
            Event::BranchCompleted {
                branch,
                group,
                confidence,
                error: None,
            }
        } else {
            Event::BranchFailed {
                branch,
                group,
                confidence,
                error: error.clone(),
            }
        };
        let ev = event.write(&self.run_id, now, format!("Branch {} {status}", self.path));
        super::persist::commit(
            &self.services,
            &self.run_id,
            vec![Write::UpsertStep(rec), ev],
        )
        .await?;
        Ok(BranchEnd::Done(BranchDone {
            pos,
            confidence: if error.is_some() {
                0.0
            } else {
                output.confidence
            },
            output: output.to_json(),
            failed: error.is_some(),
            usage,
        }))
    }
}
