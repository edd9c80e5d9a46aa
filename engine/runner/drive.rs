//! The run loop: walk the pipeline's entries under the resume plan, run what has
//! not run, and settle each unit's result into the store.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::ending::{announce_resume, close_terminal, finish};
use super::records;
use super::unit::{RunState, Start, UnitOutcome, UnitResult};
use super::{outbox, DriveMode, Engine, Error, RunEnd};
use crate::domain::{RunStatus, StepStatus};
use crate::events::Event;
use crate::pipeline::Entry;
use crate::run::context::{self, Normalised, Outputs};
use crate::run::flow;
use crate::run::plan::{self, InFlight, UnitPlan};
use crate::run::settle::{self, Boundary, Settle};
use crate::run::{StepOutput, Usage};
use crate::store::Write;

/// Drives `run_id` from its records to its end, a drain or a park: opens it, then
/// for each entry checks the boundary, performs the unit's plan and settles it.
pub(super) async fn drive(
    engine: Arc<Engine>,
    run_id: String,
    mode: DriveMode,
    wave: Option<super::sweep::WaveTicket>,
) -> Result<RunEnd, Error> {
    let (mut rs, plan) = match open(&engine, &run_id, mode, wave).await? {
        Opened::Ready(rs, plan) => (*rs, plan),
        Opened::Ended(end) => return Ok(end),
    };
    if mode == DriveMode::Resume {
        announce_resume(&mut rs, &plan).await?;
    }
    let pipeline = rs.pipeline.clone();
    for (i, entry) in pipeline.steps.iter().enumerate() {
        if let Some(end) = at_boundary(&mut rs, i, entry).await? {
            return Ok(end);
        }
        let unit_plan = plan.units.get(i).cloned().unwrap_or(UnitPlan::NotStarted);
        let outcome = match perform(&mut rs, i, entry, unit_plan).await? {
            Performed::Next => continue,
            Performed::End(end) => return Ok(end),
            Performed::Unit(outcome) => outcome,
        };
        if let Some(end) = after_unit(&mut rs, entry, outcome).await? {
            return Ok(end);
        }
    }
    finish(&mut rs, RunStatus::Completed, None, None, Vec::new()).await
}

/// A run opened for driving, or how it already ended.
enum Opened {
    Ready(Box<RunState>, plan::ResumePlan),
    Ended(RunEnd),
}

/// Reads (or, for a run this process just created, takes) the run and plans it.
async fn open(
    engine: &Arc<Engine>,
    run_id: &str,
    mode: DriveMode,
    wave: Option<super::sweep::WaveTicket>,
) -> Result<Opened, Error> {
    let run_id = run_id.to_string();
    let resume = mode != DriveMode::New;
    // A run just created by this process starts from what was recorded; anything
    // else (a resume, or a run created by another process) is read back.
    let fresh = if resume {
        None
    } else {
        engine.take_fresh(&run_id)
    };
    let (mut run, trigger, opened, copied) = match fresh {
        Some(f) => (f.run, f.trigger, f.opened, f.copied),
        None => {
            let run = super::persist::read(engine, &run_id, || engine.store.run(&run_id))
                .await?
                .ok_or_else(|| Error::UnknownRun(run_id.clone()))?;
            if run.status != RunStatus::Running {
                return Ok(Opened::Ended(RunEnd::Finished(run.status)));
            }
            let trigger: Normalised =
                serde_json::from_str(&run.context_json).map_err(|e| Error::CorruptRun {
                    run_id: run_id.clone(),
                    detail: format!("context_json: {e}"),
                })?;
            (run, trigger, None, Vec::new())
        }
    };
    // The definition the run started with, also after a reload replaced it.
    let Some(pipeline) = engine.pipeline_for_run(&run.pipeline_name, &run.config_fingerprint)
    else {
        return Err(Error::UnknownPipeline(run.pipeline_name.clone()));
    };
    // A run driven for the first time has no step records yet, except the rows a
    // replay copied, which it is planned from as a resume would be (its kept units
    // never run, their outputs rebuild the context); it logs no `run_resumed`.
    let stored = if resume {
        super::persist::read(engine, &run_id, || engine.store.steps(&run_id)).await?
    } else {
        copied
    };
    let mut plan = plan::plan(&pipeline, &stored);
    // A parked run lives for as long as its wait: keep only what the loop needs.
    drop(stored);
    let interrupted: std::collections::HashMap<String, crate::store::StepRecord> =
        std::mem::take(&mut plan.interrupted)
            .into_iter()
            .map(|r| (r.step_path.clone(), r))
            .collect();
    let unparked = match mode {
        DriveMode::Unpark => interrupted
            .values()
            .filter(|r| r.status == StepStatus::Waiting)
            .map(|r| (r.step_path.clone(), r.started_at))
            .collect(),
        _ => Default::default(),
    };
    run.context_json = String::new();
    run.payload_json = String::new();
    let rs = RunState {
        services: engine.services().clone(),
        children: engine.clone(),
        usage: plan.usage,
        run,
        pipeline: pipeline.clone(),
        trigger: Arc::new(trigger),
        outputs: Outputs::default(),
        final_output: None,
        deferred: Vec::new(),
        unparked,
        wave,
        opened,
        interrupted,
    };
    Ok(Opened::Ready(Box::new(rs), plan))
}

/// A cancel or a drain before entry `i` ends the drive here (see `run::settle`).
async fn at_boundary(rs: &mut RunState, i: usize, entry: &Entry) -> Result<Option<RunEnd>, Error> {
    // A step recorded as started is in flight: a cancel or a drain takes effect
    // at the boundary after it, as for any other step already running.
    let in_flight = i == 0 && rs.opened.is_some();
    let boundary = settle::before_unit(
        rs.services.is_cancelled(rs.id()),
        rs.services.is_shutting_down(),
        in_flight,
    );
    if boundary == Boundary::Cancel {
        let w = vec![rs.ev(
            Event::RunCancelledAtBoundary {
                before_step: entry.name().to_string(),
                by: rs.services.cancelled_by(rs.id()),
            },
            "Run cancelled at a step boundary.",
        )];
        return finish(
            rs,
            RunStatus::Cancelled,
            None,
            Some(RunStatus::Cancelled.to_string()),
            w,
        )
        .await
        .map(Some);
    }
    if boundary == Boundary::Drain {
        rs.flush().await?;
        tracing::info!(run_id = %rs.id(), step = %entry.name(), "Shutdown: run left at a step boundary, resumes on next start.");
        return Ok(Some(RunEnd::Drained));
    }
    Ok(None)
}

/// What performing one entry's plan came to.
enum Performed {
    /// Kept or skipped: on to the next entry.
    Next,
    /// The entry closed the run (a terminal unit left unclosed by a crash).
    End(RunEnd),
    Unit(UnitOutcome),
}

async fn perform(
    rs: &mut RunState,
    i: usize,
    entry: &Entry,
    unit_plan: UnitPlan,
) -> Result<Performed, Error> {
    if !matches!(unit_plan, UnitPlan::Kept { .. }) && !super::step::parks(rs, entry) {
        // This unit may run for long: the resume wave need not wait for it.
        rs.wave = None;
    }
    let outcome = match unit_plan {
        UnitPlan::Kept {
            output, branches, ..
        } => {
            // As the group registered them when it ran: branches, then the group.
            for (key, v) in branches {
                rs.outputs.insert(&key, v);
            }
            if let Some(o) = output {
                register(rs, entry, &o);
            }
            return Ok(Performed::Next);
        }
        UnitPlan::Terminal {
            status,
            output,
            reason,
        } => {
            return close_terminal(rs, entry, status, output, reason)
                .await
                .map(Performed::End);
        }
        UnitPlan::NotStarted => {
            // An opened step has no `when` (create_run checks), so it passes.
            match when_passes(rs, entry) {
                Ok(true) => {}
                Ok(false) => {
                    skip(rs, i, entry, None).await?;
                    return Ok(Performed::Next);
                }
                Err(e) => {
                    skip(rs, i, entry, Some(e)).await?;
                    return Ok(Performed::Next);
                }
            }
            run_unit(rs, i, entry, Start::Fresh, None).await?
        }
        UnitPlan::InFlight(InFlight::Rerun { attempt }) => {
            run_unit(rs, i, entry, Start::Rerun { attempt }, None).await?
        }
        // A tool-using agent step resumes from its journal, which decides per call
        // (a read call runs again, a write call in flight escalates the step).
        UnitPlan::InFlight(InFlight::Escalate) if journaled(rs, entry) => {
            let attempt = rs
                .interrupted
                .get(entry.name())
                .map_or(1, |r| r.attempts.max(1) + 1);
            run_unit(rs, i, entry, Start::Rerun { attempt }, None).await?
        }
        UnitPlan::InFlight(InFlight::Escalate) => {
            UnitOutcome::Done(Box::new(super::step::escalate_in_flight(rs, i, entry)))
        }
        UnitPlan::Waiting => run_unit(rs, i, entry, Start::Rearm, None).await?,
        UnitPlan::Group { branches, items } => {
            run_unit(rs, i, entry, Start::Fresh, Some((branches, items))).await?
        }
    };
    Ok(Performed::Unit(outcome))
}

/// Settles a unit's outcome: drained, parked, cancelled during it, or committed as
/// `run::settle` decides. `Some` when the drive ends here.
async fn after_unit(
    rs: &mut RunState,
    entry: &Entry,
    outcome: UnitOutcome,
) -> Result<Option<RunEnd>, Error> {
    let result = match outcome {
        UnitOutcome::Done(r) => r,
        UnitOutcome::Drained => {
            rs.flush().await?;
            return Ok(Some(RunEnd::Drained));
        }
        // Another driver may already own the run: nothing more is written here.
        UnitOutcome::Parked => return Ok(Some(RunEnd::Parked)),
    };
    if settle::after_unit(rs.services.is_cancelled(rs.id())) == Boundary::Cancel {
        // The unit's record is kept as it ended; nothing after it runs.
        let mut w = vec![Write::UpsertStep(result.record)];
        w.extend(result.events);
        w.push(rs.ev(
            Event::RunCancelledDuringStep {
                step: entry.name().to_string(),
                by: rs.services.cancelled_by(rs.id()),
            },
            format!("Run cancelled during {}", entry.name()),
        ));
        return finish(
            rs,
            RunStatus::Cancelled,
            Some(entry.name()),
            Some(RunStatus::Cancelled.to_string()),
            w,
        )
        .await
        .map(Some);
    }
    // Boxed: inline, `settle` (escalations, notifications) would size every
    // run's driver, including the thousands parked on human approvals.
    Box::pin(settle(rs, entry, *result)).await
}

/// Whether `entry` is a plain agent step that runs the journaled tool loop.
fn journaled(rs: &RunState, entry: &Entry) -> bool {
    matches!(entry, Entry::Step(s) if super::agent::runs_loop_for(&rs.services.config, &s.action))
}

type GroupPlan = (Vec<plan::BranchPlan>, Option<Vec<Value>>);

async fn run_unit(
    rs: &mut RunState,
    i: usize,
    entry: &Entry,
    start: Start,
    group: Option<GroupPlan>,
) -> Result<UnitOutcome, Error> {
    match entry {
        Entry::Step(s) => super::step::run(rs, i, s, start).await,
        Entry::Parallel(p) => super::group::parallel(rs, i, p, group.map(|g| g.0)).await,
        Entry::FanOut(f) => super::group::fan_out(rs, i, f, group).await,
    }
}

fn register(rs: &mut RunState, entry: &Entry, output: &Value) {
    rs.outputs.insert(entry.name(), output.clone());
    rs.final_output = Some(output.clone());
}

/// `Ok(true)` to run the unit; `Err(message)` when `when` could not be evaluated
/// (the unit is skipped and the run log says why).
fn when_passes(rs: &RunState, entry: &Entry) -> Result<bool, String> {
    let Some(expr) = entry.when() else {
        return Ok(true);
    };
    let ctx = context::to_template_value(rs.context(entry.name(), None, None, None));
    rs.pipeline.templates.eval(expr, &ctx).map_err(|e| {
        tracing::warn!(run_id = %rs.id(), step = %entry.name(), error = %e, "`when` failed to evaluate; the step is skipped.");
        e.to_string()
    })
}

async fn skip(
    rs: &mut RunState,
    i: usize,
    entry: &Entry,
    error: Option<String>,
) -> Result<(), Error> {
    let now = rs.now();
    let mut rec = records::running(records::NewRecord {
        run_id: rs.id(),
        path: entry.name(),
        index: records::step_index(i, None),
        kind: super::unit::kind_of(entry),
        action: None,
        started_at: now,
        attempt: 0,
        iteration: 0,
    });
    rec.status = StepStatus::Skipped;
    rec.finished_at = Some(now);
    rec.duration_ms = Some(0);
    let msg = match &error {
        None => format!("Step skipped: `when` is false for {}", entry.name()),
        Some(e) => format!(
            "Step skipped: `when` of {} could not be evaluated: {e}",
            entry.name()
        ),
    };
    rec.error = error.clone();
    let ev = rs.ev(
        Event::StepSkipped {
            step: entry.name().to_string(),
            when_error: error,
        },
        msg,
    );
    rs.defer(vec![Write::UpsertStep(rec), ev]);
    Ok(())
}

/// Commits a unit's result and what follows from it, as `run::settle` decides.
/// Returns the run's end when the unit ended the run.
async fn settle(rs: &mut RunState, entry: &Entry, r: UnitResult) -> Result<Option<RunEnd>, Error> {
    let name = entry.name().to_string();
    let output_json = r.output.to_json();
    for (k, v) in &r.register {
        rs.outputs.insert(k, v.clone());
    }
    rs.outputs.insert(&name, output_json.clone());
    crate::telemetry::step_finished(
        &rs.pipeline.name,
        &name,
        &r.record.executor,
        r.status.as_str(),
        r.record.duration_ms.unwrap_or(0) as f64 / 1000.0,
    );
    let mut writes = vec![Write::UpsertStep(r.record)];
    writes.extend(r.events);
    add_usage(rs, &r.usage, &mut writes);
    let step = match entry {
        Entry::Step(s) => Some(s),
        _ => None,
    };
    let decision = settle::settle(&settle::UnitEnd {
        status: r.status,
        error: r.error.as_deref(),
        summary: &r.output.summary,
        confidence: r.output.confidence,
        gate: entry.gate(),
        is_step: step.is_some(),
        continue_on_failure: step.is_some_and(|s| s.on_failure.continue_run),
        budget_exceeded: rs.pipeline.budget.as_ref().and_then(|b| {
            flow::budget_exceeded(b, rs.usage.tokens(), rs.usage.cost_usd.unwrap_or(0.0))
        }),
    });
    match decision {
        Settle::Continue => {
            rs.final_output = Some(output_json);
            rs.defer(writes);
            Ok(None)
        }
        Settle::Deliver => {
            deliver_failure(rs, step, &name, &r.output, r.error.clone(), writes).await?;
            Ok(None)
        }
        Settle::Finish(end) => {
            if end.keep_output {
                rs.final_output = Some(output_json);
            }
            let extra = notification_context(entry, &r.output, &end);
            if let Some(msg) = &end.budget {
                let (tokens_used, cost_usd) = (rs.usage.tokens(), rs.usage.cost_usd.unwrap_or(0.0));
                let ev = Event::BudgetExceeded {
                    step: name.clone(),
                    tokens_used,
                    cost_usd,
                };
                writes.push(rs.ev(ev, msg.clone()));
            }
            if let (true, Some(s)) = (end.failure_webhook, step) {
                let summary = &r.output.summary;
                writes.extend(outbox::failure_webhook(rs, s, summary, StepStatus::Failed));
            }
            writes.extend(outbox::record(rs, &end.notification, &name, &extra));
            finish(rs, end.status, Some(&name), Some(end.reason), writes)
                .await
                .map(Some)
        }
    }
}

/// A failed step with `on_failure: continue`: committed now, and its failure
/// webhook delivered now, not when the run ends.
async fn deliver_failure(
    rs: &mut RunState,
    step: Option<&crate::pipeline::Step>,
    name: &str,
    output: &StepOutput,
    error: Option<String>,
    mut writes: Vec<Write>,
) -> Result<(), Error> {
    writes.push(rs.ev(
        Event::StepFailedContinuing {
            step: name.to_string(),
            error,
        },
        format!("Step {name} failed; on_failure=continue"),
    ));
    if let Some(s) = step {
        let summary = &output.summary;
        writes.extend(outbox::failure_webhook(rs, s, summary, StepStatus::Failed));
    }
    rs.commit(writes).await?;
    let engine = rs.services.clone();
    let run_id = rs.id().to_string();
    tokio::spawn(async move { outbox::deliver_run(&engine, &run_id).await });
    Ok(())
}

/// The template context of the notification a unit that ends the run owes.
fn notification_context(
    entry: &Entry,
    output: &StepOutput,
    end: &settle::Ending,
) -> Map<String, Value> {
    let mut extra = Map::new();
    let summary = end.budget.clone().unwrap_or_else(|| output.summary.clone());
    extra.insert("step_summary".into(), Value::from(summary));
    extra.insert("confidence".into(), Value::from(output.confidence));
    extra.insert(
        "confidence_threshold".into(),
        Value::from(entry.gate().confidence_threshold),
    );
    if end.proceed_reason {
        let reason = output.proceed_reason.clone();
        extra.insert(
            "proceed_reason".into(),
            reason.map(Value::from).unwrap_or(Value::Null),
        );
    }
    if let Some(why) = &end.escalation_reason {
        extra.insert("escalation_reason".into(), Value::from(why.clone()));
    }
    extra
}

fn add_usage(rs: &mut RunState, usage: &Usage, writes: &mut Vec<Write>) {
    if usage.tokens() == 0 && usage.cost_usd.is_none() {
        return;
    }
    rs.usage.add(usage);
    crate::telemetry::usage(
        &rs.pipeline.name,
        usage.input_tokens,
        usage.output_tokens,
        usage.cost_usd.unwrap_or(0.0),
    );
    writes.push(Write::SetRunUsage {
        run_id: rs.id().to_string(),
        tokens_used: rs.usage.tokens(),
        cost_usd: rs.usage.cost_usd.unwrap_or(0.0),
    });
}
