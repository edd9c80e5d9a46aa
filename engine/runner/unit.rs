//! The runner's shared types, a leaf that every unit driver imports and that imports
//! none of them: a run being driven ([`RunState`]), how a unit ended
//! ([`UnitOutcome`], [`UnitResult`]), how it starts ([`Start`]), and what one
//! executor call needs and how it can fail ([`CallSpec`], [`CallFailure`],
//! [`HumanMode`]). Keeping them here is what lets `drive`, `step`, `group`,
//! `ending` and `outbox` depend on each other only through functions.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{Created, Error, ParentLink, RunEnd, Services};
use crate::domain::{StepKind, StepStatus};
use crate::events::Event;
use crate::executor::BoxFuture;
use crate::pipeline::{Action, Entry, Pipeline};
use crate::run::context::{self, ContextInput, ItemVars, LoopVars, Normalised, Outputs};
use crate::run::{StepOutput, Usage};
use crate::store::{RunRecord, StepRecord, Write};

/// The finished state of one unit, not yet committed.
pub(super) struct UnitResult {
    pub status: StepStatus,
    pub output: StepOutput,
    /// Usage spent by this process on the unit (kept branches are already counted).
    pub usage: Usage,
    pub record: StepRecord,
    pub events: Vec<Write>,
    pub error: Option<String>,
    /// Extra template keys to register (branch outputs), besides the unit's name.
    pub register: Vec<(String, Value)>,
}

pub(super) enum UnitOutcome {
    Done(Box<UnitResult>),
    /// Shutdown arrived while the unit was in flight; it stays `running`.
    Drained,
    /// The unit waits for a human decision with the run parked (see `park`).
    /// Everything it needs is committed; the driver must write nothing more.
    Parked,
}

/// How a unit starts.
pub(super) enum Start {
    Fresh,
    Rerun { attempt: u32 },
    Rearm,
}

pub(super) struct RunState {
    /// What the run's units use (never the engine itself).
    pub services: Arc<Services>,
    /// How a sub-pipeline step starts and awaits its child run.
    pub children: Arc<dyn ChildRuns>,
    pub run: RunRecord,
    pub pipeline: Arc<Pipeline>,
    pub trigger: Arc<Normalised>,
    pub outputs: Outputs,
    pub usage: Usage,
    pub final_output: Option<Value>,
    /// Writes of finished units not yet committed (see [`RunState::defer`]).
    pub deferred: Vec<Write>,
    /// Driven again after a parked wait: the start time of each `waiting` step,
    /// which carries on silently from it. Empty otherwise.
    pub unparked: std::collections::HashMap<String, i64>,
    /// Held by a run resumed in a start-up wave until it settles (see
    /// `sweep::resume_all`): dropped before its first executor call other than a
    /// human step that parks, or when the driver ends or parks.
    pub wave: Option<super::sweep::WaveTicket>,
    /// A new run's first step, already recorded as started with the run itself
    /// (see `Engine::create_run`); taken by `step::run`.
    pub opened: Option<StepRecord>,
    /// The records of units left in flight or waiting, from the resume plan, by
    /// step path: a unit taking one over keeps its identity without a read.
    pub interrupted: std::collections::HashMap<String, StepRecord>,
}

impl RunState {
    pub fn id(&self) -> &str {
        &self.run.id
    }

    /// The facts a call of this run's unit `record` carries (see [`UnitFacts`]).
    pub fn facts<'a>(&'a self, record: &'a StepRecord) -> UnitFacts<'a> {
        UnitFacts {
            record,
            team: self.run.team.as_deref(),
            stage: &self.run.stage,
            trigger: &self.trigger,
            spent: self.usage,
            budget: self.pipeline.budget.as_ref(),
        }
    }

    pub fn now(&self) -> i64 {
        self.services.now_ms()
    }

    /// A run-log event of this run, stamped now.
    pub fn ev(&self, event: Event, msg: impl Into<String>) -> Write {
        event.write(&self.run.id, self.now(), msg)
    }

    /// Commits `writes` together with any deferred ones, waiting out a store that
    /// cannot write for a while (see `persist`).
    pub async fn commit(&mut self, writes: Vec<Write>) -> Result<(), Error> {
        let mut all = std::mem::take(&mut self.deferred);
        all.extend(writes);
        if !all.is_empty() {
            super::persist::commit(&self.services, &self.run.id, all).await?;
        }
        Ok(())
    }

    /// Holds a finished unit's writes until the next commit. The next commit always
    /// happens before any executor is called (the next unit's `running` record, or the
    /// run's end), so the result is durable before anything that depends on it starts,
    /// and a step costs one fsync instead of two.
    pub fn defer(&mut self, writes: Vec<Write>) {
        self.deferred.extend(writes);
    }

    pub async fn flush(&mut self) -> Result<(), Error> {
        self.commit(Vec::new()).await
    }

    pub fn context(
        &self,
        current: &str,
        loop_vars: Option<&LoopVars>,
        item: Option<ItemVars<'_>>,
        extra: Option<&Map<String, Value>>,
    ) -> Map<String, Value> {
        context::build(&ContextInput {
            pipeline: &self.pipeline,
            run_id: &self.run.id,
            trigger: &self.trigger,
            outputs: &self.outputs,
            current_step: current,
            loop_vars,
            item,
            extra,
        })
    }
}

/// Why an executor call produced no outcome.
pub(super) enum CallFailure {
    /// The attempt failed; another attempt may succeed.
    Error(String),
    /// The step cannot work as configured (its config does not fit its executor,
    /// a template does not render, an agent or provider is missing): another
    /// attempt would fail the same way, so it is not retried.
    Config(String),
    /// The step must not go on and a human must look: it escalates with this
    /// reason (an agent's write call in flight at a crash under
    /// `durable.on_interrupted: escalate`).
    Escalate(String),
    /// Shutdown: the call was not made or its result must not be recorded.
    Drained,
    /// A human step parked its run (see `park`); its state is committed.
    Parked,
}

impl From<crate::executor::Error> for CallFailure {
    /// The retry decision follows the executor's own word on its error.
    fn from(e: crate::executor::Error) -> Self {
        if e.is_retriable() {
            CallFailure::Error(e.to_string())
        } else {
            CallFailure::Config(e.to_string())
        }
    }
}

/// How a human step may wait (other executors ignore it).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct HumanMode {
    /// The run may be parked instead of waiting in its task.
    pub may_park: bool,
    /// The run was just unparked: the approval is re-armed silently.
    pub unparked: bool,
}

/// Everything needed to call an executor once, owned so branches can run in tasks.
pub(super) struct CallSpec<'a> {
    pub services: &'a Arc<Services>,
    pub children: &'a Arc<dyn ChildRuns>,
    pub pipeline: &'a crate::pipeline::Pipeline,
    pub run_id: &'a str,
    pub path: &'a str,
    pub key: &'a str,
    pub attempt: u32,
    pub action: &'a Action,
    /// Owned, and dropped once the templates are rendered: a step parked on a
    /// long wait (a human approval) must not keep its whole context alive.
    pub ctx: minijinja::Value,
    pub human: HumanMode,
    pub facts: UnitFacts<'a>,
}

/// What the runner's own executors (`human`, `pipeline`) need to know of the unit
/// and its run, handed down so that they never read the run back from the store.
#[derive(Clone, Copy)]
pub(super) struct UnitFacts<'a> {
    /// The unit's `running` record as committed (a human step turns it `waiting`).
    pub record: &'a StepRecord,
    pub team: Option<&'a str>,
    pub stage: &'a str,
    /// The run's trigger (a sub-pipeline's child starts from it).
    pub trigger: &'a Normalised,
    /// What the run spent before this unit, and its budget (an agent's loop
    /// checks it before each turn).
    pub spent: Usage,
    pub budget: Option<&'a crate::pipeline::Budget>,
}

/// The kind recorded for an entry's step record.
pub(super) fn kind_of(entry: &Entry) -> StepKind {
    match entry {
        Entry::Step(_) => StepKind::Step,
        Entry::Parallel(_) => StepKind::Parallel,
        Entry::FanOut(_) => StepKind::FanOut,
    }
}

/// What a sub-pipeline step needs of the engine and cannot get from its services:
/// the child's pipeline, recording the child run, driving it and cancelling it.
/// The engine implements it (in `runner/mod.rs`); a unit holds it beside its
/// [`Services`], so no unit names the engine. Used by `subpipeline`.
pub(crate) trait ChildRuns: Send + Sync {
    fn pipeline(&self, name: &str) -> Option<Arc<Pipeline>>;

    /// Records the child run (see `Engine::create_run`).
    fn create<'a>(
        &'a self,
        pipeline: &'a Pipeline,
        trigger: &'a Normalised,
        parent: ParentLink,
    ) -> BoxFuture<'a, Result<Created, Error>>;

    /// Drives a child just created, in its own task.
    fn drive(self: Arc<Self>, run_id: String) -> tokio::task::JoinHandle<Result<RunEnd, Error>>;

    /// Asks a child run to stop at its next step boundary.
    fn cancel(self: Arc<Self>, run_id: &str);
}
