//! The resume planner: from a pipeline and the step records a run left behind,
//! decide what happens to every unit. Pure; `runner` executes the plan.
//!
//! A fresh run is planned the same way with no records, so there is one code path
//! for starting and for resuming.

use serde_json::Value;

use super::output::Usage;
use crate::domain::StepStatus;
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
        status: StepStatus,
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
        status: StepStatus,
        output: Option<Value>,
        /// A group's branch outputs under the template keys a live group registers
        /// them (a parallel branch's name and its path, a fan-out item's path), in
        /// its order, so that `steps.<branch>` after a kept group is what it was.
        branches: Vec<(String, Value)>,
    },
    /// Finished and ended the run, but the run was not closed: close it now.
    Terminal {
        status: StepStatus,
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
    /// The records of the steps and branches left in flight or waiting, which the
    /// units that take them over keep (first start, attempts, position,
    /// executor): with these the driver needs no second read of the run's records.
    pub interrupted: Vec<StepRecord>,
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
        interrupted: records
            .iter()
            .filter(|r| matches!(r.status, StepStatus::Running | StepStatus::Waiting))
            .cloned()
            .collect(),
    };
    for entry in &pipeline.steps {
        let name = entry.name();
        let Some(rec) = find(name) else {
            plan.units.push(UnitPlan::NotStarted);
            continue;
        };
        let unit = match rec.status {
            StepStatus::Running => match entry {
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
            StepStatus::Waiting => UnitPlan::Waiting,
            status => {
                let output = output_of(rec);
                let continues = match (status, entry) {
                    (StepStatus::Completed | StepStatus::Skipped, _) => true,
                    (StepStatus::Failed, Entry::Step(s)) => s.on_failure.continue_run,
                    _ => false,
                };
                if continues {
                    plan.steps_skipped += 1;
                    UnitPlan::Kept {
                        status,
                        output,
                        branches: branch_outputs(entry, rec, &find),
                    }
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

/// The recorded branch outputs of a finished group, under the keys a live group
/// registers them (`runner::group`): a parallel branch's name, then its path; a
/// fan-out item's path. Empty for a plain step.
fn branch_outputs<'a>(
    entry: &Entry,
    rec: &StepRecord,
    find: &dyn Fn(&str) -> Option<&'a StepRecord>,
) -> Vec<(String, Value)> {
    let name = entry.name();
    let mut out = Vec::new();
    match entry {
        Entry::Step(_) => {}
        Entry::Parallel(p) => {
            for b in &p.branches {
                let path = format!("{name}/{}", b.name);
                if let Some(r) = find(&path) {
                    let v = output_of(r).unwrap_or(Value::Null);
                    out.push((b.name.clone(), v.clone()));
                    out.push((path, v));
                }
            }
        }
        Entry::FanOut(_) => {
            let items = rec
                .items_json
                .as_deref()
                .and_then(|s| serde_json::from_str::<Vec<Value>>(s).ok())
                .map_or(0, |v| v.len());
            for i in 0..items {
                let path = format!("{name}/{i}");
                if let Some(r) = find(&path) {
                    out.push((path, output_of(r).unwrap_or(Value::Null)));
                }
            }
        }
    }
    out
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
            Some(r) if r.status == StepStatus::Running => {
                plan.in_flight.push(path.clone());
                BranchPlan::InFlight(in_flight(policy, r))
            }
            Some(r) if r.status == StepStatus::Waiting => BranchPlan::Waiting,
            Some(r) => {
                plan.branches_skipped += 1;
                BranchPlan::Kept {
                    status: r.status,
                    output: output_of(r).unwrap_or(Value::Null),
                    weight_index: i,
                }
            }
        };
        branches.push(b);
    }
    UnitPlan::Group { branches, items }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::run::test_support::pipeline;

    fn rec(path: &str, status: &str, attempts: u32) -> StepRecord {
        StepRecord {
            run_id: "r".into(),
            step_path: path.into(),
            step_index: 0,
            kind: crate::domain::StepKind::Step,
            executor: "mock".into(),
            agent: None,
            status: StepStatus::parse(status).expect("a step status"),
            attempts,
            iteration: 1,
            idempotency_key: format!("r:{path}:1"),
            started_at: 0,
            finished_at: None,
            duration_ms: None,
            primary_confidence: None,
            effective_confidence: None,
            output_json: Some(format!(r#"{{"confidence":0.9,"summary":"{path}"}}"#)),
            error: None,
            input_tokens: 100,
            output_tokens: 10,
            cost_usd: Some(0.01),
            items_json: None,
        }
    }

    const SHAPES: &str = "name: p\ntrigger: {}\ndurable: {on_interrupted: POLICY}\nsteps:\n  - {name: a, executor: mock}\n  - {name: b, executor: mock, on_failure: continue}\n  - parallel:\n      name: g\n      steps:\n        - {name: x, executor: mock}\n        - {name: y, executor: mock}\n        - {name: z, executor: mock}\n  - fan_out: {name: fo, over: '[1, 2, 3]', executor: mock}\n  - {name: h, executor: mock}\n";

    fn shapes(policy: &str) -> std::sync::Arc<Pipeline> {
        pipeline(&SHAPES.replace("POLICY", policy))
    }

    fn check(
        policy: &str,
        records: &[StepRecord],
        units: &[&str],
        in_flight: &[&str],
        steps_skipped: usize,
        branches_skipped: usize,
    ) {
        let p = shapes(policy);
        let plan = plan(&p, records);
        let got: Vec<&str> = plan
            .units
            .iter()
            .map(|u| match u {
                UnitPlan::NotStarted => "not_started",
                UnitPlan::Kept { .. } => "kept",
                UnitPlan::Terminal { .. } => "terminal",
                UnitPlan::InFlight(InFlight::Rerun { .. }) => "rerun",
                UnitPlan::InFlight(InFlight::Escalate) => "escalate",
                UnitPlan::Waiting => "waiting",
                UnitPlan::Group { .. } => "group",
            })
            .collect();
        assert_eq!(got, units, "units for {records:?}");
        assert_eq!(plan.in_flight, in_flight);
        assert_eq!(plan.steps_skipped, steps_skipped);
        assert_eq!(plan.branches_skipped, branches_skipped);
    }

    #[test]
    fn a_fresh_run_plans_nothing_kept() {
        check("rerun", &[], &["not_started"; 5], &[], 0, 0);
        assert!(plan(&shapes("rerun"), &[]).is_fresh());
    }

    #[test]
    fn units_by_record_status() {
        let done = rec("a", "completed", 1);
        // Completed and continued-failure steps are kept; the in-flight one follows the policy.
        check(
            "rerun",
            &[done.clone(), rec("b", "running", 1)],
            &["kept", "rerun", "not_started", "not_started", "not_started"],
            &["b"],
            1,
            0,
        );
        check(
            "escalate",
            &[done.clone(), rec("b", "running", 1)],
            &[
                "kept",
                "escalate",
                "not_started",
                "not_started",
                "not_started",
            ],
            &["b"],
            1,
            0,
        );
        check(
            "rerun",
            &[done.clone(), rec("b", "failed", 1)],
            &["kept", "kept", "not_started", "not_started", "not_started"],
            &[],
            2,
            0,
        );
        check(
            "rerun",
            &[rec("a", "skipped", 0)],
            &[
                "kept",
                "not_started",
                "not_started",
                "not_started",
                "not_started",
            ],
            &[],
            1,
            0,
        );
        // A unit that ended the run but whose run was not closed is closed, never passed.
        check(
            "rerun",
            &[rec("a", "escalated", 1)],
            &[
                "terminal",
                "not_started",
                "not_started",
                "not_started",
                "not_started",
            ],
            &[],
            0,
            0,
        );
        check(
            "rerun",
            &[rec("a", "failed", 1)],
            &[
                "terminal",
                "not_started",
                "not_started",
                "not_started",
                "not_started",
            ],
            &[],
            0,
            0,
        );
        check(
            "rerun",
            &[rec("a", "waiting", 1)],
            &[
                "waiting",
                "not_started",
                "not_started",
                "not_started",
                "not_started",
            ],
            &[],
            0,
            0,
        );
    }

    #[test]
    fn rerun_uses_the_next_attempt() {
        let p = shapes("rerun");
        let plan = plan(&p, &[rec("a", "running", 3)]);
        assert_eq!(
            plan.units[0],
            UnitPlan::InFlight(InFlight::Rerun { attempt: 4 })
        );
        assert_eq!(plan.units[1], UnitPlan::NotStarted);
    }

    #[test]
    fn partial_groups_list_kept_in_flight_and_missing_branches() {
        let mut records = vec![
            rec("a", "completed", 1),
            rec("b", "completed", 1),
            rec("g", "running", 1),
        ];
        records.push(rec("g/x", "completed", 1));
        records.push(rec("g/y", "running", 1));
        let mut fo = rec("fo", "running", 1);
        fo.items_json = Some("[1, 2, 3]".into());
        let p = shapes("escalate");
        let plan = plan(&p, &records);
        let UnitPlan::Group { branches, items } = &plan.units[2] else {
            panic!("{:?}", plan.units[2])
        };
        assert!(items.is_none());
        assert!(matches!(branches[0], BranchPlan::Kept { .. }));
        assert_eq!(branches[1], BranchPlan::InFlight(InFlight::Escalate));
        assert_eq!(branches[2], BranchPlan::NotStarted);
        assert_eq!(plan.in_flight, vec!["g/y".to_string()]);
        assert_eq!(plan.branches_skipped, 1);

        // The fan-out's item list comes from its record, not from re-rendering `over`.
        let mut records = records.clone();
        records[2].status = StepStatus::Completed;
        records.push(fo);
        records.push(rec("fo/1", "completed", 1));
        let plan = super::plan(&shapes("rerun"), &records);
        assert!(matches!(plan.units[2], UnitPlan::Kept { .. }));
        let UnitPlan::Group { branches, items } = &plan.units[3] else {
            panic!("{:?}", plan.units[3])
        };
        assert_eq!(items.as_ref().map(Vec::len), Some(3));
        assert_eq!(branches.len(), 3);
        assert_eq!(branches[0], BranchPlan::NotStarted);
        assert!(matches!(branches[1], BranchPlan::Kept { .. }));
    }

    #[test]
    fn a_kept_group_brings_back_its_branch_outputs() {
        let mut fo = rec("fo", "completed", 1);
        fo.items_json = Some("[1, 2, 3]".into());
        let records = vec![
            rec("a", "completed", 1),
            rec("b", "completed", 1),
            rec("g", "completed", 1),
            rec("g/x", "completed", 1),
            rec("g/y", "failed", 1),
            rec("g/z", "completed", 1),
            fo,
            rec("fo/0", "completed", 1),
            rec("fo/2", "completed", 1),
        ];
        let plan = plan(&shapes("rerun"), &records);
        let keys = |u: &UnitPlan| match u {
            UnitPlan::Kept { branches, .. } => branches
                .iter()
                .map(|(k, v)| format!("{k}={}", v["summary"].as_str().unwrap_or("")))
                .collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert!(
            keys(&plan.units[0]).is_empty(),
            "a plain step has no branches"
        );
        assert_eq!(
            keys(&plan.units[2]),
            ["x=g/x", "g/x=g/x", "y=g/y", "g/y=g/y", "z=g/z", "g/z=g/z"]
        );
        assert_eq!(keys(&plan.units[3]), ["fo/0=fo/0", "fo/2=fo/2"]);
    }

    #[test]
    fn budget_carries_every_recorded_usage() {
        let plan = plan(
            &shapes("rerun"),
            &[
                rec("a", "completed", 1),
                rec("b", "completed", 1),
                rec("g/x", "completed", 1),
            ],
        );
        assert_eq!(plan.usage.input_tokens, 300);
        assert_eq!(plan.usage.output_tokens, 30);
        assert!((plan.usage.cost_usd.unwrap_or(0.0) - 0.03).abs() < 1e-9);
    }
}
