//! The resume planner: from a pipeline and the step records a run left behind,
//! decide what happens to every unit. Pure; `runner` executes the plan.
//!
//! A fresh run is planned the same way with no records, so there is one code path
//! for starting and for resuming.

use serde_json::Value;

use super::flow::UnitStatus;
use super::output::Usage;
use crate::pipeline::{Entry, OnInterrupted, Pipeline};
use crate::store::StepRecord;

/// What to do with a unit whose record says it was in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// Execute again with the same idempotency key and this attempt number.
    Rerun { attempt: u32 },
    /// Do not execute; mark escalated and drive the escalation path.
    Escalate,
}

/// The plan for one branch of a parallel group or fan-out.
#[derive(Debug, Clone, PartialEq)]
pub enum BranchPlan {
    NotStarted,
    Kept {
        status: String,
        output: Value,
        weight_index: usize,
    },
    InFlight(InFlight),
    /// A human step inside the branch waits on its approval.
    Waiting,
}

/// The plan for one top-level entry.
#[derive(Debug, Clone, PartialEq)]
pub enum UnitPlan {
    NotStarted,
    /// Finished without ending the run (completed, skipped, failed + continue).
    Kept {
        status: UnitStatus,
        output: Option<Value>,
    },
    /// Finished and ended the run, but the run was not closed: close it now.
    Terminal {
        status: UnitStatus,
        output: Option<Value>,
        reason: Option<String>,
    },
    InFlight(InFlight),
    /// A human step whose approval is pending: re-arm, send nothing.
    Waiting,
    /// A group that started: per-branch plans in declaration (or item) order.
    Group {
        branches: Vec<BranchPlan>,
        /// The fan-out item list recorded when the fan-out started.
        items: Option<Vec<Value>>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ResumePlan {
    pub units: Vec<UnitPlan>,
    /// Usage already spent (budget accumulators start here).
    pub usage: Usage,
    pub steps_skipped: usize,
    pub branches_skipped: usize,
    /// Step paths that were in flight.
    pub in_flight: Vec<String>,
    pub on_interrupted: OnInterrupted,
}

impl ResumePlan {
    /// Whether anything had run at all (a fresh run plans nothing kept).
    pub fn is_fresh(&self) -> bool {
        self.units.iter().all(|u| matches!(u, UnitPlan::NotStarted))
    }
}

fn output_of(r: &StepRecord) -> Option<Value> {
    r.output_json
        .as_deref()
        .and_then(|s| serde_json::from_str(s).ok())
}

fn in_flight(policy: OnInterrupted, r: &StepRecord) -> InFlight {
    match policy {
        OnInterrupted::Rerun => InFlight::Rerun {
            attempt: r.attempts.max(1) + 1,
        },
        OnInterrupted::Escalate => InFlight::Escalate,
    }
}

/// Plans the resume of `pipeline` given the run's step records.
pub fn plan(pipeline: &Pipeline, records: &[StepRecord]) -> ResumePlan {
    let policy = pipeline
        .durable
        .as_ref()
        .map(|d| d.on_interrupted)
        .unwrap_or(OnInterrupted::Rerun);
    let find = |path: &str| records.iter().find(|r| r.step_path == path);
    let mut usage = Usage::default();
    for r in records {
        usage.add(&Usage {
            input_tokens: r.input_tokens,
            output_tokens: r.output_tokens,
            cost_usd: r.cost_usd,
        });
    }
    let mut plan = ResumePlan {
        units: Vec::new(),
        usage,
        steps_skipped: 0,
        branches_skipped: 0,
        in_flight: Vec::new(),
        on_interrupted: policy,
    };
    for entry in &pipeline.steps {
        let name = entry.name();
        let Some(rec) = find(name) else {
            plan.units.push(UnitPlan::NotStarted);
            continue;
        };
        let unit = match rec.status.as_str() {
            "running" => match entry {
                Entry::Step(_) => {
                    plan.in_flight.push(name.to_string());
                    UnitPlan::InFlight(in_flight(policy, rec))
                }
                Entry::Parallel(p) => {
                    let paths: Vec<String> = p
                        .branches
                        .iter()
                        .map(|b| format!("{name}/{}", b.name))
                        .collect();
                    group(&mut plan, policy, &paths, &find, None)
                }
                Entry::FanOut(_) => {
                    let items: Option<Vec<Value>> = rec
                        .items_json
                        .as_deref()
                        .and_then(|s| serde_json::from_str(s).ok());
                    let paths: Vec<String> = (0..items.as_ref().map_or(0, Vec::len))
                        .map(|i| format!("{name}/{i}"))
                        .collect();
                    group(&mut plan, policy, &paths, &find, items)
                }
            },
            "waiting" => UnitPlan::Waiting,
            status => {
                let status = UnitStatus::parse(status).unwrap_or(UnitStatus::Failed);
                let output = output_of(rec);
                let continues = match (status, entry) {
                    (UnitStatus::Completed | UnitStatus::Skipped, _) => true,
                    (UnitStatus::Failed, Entry::Step(s)) => s.on_failure.continue_run,
                    _ => false,
                };
                if continues {
                    plan.steps_skipped += 1;
                    UnitPlan::Kept { status, output }
                } else {
                    UnitPlan::Terminal {
                        status,
                        output,
                        reason: rec.error.clone(),
                    }
                }
            }
        };
        plan.units.push(unit);
    }
    plan
}

fn group<'a>(
    plan: &mut ResumePlan,
    policy: OnInterrupted,
    paths: &[String],
    find: &dyn Fn(&str) -> Option<&'a StepRecord>,
    items: Option<Vec<Value>>,
) -> UnitPlan {
    let mut branches = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let b = match find(path) {
            None => BranchPlan::NotStarted,
            Some(r) if r.status == "running" => {
                plan.in_flight.push(path.clone());
                BranchPlan::InFlight(in_flight(policy, r))
            }
            Some(r) if r.status == "waiting" => BranchPlan::Waiting,
            Some(r) => {
                plan.branches_skipped += 1;
                BranchPlan::Kept {
                    status: r.status.clone(),
                    output: output_of(r).unwrap_or(Value::Null),
                    weight_index: i,
                }
            }
        };
        branches.push(b);
    }
    UnitPlan::Group { branches, items }
}
