//! A plain step: `running` record, retries, timeouts, `loop_until`, the gate.

use serde_json::Value;

use super::call::call_once;
use super::records::{self, NewRecord};
use super::unit::{CallFailure, CallSpec, HumanMode, RunState, Start, UnitOutcome, UnitResult};
use super::Error;
use crate::domain::{StepKind, StepStatus};
use crate::events::Event;
use crate::executor::Outcome;
use crate::pipeline::{Entry, ExecutorKind, Step};
use crate::run::attempt::{self, AfterFailure, AfterOutput, LoopEnd};
use crate::run::context::{self, LoopVars};
use crate::run::flow;
use crate::run::{StepOutput, Usage};
use crate::store::Write;

/// Whether this step's wait for a human may park the run: only a top-level step
/// that asks once (no `retry`, no `loop_until`, whose bookkeeping lives in this
/// task), in a run no parent awaits, in a process that parks (`serve`). A human
/// step parks on its approval, a tool-using agent step on a tool call's approval
/// (its loop is resumed from the journal when the run is driven again).
fn may_park(rs: &RunState, step: &Step) -> bool {
    asks_human(rs, step)
        && step.loop_until.is_none()
        && step.retry.as_ref().is_none_or(|r| r.attempts <= 1)
        && rs.run.parent_run_id.is_none()
        && rs.services.parking_enabled()
}

/// The `running` record and `step_started` line a plain step commits before its
/// executor is called (by the driver, or for a new run's first step by
/// `Engine::create_run`, in the run's own commit).
pub(super) fn opening(
    run_id: &str,
    i: usize,
    step: &Step,
    started_at: i64,
    attempt: u32,
    rerun: bool,
) -> (crate::store::StepRecord, Write) {
    let path = step.name.as_str();
    let rec = records::running(NewRecord {
        run_id,
        path,
        index: records::step_index(i, None),
        kind: StepKind::Step,
        action: Some(&step.action),
        started_at,
        attempt,
        iteration: 1,
    });
    let started = Event::StepStarted {
        step: path.to_string(),
        executor: step.action.executor_name.clone(),
        agent: step.action.agent.clone(),
        attempt,
        rerun_after_restart: rerun,
    }
    .write(run_id, started_at, format!("Step started: {path}"));
    (rec, started)
}

fn asks_human(rs: &RunState, step: &Step) -> bool {
    step.action.executor == ExecutorKind::Human
        || super::agent::runs_loop_for(&rs.services.config, &step.action)
}

/// Whether `entry` is a human step that parks the run at once (see `may_park`);
/// an agent step first runs its turns, for as long as they take.
pub(super) fn parks(rs: &RunState, entry: &Entry) -> bool {
    matches!(entry, Entry::Step(s) if s.action.executor == ExecutorKind::Human && may_park(rs, s))
}

pub(super) async fn run(
    rs: &mut RunState,
    i: usize,
    step: &Step,
    start: Start,
) -> Result<UnitOutcome, Error> {
    let path = step.name.as_str();
    let unparked = matches!(start, Start::Rearm) && rs.unparked.contains_key(path);
    let mut rec = open(rs, i, step, &start).await?;
    let human = HumanMode {
        may_park: may_park(rs, step),
        unparked,
    };
    let max_iterations = step.loop_until.as_ref().map_or(1, |l| l.max_iterations);
    let mut usage = Usage::default();
    let mut events = Vec::new();
    let mut prior: Option<(f64, Value)> = None;
    let mut attempt = rec.attempts;
    let mut iteration = 1;
    let output = loop {
        if iteration > 1 {
            rec.iteration = iteration;
            rec.idempotency_key = records::idempotency_key(rs.id(), path, iteration);
            rec.attempts = attempt;
            let ev = rs.ev(
                Event::LoopIteration {
                    step: path.to_string(),
                    iteration,
                    max_iterations,
                },
                format!("{path}: iteration {iteration}/{max_iterations}"),
            );
            rs.commit(vec![Write::UpsertStep(rec.clone()), ev]).await?;
        }
        let loop_vars = step.loop_until.as_ref().map(|_| LoopVars {
            iteration,
            max_iterations,
            prior_confidence: prior.as_ref().map(|p| p.0),
            prior_output: prior.as_ref().map(|p| p.1.clone()),
        });
        let o = match attempts(rs, step, &mut rec, &mut attempt, loop_vars, human).await? {
            Tried::Output(o) => o,
            Tried::Failed(msg) => {
                return Ok(failed(rs, path, rec, usage, events, attempt, msg));
            }
            Tried::Drained => return Ok(UnitOutcome::Drained),
            Tried::Parked => return Ok(UnitOutcome::Parked),
            Tried::Escalated(why) => {
                return Ok(UnitOutcome::Done(Box::new(escalated(
                    rs, path, rec, usage, why,
                ))));
            }
        };
        usage.add(&o.usage);
        let conf = o.output.confidence;
        match attempt::after_output(step.loop_until.as_ref(), iteration, conf) {
            AfterOutput::NextIteration => {
                prior = Some((conf, o.output.to_json()));
                iteration += 1;
            }
            AfterOutput::Done => break o.output,
        }
    };
    if let Some(end) = attempt::loop_end(step.loop_until.as_ref(), output.confidence) {
        events.push(loop_event(rs, step, end, iteration, output.confidence));
    }
    Ok(gated(rs, step, rec, output, usage, events))
}

/// The step's `running` record: taken from the run's own commit for a new run's
/// first step, carried on from the parked wait for an unparked run (same start
/// time, no second `step_started`), committed now otherwise.
async fn open(
    rs: &mut RunState,
    i: usize,
    step: &Step,
    start: &Start,
) -> Result<crate::store::StepRecord, Error> {
    let path = step.name.as_str();
    let waited_since = match start {
        Start::Rearm => rs.unparked.get(path).copied(),
        _ => None,
    };
    if let (Start::Fresh, Some(r)) = (start, rs.opened.take()) {
        if r.step_path == path {
            return Ok(r);
        }
    }
    let first_attempt = match start {
        Start::Rerun { attempt } => *attempt,
        _ => 1,
    };
    let started_at = waited_since.unwrap_or_else(|| rs.now());
    let rerun = matches!(start, Start::Rerun { .. });
    let (rec, started) = opening(rs.id(), i, step, started_at, first_attempt, rerun);
    if waited_since.is_none() {
        rs.commit(vec![Write::UpsertStep(rec.clone()), started])
            .await?;
    }
    Ok(rec)
}

/// How one iteration's attempts ended.
enum Tried {
    Output(Box<Outcome>),
    /// The last attempt allowed failed with this error.
    Failed(String),
    Drained,
    Parked,
    /// The call asked for an escalation (see `CallFailure::Escalate`).
    Escalated(String),
}

/// Calls the step's executor until an attempt succeeds or `run::attempt` says
/// the step fails, committing each retry before its delay.
async fn attempts(
    rs: &mut RunState,
    step: &Step,
    rec: &mut crate::store::StepRecord,
    attempt: &mut u32,
    loop_vars: Option<LoopVars>,
    human: HumanMode,
) -> Result<Tried, Error> {
    let path = step.name.as_str();
    let key = records::idempotency_key(rs.id(), path, rec.iteration);
    let mut try_no = 1;
    loop {
        // Built per attempt and handed over, so nothing holds it during the call.
        let ctx = context::to_template_value(rs.context(path, loop_vars.as_ref(), None, None));
        let result = call_once(CallSpec {
            services: &rs.services,
            children: &rs.children,
            pipeline: &rs.pipeline,
            run_id: &rs.run.id,
            path,
            key: &key,
            attempt: *attempt,
            action: &step.action,
            ctx,
            human,
            facts: rs.facts(rec),
        })
        .await;
        let (msg, retriable) = match result {
            Ok(o) => return Ok(Tried::Output(Box::new(o))),
            Err(CallFailure::Drained) => return Ok(Tried::Drained),
            Err(CallFailure::Parked) => return Ok(Tried::Parked),
            Err(CallFailure::Escalate(msg)) => return Ok(Tried::Escalated(msg)),
            Err(CallFailure::Error(msg)) => (msg, true),
            Err(CallFailure::Config(msg)) => (msg, false),
        };
        match attempt::after_failure(step.retry.as_ref(), try_no, *attempt, retriable) {
            AfterFailure::Fail => return Ok(Tried::Failed(msg)),
            AfterFailure::Retry {
                attempt: next,
                delay,
            } => {
                *attempt = next;
                rec.attempts = next;
                let ev = rs.ev(
                    Event::StepRetrying {
                        step: path.to_string(),
                        error: msg.clone(),
                        attempt: next,
                        delay_seconds: delay.as_secs_f64(),
                    },
                    format!(
                        "{path} failed ({msg}); retrying in {:.1}s",
                        delay.as_secs_f64()
                    ),
                );
                rs.commit(vec![Write::UpsertStep(rec.clone()), ev]).await?;
                tokio::time::sleep(delay).await;
                try_no += 1;
            }
        }
    }
}

/// The step escalates for `why`, as the gate escalates a low-confidence output.
fn escalated(
    rs: &RunState,
    path: &str,
    mut rec: crate::store::StepRecord,
    usage: Usage,
    why: String,
) -> UnitResult {
    let output = StepOutput::new(0.0, why.clone());
    records::finish(
        &mut rec,
        StepStatus::Escalated,
        &output,
        &usage,
        None,
        rs.now(),
    );
    let events = vec![rs.ev(
        Event::UnitEscalated {
            step: path.to_string(),
            confidence: 0.0,
        },
        format!("Step escalated: {path}: {why}"),
    )];
    UnitResult {
        status: StepStatus::Escalated,
        output,
        usage,
        record: rec,
        events,
        error: None,
        register: Vec::new(),
    }
}

/// The step failed with `msg` on attempt number `attempt`.
fn failed(
    rs: &RunState,
    path: &str,
    mut rec: crate::store::StepRecord,
    usage: Usage,
    mut events: Vec<Write>,
    attempt: u32,
    msg: String,
) -> UnitOutcome {
    let mut out = StepOutput::failed(&msg);
    out.extra
        .insert(StepStatus::Failed.to_string(), Value::Bool(true));
    let now = rs.now();
    records::finish(
        &mut rec,
        StepStatus::Failed,
        &out,
        &usage,
        Some(msg.clone()),
        now,
    );
    events.push(rs.ev(
        Event::StepFailed {
            step: path.to_string(),
            error: msg.clone(),
            attempt,
        },
        format!("Step {path} failed: {msg}"),
    ));
    UnitOutcome::Done(Box::new(UnitResult {
        status: StepStatus::Failed,
        output: out,
        usage,
        record: rec,
        events,
        error: Some(msg),
        register: Vec::new(),
    }))
}

/// The run-log line of a loop that could iterate: converged or exhausted.
fn loop_event(rs: &RunState, step: &Step, end: LoopEnd, iterations: u32, confidence: f64) -> Write {
    let path = step.name.as_str();
    let s = path.to_string();
    let (event, msg) = match end {
        LoopEnd::Converged => (
            Event::LoopConverged {
                step: s,
                iterations,
                confidence,
            },
            format!("{path} converged after {iterations} iteration(s)"),
        ),
        LoopEnd::Exhausted => (
            Event::LoopExhausted {
                step: s,
                iterations,
                confidence,
            },
            format!(
                "{path} did not reach {} in {iterations} iteration(s)",
                step.loop_until.as_ref().map_or(0.0, |l| l.confidence)
            ),
        ),
    };
    rs.ev(event, msg)
}

/// The step produced `output`: its gate decides the status it settles with.
fn gated(
    rs: &RunState,
    step: &Step,
    mut rec: crate::store::StepRecord,
    output: StepOutput,
    usage: Usage,
    mut events: Vec<Write>,
) -> UnitOutcome {
    let path = step.name.as_str();
    let status = flow::gate(output.confidence, output.proceed, &step.gate);
    let now = rs.now();
    records::finish(&mut rec, status, &output, &usage, None, now);
    let gated = Event::step_gated(
        status,
        path.to_string(),
        output.confidence,
        step.gate.confidence_threshold,
        usage.tokens(),
        usage.cost_usd,
    );
    events.push(rs.ev(
        gated,
        format!(
            "Step {status}: {path} (confidence {:.2})",
            output.confidence,
            status = status.as_str()
        ),
    ));
    UnitOutcome::Done(Box::new(UnitResult {
        status,
        output,
        usage,
        record: rec,
        events,
        error: None,
        register: Vec::new(),
    }))
}

/// `on_interrupted: escalate` for a plain step that was in flight: it is not
/// executed again; it is marked escalated and the run takes the escalation path.
pub(super) fn escalate_in_flight(rs: &RunState, i: usize, entry: &Entry) -> UnitResult {
    let path = entry.name();
    let now = rs.now();
    let action = match entry {
        Entry::Step(s) => Some(&s.action),
        _ => None,
    };
    let mut rec = records::running(NewRecord {
        run_id: rs.id(),
        path,
        index: records::step_index(i, None),
        kind: super::unit::kind_of(entry),
        action,
        started_at: now,
        attempt: 1,
        iteration: 1,
    });
    // Keep the record's identity (first start, attempts) from before the crash.
    if let Some(orig) = rs.interrupted.get(path) {
        rec = orig.clone();
    }
    let summary = format!(
        "Step '{path}' escalated on resume (durable.on_interrupted=escalate): it was in flight when the process stopped and was not executed again"
    );
    let output = StepOutput::new(0.0, summary.clone());
    records::finish(
        &mut rec,
        StepStatus::Escalated,
        &output,
        &Usage::default(),
        None,
        now,
    );
    let events = vec![
        rs.ev(
            Event::ResumeStepEscalated {
                step: path.to_string(),
            },
            summary.clone(),
        ),
        rs.ev(
            Event::UnitEscalated {
                step: path.to_string(),
                confidence: 0.0,
            },
            format!("Step escalated: {path}"),
        ),
    ];
    UnitResult {
        status: StepStatus::Escalated,
        output,
        usage: Usage::default(),
        record: rec,
        events,
        error: None,
        register: Vec::new(),
    }
}
