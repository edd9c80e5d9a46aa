//! Parallel groups and fan-outs: branches run concurrently, each recorded the
//! moment it finishes, then joined over the full set (kept + fresh).

use std::time::Duration;

use serde_json::Value;

use super::branch::{BranchDone, BranchEnd, BranchJob};
use super::records::{self, NewRecord};
use super::unit::{RunState, UnitOutcome, UnitResult};
use super::Error;
use crate::domain::{StepKind, StepStatus};
use crate::events::Event;
use crate::pipeline::{Action, FanOut, Gate, Join, Parallel};
use crate::run::context::{self, ItemVars};
use crate::run::flow::{self, FanOutItems};
use crate::run::join;
use crate::run::plan::{BranchPlan, InFlight};
use crate::run::{StepOutput, Usage};
use crate::store::{StepRecord, Write};

/// A group's branches, described once for both shapes.
struct Shape<'a> {
    name: &'a str,
    kind: StepKind,
    branch_kind: StepKind,
    gate: &'a Gate,
    join: Join,
    /// (template key, path, action, weight) per branch.
    branches: Vec<(String, String, &'a Action, f64)>,
    timeout: Option<Duration>,
    label: &'static str,
}

fn group_record(rs: &RunState, i: usize, shape: &Shape<'_>) -> StepRecord {
    let mut rec = records::running(NewRecord {
        run_id: rs.id(),
        path: shape.name,
        index: records::step_index(i, None),
        kind: shape.kind,
        action: None,
        started_at: rs.now(),
        attempt: 1,
        iteration: 1,
    });
    rec.executor = shape.kind.as_str().to_string();
    rec
}

pub(super) async fn parallel(
    rs: &mut RunState,
    i: usize,
    p: &Parallel,
    plan: Option<Vec<BranchPlan>>,
) -> Result<UnitOutcome, Error> {
    let shape = Shape {
        name: &p.name,
        kind: StepKind::Parallel,
        branch_kind: StepKind::Branch,
        gate: &p.gate,
        join: p.join,
        branches: p
            .branches
            .iter()
            .map(|b| {
                (
                    b.name.clone(),
                    format!("{}/{}", p.name, b.name),
                    &b.action,
                    b.weight,
                )
            })
            .collect(),
        timeout: p.timeout_seconds.map(Duration::from_secs_f64),
        label: "Parallel group",
    };
    let mut rec = group_record(rs, i, &shape);
    let plans = match plan {
        Some(pl) => pl,
        None => {
            rs.commit(vec![
                Write::UpsertStep(rec.clone()),
                rs.ev(
                    Event::ParallelGroupStarted {
                        group: p.name.clone(),
                        branches: p.branches.len(),
                    },
                    format!(
                        "Parallel group {} started: {} branch(es)",
                        p.name,
                        p.branches.len()
                    ),
                ),
            ])
            .await?;
            vec![BranchPlan::NotStarted; p.branches.len()]
        }
    };
    let ctx = context::to_template_value(rs.context(&p.name, None, None, None));
    let ctxs = vec![ctx; shape.branches.len()];
    run_group(rs, i, &shape, plans, ctxs, &mut rec).await
}

pub(super) async fn fan_out(
    rs: &mut RunState,
    i: usize,
    f: &FanOut,
    plan: Option<(Vec<BranchPlan>, Option<Vec<Value>>)>,
) -> Result<UnitOutcome, Error> {
    let mut shape = Shape {
        name: &f.name,
        kind: StepKind::FanOut,
        branch_kind: StepKind::FanOutBranch,
        gate: &f.gate,
        join: f.join,
        branches: Vec::new(),
        timeout: None,
        label: "Fan-out",
    };
    let mut rec = group_record(rs, i, &shape);
    rec.executor = f.action.executor_name.clone();
    rec.agent = f.action.agent.clone();
    let (plans, items) = match plan {
        Some((plans, Some(items))) => (plans, items),
        _ => {
            let ctx = context::to_template_value(rs.context(&f.name, None, None, None));
            let items = rs
                .pipeline
                .templates
                .render(&f.over, &ctx)
                .map_err(|e| format!("Fan-out '{}': failed to resolve 'over': {e}", f.name))
                .and_then(|text| flow::parse_items(&f.name, &text));
            let decision = match items {
                Ok(items) => flow::fan_out_items(&f.name, items, f.max_items, f.on_empty),
                Err(reason) => FanOutItems::Fail {
                    empty: false,
                    reason,
                },
            };
            match decision {
                FanOutItems::Run(items) => {
                    rec.items_json = Some(Value::Array(items.clone()).to_string());
                    rs.commit(vec![
                        Write::UpsertStep(rec.clone()),
                        rs.ev(
                            Event::FanOutStarted {
                                step: f.name.clone(),
                                items: items.len(),
                            },
                            format!("Fan-out {} started: {} item(s)", f.name, items.len()),
                        ),
                    ])
                    .await?;
                    (vec![BranchPlan::NotStarted; items.len()], items)
                }
                FanOutItems::Empty { skipped } => {
                    let out = StepOutput::new(1.0, format!("Fan-out '{}': empty list", f.name));
                    records::finish(
                        &mut rec,
                        StepStatus::Completed,
                        &out,
                        &Usage::default(),
                        None,
                        rs.now(),
                    );
                    let step = f.name.clone();
                    let event = if skipped {
                        Event::FanOutSkipped { step }
                    } else {
                        Event::FanOutEmpty { step }
                    };
                    let ev = rs.ev(event, format!("Fan-out {} had no items", f.name));
                    return Ok(done(
                        StepStatus::Completed,
                        out,
                        rec,
                        vec![ev],
                        None,
                        Vec::new(),
                        Usage::default(),
                    ));
                }
                FanOutItems::Fail { empty, reason } => {
                    let out = StepOutput::failed(&reason);
                    records::finish(
                        &mut rec,
                        StepStatus::Failed,
                        &out,
                        &Usage::default(),
                        Some(reason.clone()),
                        rs.now(),
                    );
                    let step = f.name.clone();
                    let event = if empty {
                        Event::FanOutEmptyAborted { step }
                    } else {
                        Event::FanOutFailed { step }
                    };
                    let ev = rs.ev(event, reason.clone());
                    return Ok(done(
                        StepStatus::Failed,
                        out,
                        rec,
                        vec![ev],
                        Some(reason),
                        Vec::new(),
                        Usage::default(),
                    ));
                }
            }
        }
    };
    rec.items_json = Some(Value::Array(items.clone()).to_string());
    shape.branches = (0..items.len())
        .map(|n| {
            (
                format!("{}/{n}", f.name),
                format!("{}/{n}", f.name),
                &f.action,
                1.0,
            )
        })
        .collect();
    let total = items.len();
    let ctxs = items
        .iter()
        .enumerate()
        .map(|(n, item)| {
            context::to_template_value(rs.context(
                &f.name,
                None,
                Some(ItemVars {
                    name: &f.item_var,
                    item,
                    index: n,
                    total,
                }),
                None,
            ))
        })
        .collect();
    run_group(rs, i, &shape, plans, ctxs, &mut rec).await
}

fn done(
    status: StepStatus,
    output: StepOutput,
    record: StepRecord,
    events: Vec<Write>,
    error: Option<String>,
    register: Vec<(String, Value)>,
    usage: Usage,
) -> UnitOutcome {
    UnitOutcome::Done(Box::new(UnitResult {
        status,
        output,
        usage,
        record,
        events,
        error,
        register,
    }))
}

async fn run_group(
    rs: &mut RunState,
    i: usize,
    shape: &Shape<'_>,
    plans: Vec<BranchPlan>,
    ctxs: Vec<minijinja::Value>,
    rec: &mut StepRecord,
) -> Result<UnitOutcome, Error> {
    let mut ended = Ended::kept(shape, &plans);
    let escalating: Vec<usize> = plans
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p, BranchPlan::InFlight(InFlight::Escalate)))
        .map(|(pos, _)| pos)
        .collect();
    if !escalating.is_empty() {
        return Ok(escalate_group(rs, shape, &escalating, ended, rec));
    }
    let mut set = spawn_branches(rs, i, shape, &plans, ctxs);
    let deadline = shape.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut drained = false;
    loop {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, set.join_next()).await {
                Ok(n) => n,
                Err(_) => {
                    set.abort_all();
                    return timed_out(rs, shape, rec, ended.register).await;
                }
            },
            None => set.join_next().await,
        };
        let Some(joined) = next else { break };
        match joined {
            Ok(Ok(BranchEnd::Done(b))) => ended.add(shape, b),
            Ok(Ok(BranchEnd::Drained)) => drained = true,
            Ok(Err(e)) => return Err(e),
            Err(join_err) => {
                tracing::error!(run_id = %rs.id(), group = shape.name, error = %join_err, "A branch task ended abnormally.");
            }
        }
    }
    if drained {
        return Ok(UnitOutcome::Drained);
    }
    Ok(joined(rs, shape, ended, rec))
}

/// What the group knows of its branches so far: how each ended, the outputs to
/// register, the usage spent by this process.
struct Ended {
    branches: Vec<join::Branch>,
    register: Vec<(String, Value)>,
    usage: Usage,
}

impl Ended {
    /// Branches kept from before a restart keep their outputs.
    fn kept(shape: &Shape<'_>, plans: &[BranchPlan]) -> Self {
        let mut ended = Ended {
            branches: shape
                .branches
                .iter()
                .map(|b| join::Branch {
                    ended: None,
                    weight: b.3,
                })
                .collect(),
            register: Vec::new(),
            usage: Usage::default(),
        };
        for (pos, plan) in plans.iter().enumerate() {
            if let BranchPlan::Kept { status, output, .. } = plan {
                let failed = *status != StepStatus::Completed;
                let c = output.get("confidence").and_then(Value::as_f64);
                ended.set(shape, pos, (c.unwrap_or(0.0), failed), output.clone());
            }
        }
        ended
    }

    fn add(&mut self, shape: &Shape<'_>, b: BranchDone) {
        self.usage.add(&b.usage);
        self.set(shape, b.pos, (b.confidence, b.failed), b.output);
    }

    fn set(&mut self, shape: &Shape<'_>, pos: usize, end: (f64, bool), output: Value) {
        let confidence = if end.1 { 0.0 } else { end.0 };
        if let Some(b) = self.branches.get_mut(pos) {
            b.ended = Some((confidence, end.1));
        }
        if let Some((key, path, _, _)) = shape.branches.get(pos) {
            if key != path {
                self.register.push((key.clone(), output.clone()));
                self.register.push((path.clone(), output));
            } else {
                self.register.push((key.clone(), output));
            }
        }
    }
}

/// Starts a task per branch that has still to run (or run again).
fn spawn_branches(
    rs: &RunState,
    i: usize,
    shape: &Shape<'_>,
    plans: &[BranchPlan],
    ctxs: Vec<minijinja::Value>,
) -> tokio::task::JoinSet<Result<BranchEnd, Error>> {
    let mut set = tokio::task::JoinSet::new();
    for (pos, plan) in plans.iter().enumerate() {
        let attempt = match plan {
            BranchPlan::NotStarted | BranchPlan::Waiting => 1,
            BranchPlan::InFlight(InFlight::Rerun { attempt }) => *attempt,
            _ => continue,
        };
        let Some((_, path, action, _)) = shape.branches.get(pos) else {
            continue;
        };
        let job = BranchJob {
            services: rs.services.clone(),
            children: rs.children.clone(),
            team: rs.run.team.clone(),
            stage: rs.run.stage.clone(),
            trigger: rs.trigger.clone(),
            spent: rs.usage,
            pipeline: rs.pipeline.clone(),
            run_id: rs.id().to_string(),
            group: shape.name.to_string(),
            path: path.clone(),
            index: records::step_index(i, Some(pos)),
            kind: shape.branch_kind,
            action: (*action).clone(),
            ctx: ctxs.get(pos).cloned().unwrap_or_default(),
            attempt,
        };
        set.spawn(job.run(pos));
    }
    set
}

/// Every branch ended: the group settles as `run::join` joins them.
fn joined(rs: &RunState, shape: &Shape<'_>, ended: Ended, rec: &mut StepRecord) -> UnitOutcome {
    let n = shape.branches.len();
    let j = join::join_all(shape.join, shape.gate, &ended.branches);
    let (confidence, completed, status) = (j.confidence, j.completed, j.status);
    let output = StepOutput::new(
        confidence,
        format!(
            "{} '{}': {completed}/{n} branches completed",
            shape.label, shape.name
        ),
    );
    records::finish(rec, status, &output, &Usage::default(), None, rs.now());
    let (step, group, total) = (shape.name.to_string(), shape.name.to_string(), n);
    let joined_event = if shape.kind == StepKind::FanOut {
        Event::FanOutCompleted {
            step,
            group,
            confidence,
            completed,
            total,
            status,
        }
    } else {
        Event::ParallelGroupCompleted {
            step,
            group,
            confidence,
            completed,
            total,
            status,
        }
    };
    let mut events = vec![rs.ev(joined_event, output.summary.clone())];
    if let Some(settled) = Event::group_settled(status, shape.name.to_string(), confidence) {
        events.push(rs.ev(
            settled,
            format!("{} {} {}", shape.label, shape.name, status.as_str()),
        ));
    }
    done(
        status,
        output,
        rec.clone(),
        events,
        None,
        ended.register,
        ended.usage,
    )
}

fn escalate_group(
    rs: &RunState,
    shape: &Shape<'_>,
    escalating: &[usize],
    ended: Ended,
    rec: &mut StepRecord,
) -> UnitOutcome {
    let n = shape.branches.len();
    let kept = ended.branches.iter().filter(|b| b.ended.is_some()).count();
    let joined = join::join_ended(shape.join, &ended.branches);
    let register = ended.register;
    let paths: Vec<String> = escalating
        .iter()
        .filter_map(|p| shape.branches.get(*p).map(|b| b.1.clone()))
        .collect();
    let summary = format!(
        "{} '{}' escalated on resume (durable.on_interrupted=escalate): {} branch(es) were in flight, {kept}/{n} had completed",
        shape.label,
        shape.name,
        paths.len()
    );
    let output = StepOutput::new(joined, summary.clone());
    let mut events = Vec::new();
    let now = rs.now();
    for path in &paths {
        let mut b = records::running(NewRecord {
            run_id: rs.id(),
            path,
            index: 0,
            kind: shape.branch_kind,
            action: None,
            started_at: now,
            attempt: 1,
            iteration: 1,
        });
        // Keep the branch's position and executor from its original record.
        if let Some(orig) = rs.interrupted.get(path) {
            b = orig.clone();
        }
        records::finish(
            &mut b,
            StepStatus::Escalated,
            &StepOutput::new(0.0, "escalated on resume"),
            &Usage::default(),
            None,
            now,
        );
        events.push(Write::UpsertStep(b));
    }
    events.push(rs.ev(
        Event::ResumeGroupEscalated {
            step: shape.name.to_string(),
            branches: paths,
        },
        summary,
    ));
    records::finish(
        rec,
        StepStatus::Escalated,
        &output,
        &Usage::default(),
        None,
        now,
    );
    done(
        StepStatus::Escalated,
        output,
        rec.clone(),
        events,
        None,
        register,
        Usage::default(),
    )
}

async fn timed_out(
    rs: &RunState,
    shape: &Shape<'_>,
    rec: &mut StepRecord,
    register: Vec<(String, Value)>,
) -> Result<UnitOutcome, Error> {
    let secs = shape.timeout.map_or(0.0, |t| t.as_secs_f64());
    let reason = format!("{} '{}' timed out after {secs}s", shape.label, shape.name);
    let now = rs.now();
    // Branches cut off by the timeout are closed as failed so nothing looks in flight.
    // The one read of a run's records after its plan: branch tasks commit their own
    // records, so only the store knows which of them finished just before the cut.
    let mut writes = Vec::new();
    let stored =
        super::persist::read(&rs.services, rs.id(), || rs.services.store.steps(rs.id())).await?;
    for r in stored {
        if r.status == StepStatus::Running && r.step_path.starts_with(&format!("{}/", shape.name)) {
            let mut r = r;
            records::finish(
                &mut r,
                StepStatus::Failed,
                &StepOutput::failed("cancelled: group timed out"),
                &Usage::default(),
                Some("cancelled: group timed out".into()),
                now,
            );
            writes.push(Write::UpsertStep(r));
        }
    }
    writes.push(rs.ev(
        Event::GroupTimedOut {
            group: shape.name.to_string(),
            reason: "group_timeout".to_string(),
        },
        reason.clone(),
    ));
    let out = StepOutput::failed(&reason);
    records::finish(
        rec,
        StepStatus::Failed,
        &out,
        &Usage::default(),
        Some(reason.clone()),
        now,
    );
    Ok(done(
        StepStatus::Failed,
        out,
        rec.clone(),
        writes,
        Some(reason),
        register,
        Usage::default(),
    ))
}
