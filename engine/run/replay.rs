//! Replaying a run from a step (SPEC 12, `POST /runs/{id}/replay`): whether the
//! replay is allowed, and which of the old run's records the new run starts with.
//! Pure; `runner::replay` reads the rows, records the new run and drives it.
//!
//! `from_step` names a top-level entry of the pipeline (a step, a parallel group,
//! a fan-out). Every entry before it is copied with the rows of all its sub-paths
//! (branches `g/x`, fan-out items `fo/0`, an agent step's journal and its
//! delegations `s/delegate/...`), as they were; the new run is then planned from
//! those rows exactly as a resume is (`run::plan`), so the copied entries are
//! kept, never executed, and their outputs rebuild the template context. An entry
//! can be copied only if the resume planner would keep it: it finished without
//! ending the run. Approvals are never copied, so a copy that holds a human step is
//! refused: the replay has to ask again, from that step or an earlier one.

use crate::domain::{RunStatus, StepStatus};
use crate::pipeline::{Entry, Pipeline};
use crate::store::{RunRecord, StepJournal, StepRecord};

use super::output::Usage;
use super::plan::{self, UnitPlan};

/// Why a replay is refused; the message says what to do instead.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("run {run_id} is still running; cancel it or wait for it to end before replaying it")]
    StillRunning { run_id: String },
    #[error("pipeline `{pipeline}` of run {run_id} is no longer loaded")]
    PipelineMissing { run_id: String, pipeline: String },
    #[error(
        "pipeline `{pipeline}` changed since run {run_id}: its fingerprint is {current}, the run's is {stored}; only a run of the loaded version can be replayed"
    )]
    ConfigChanged {
        run_id: String,
        pipeline: String,
        stored: String,
        current: String,
    },
    #[error("`{step}` is not a top-level step of pipeline `{pipeline}`; replay from one of: {}", valid.join(", "))]
    UnknownStep {
        step: String,
        pipeline: String,
        valid: Vec<String>,
    },
    #[error(
        "the steps before `{from_step}` include the human step `{human}`, and approvals are never copied; replay from `{human}` or an earlier step"
    )]
    CopiesHumanStep { from_step: String, human: String },
    #[error("{}", not_reusable(step, run_id, *status))]
    NotReusable {
        step: String,
        run_id: String,
        /// The step's status in the old run; `None` when it has no record.
        status: Option<StepStatus>,
    },
}

impl Refusal {
    /// Whether the request itself names nothing that exists (an unknown step),
    /// rather than conflicting with the state of the run or the pipeline.
    pub fn is_bad_request(&self) -> bool {
        matches!(self, Refusal::UnknownStep { .. })
    }
}

fn not_reusable(step: &str, run_id: &str, status: Option<StepStatus>) -> String {
    match status {
        None => format!(
            "`{step}` has no record in run {run_id} (the run ended before it); replay from `{step}` or an earlier step"
        ),
        Some(s) if matches!(s, StepStatus::Running | StepStatus::Waiting) => format!(
            "`{step}` did not finish in run {run_id} (it was left {s}); replay from `{step}` or an earlier step"
        ),
        Some(s) => format!(
            "`{step}` ended run {run_id} ({s}), so there is nothing after it to continue from; replay from `{step}` or an earlier step"
        ),
    }
}

/// What the new run copies.
#[derive(Debug, Clone, PartialEq)]
pub struct Copy {
    /// The names of the top-level entries copied, in pipeline order.
    pub reused: Vec<String>,
    /// The old run's rows of those entries and of all their sub-paths, as they were.
    pub records: Vec<StepRecord>,
    /// What those rows used: the new run's totals and budget start here.
    pub usage: Usage,
}

impl Copy {
    /// Whether `path` (a step record's or a journal row's) belongs to a copied entry.
    pub fn covers(&self, path: &str) -> bool {
        self.reused.iter().any(|name| within(path, name))
    }
}

/// Whether `path` is the entry `name` itself or one of its sub-paths.
fn within(path: &str, name: &str) -> bool {
    path.strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Whether a replay of `old` (with its step `records`) from `from_step` is allowed
/// under `pipeline` (the loaded version of its pipeline, if any), and what it copies.
pub fn decide(
    pipeline: Option<&Pipeline>,
    old: &RunRecord,
    records: &[StepRecord],
    from_step: &str,
) -> Result<Copy, Refusal> {
    if old.status == RunStatus::Running {
        return Err(Refusal::StillRunning {
            run_id: old.id.clone(),
        });
    }
    let Some(pipeline) = pipeline else {
        return Err(Refusal::PipelineMissing {
            run_id: old.id.clone(),
            pipeline: old.pipeline_name.clone(),
        });
    };
    if pipeline.fingerprint != old.config_fingerprint {
        return Err(Refusal::ConfigChanged {
            run_id: old.id.clone(),
            pipeline: pipeline.name.clone(),
            stored: old.config_fingerprint.clone(),
            current: pipeline.fingerprint.clone(),
        });
    }
    let Some(at) = pipeline.steps.iter().position(|e| e.name() == from_step) else {
        return Err(Refusal::UnknownStep {
            step: from_step.to_string(),
            pipeline: pipeline.name.clone(),
            valid: pipeline
                .steps
                .iter()
                .map(|e| e.name().to_string())
                .collect(),
        });
    };
    let copied = &pipeline.steps[..at];
    if let Some(human) = copied.iter().find(|e| asks_human(e)) {
        return Err(Refusal::CopiesHumanStep {
            from_step: from_step.to_string(),
            human: human.name().to_string(),
        });
    }
    let reused: Vec<String> = copied.iter().map(|e| e.name().to_string()).collect();
    let records: Vec<StepRecord> = records
        .iter()
        .filter(|r| reused.iter().any(|name| within(&r.step_path, name)))
        .cloned()
        .collect();
    // What a resume would do with exactly these rows: each copied entry must be kept.
    let planned = plan::plan(pipeline, &records);
    for (entry, unit) in copied.iter().zip(&planned.units) {
        if !matches!(unit, UnitPlan::Kept { .. }) {
            let status = records
                .iter()
                .find(|r| r.step_path == entry.name())
                .map(|r| r.status);
            return Err(Refusal::NotReusable {
                step: entry.name().to_string(),
                run_id: old.id.clone(),
                status,
            });
        }
    }
    Ok(Copy {
        reused,
        records,
        usage: planned.usage,
    })
}

fn asks_human(entry: &Entry) -> bool {
    entry.asks_human()
}

/// A copied step row as the new run's: only the run changes. Its idempotency key
/// stays the one its effect was made under, in the old run.
pub fn rebase_step(r: &StepRecord, new_run_id: &str) -> StepRecord {
    StepRecord {
        run_id: new_run_id.to_string(),
        ..r.clone()
    }
}

/// A copied agent journal as the new run's. A tool call's effect key is unique
/// across the store, so the copy gets the new run's key for the same position
/// (`run::journal::effect_key`); the copied call is never run again under it.
pub fn rebase_journal(j: &StepJournal, new_run_id: &str) -> StepJournal {
    let run_id = new_run_id.to_string();
    StepJournal {
        run_id: run_id.clone(),
        step_path: j.step_path.clone(),
        turns: j
            .turns
            .iter()
            .map(|t| crate::store::TurnRecord {
                run_id: run_id.clone(),
                ..t.clone()
            })
            .collect(),
        calls: j
            .calls
            .iter()
            .map(|c| crate::store::ToolCallRecord {
                run_id: run_id.clone(),
                effect_key: super::journal::effect_key(
                    new_run_id,
                    &c.step_path,
                    c.iteration,
                    c.turn,
                    c.call_index,
                ),
                ..c.clone()
            })
            .collect(),
        delegations: j
            .delegations
            .iter()
            .map(|d| crate::store::DelegationRecord {
                run_id: run_id.clone(),
                ..d.clone()
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::StepKind;

    use crate::run::test_support::pipeline;

    /// `a`, a parallel group `g` (x, y), a fan-out `fo`, a human step `ok`, then `h`.
    const SHAPES: &str = "name: p\ntrigger: {}\nsteps:\n  - {name: a, executor: mock}\n  - parallel:\n      name: g\n      steps:\n        - {name: x, executor: mock}\n        - {name: y, executor: mock}\n  - fan_out: {name: fo, over: '[1, 2]', executor: mock}\n  - {name: ok, executor: human, prompt_template: go?}\n  - {name: h, executor: mock}\n";

    fn rec(path: &str, status: &str) -> StepRecord {
        StepRecord {
            run_id: "old".into(),
            step_path: path.into(),
            step_index: 0,
            kind: if path.contains('/') {
                StepKind::Branch
            } else {
                StepKind::Step
            },
            executor: "mock".into(),
            agent: None,
            status: StepStatus::parse(status).expect("a step status"),
            attempts: 1,
            iteration: 1,
            idempotency_key: format!("old:{path}:1"),
            started_at: 0,
            finished_at: Some(1),
            duration_ms: Some(1),
            primary_confidence: None,
            effective_confidence: None,
            output_json: Some(format!(r#"{{"confidence":0.9,"summary":"{path}"}}"#)),
            error: None,
            input_tokens: 10,
            output_tokens: 1,
            cost_usd: Some(0.5),
            items_json: (path == "fo").then(|| "[1, 2]".to_string()),
        }
    }

    /// Every entry of SHAPES finished, the human step approved.
    fn finished() -> Vec<StepRecord> {
        ["a", "g", "g/x", "g/y", "fo", "fo/0", "fo/1", "ok", "h"]
            .iter()
            .map(|p| rec(p, "completed"))
            .collect()
    }

    fn old_run(status: RunStatus, fingerprint: &str) -> RunRecord {
        RunRecord {
            id: "old".into(),
            pipeline_name: "p".into(),
            status,
            source: "generic".into(),
            team: None,
            stage: "production".into(),
            triggered_at: 0,
            completed_at: Some(1),
            resumed_at: None,
            resume_count: 0,
            config_fingerprint: fingerprint.into(),
            parent_run_id: None,
            parent_step_path: None,
            dedup_fingerprint: None,
            context_json: "{}".into(),
            payload_json: "{}".into(),
            tokens_used: 0,
            cost_usd: 0.0,
            terminal_step: None,
            reason: None,
            final_output_json: None,
            replay_of: None,
        }
    }

    /// The copied paths, or the refusal's message.
    fn check(
        loaded: bool,
        status: RunStatus,
        same_fingerprint: bool,
        records: &[StepRecord],
        from_step: &str,
        expected: Result<&[&str], &str>,
    ) {
        let p = pipeline(SHAPES);
        let fingerprint = if same_fingerprint {
            p.fingerprint.clone()
        } else {
            "0ld".to_string()
        };
        let old = old_run(status, &fingerprint);
        let got = decide(loaded.then_some(&*p), &old, records, from_step);
        match (got, expected) {
            (Ok(copy), Ok(paths)) => {
                let got: Vec<&str> = copy.records.iter().map(|r| r.step_path.as_str()).collect();
                assert_eq!(got, paths, "copied rows from {from_step}");
                for r in &copy.records {
                    assert!(copy.covers(&r.step_path));
                }
            }
            (Err(refusal), Err(want)) => {
                let msg = refusal.to_string();
                assert!(msg.contains(want), "{from_step}: {msg:?} lacks {want:?}");
            }
            (got, want) => panic!("{from_step}: got {got:?}, wanted {want:?}"),
        }
    }

    #[test]
    fn entries_before_from_step_are_copied_with_their_sub_paths() {
        let all = finished();
        let ok = RunStatus::Completed;
        check(true, ok, true, &all, "a", Ok(&[]));
        check(true, ok, true, &all, "g", Ok(&["a"]));
        check(true, ok, true, &all, "fo", Ok(&["a", "g", "g/x", "g/y"]));
        check(
            true,
            ok,
            true,
            &all,
            "ok",
            Ok(&["a", "g", "g/x", "g/y", "fo", "fo/0", "fo/1"]),
        );
        // Any ending of the old run may be replayed, as long as the copy is whole.
        let failed = RunStatus::Failed;
        check(
            true,
            failed,
            true,
            &all[..4],
            "fo",
            Ok(&["a", "g", "g/x", "g/y"]),
        );
        check(true, RunStatus::Interrupted, true, &all, "g", Ok(&["a"]));
    }

    #[test]
    fn refusals_say_what_to_do() {
        let all = finished();
        let ok = RunStatus::Completed;
        check(
            true,
            RunStatus::Running,
            true,
            &all,
            "g",
            Err("still running"),
        );
        check(false, ok, true, &all, "g", Err("no longer loaded"));
        check(true, ok, false, &all, "g", Err("the run's is 0ld"));
        check(
            true,
            ok,
            true,
            &all,
            "g/x",
            Err("replay from one of: a, g, fo, ok, h"),
        );
        check(true, ok, true, &all, "nope", Err("not a top-level step"));
        // The human step may be replayed, or anything before it; not what follows.
        check(
            true,
            ok,
            true,
            &all,
            "h",
            Err("include the human step `ok`, and approvals are never copied; replay from `ok` or an earlier step"),
        );
    }

    #[test]
    fn only_what_a_resume_would_keep_is_copied() {
        let ok = RunStatus::Failed;
        // The old run ended before `fo` ran.
        let early = &finished()[..4];
        check(
            true,
            ok,
            true,
            early,
            "ok",
            Err("`fo` has no record in run old"),
        );
        // `a` ended the old run.
        let mut ended = finished();
        ended[0].status = StepStatus::Escalated;
        check(
            true,
            ok,
            true,
            &ended,
            "g",
            Err("`a` ended run old (escalated)"),
        );
        check(true, ok, true, &ended, "a", Ok(&[]));
        // A group left in flight (an interrupted run) is not whole.
        let mut partial = finished();
        partial[1].status = StepStatus::Running;
        partial.remove(3);
        check(
            true,
            RunStatus::Interrupted,
            true,
            &partial,
            "fo",
            Err("`g` did not finish in run old (it was left running)"),
        );
        // A skipped step is kept, as a resume keeps it.
        let mut skipped = finished();
        skipped[0].status = StepStatus::Skipped;
        check(true, ok, true, &skipped, "g", Ok(&["a"]));
    }

    #[test]
    fn a_group_in_a_copy_with_a_human_branch_is_refused() {
        let yaml = "name: p\ntrigger: {}\nsteps:\n  - parallel:\n      name: g\n      steps:\n        - {name: x, executor: mock}\n        - {name: y, executor: human, prompt_template: go?}\n  - {name: h, executor: mock}\n";
        let p = pipeline(yaml);
        let old = old_run(RunStatus::Completed, &p.fingerprint);
        let got = decide(Some(&*p), &old, &[], "h").unwrap_err();
        assert!(
            matches!(got, Refusal::CopiesHumanStep { ref human, .. } if human == "g"),
            "{got:?}"
        );
        assert!(!got.is_bad_request());
        let unknown = decide(Some(&*p), &old, &[], "x").unwrap_err();
        assert!(unknown.is_bad_request());
    }

    #[test]
    fn sub_paths_belong_to_their_entry_only() {
        let copy = Copy {
            reused: vec!["a".into(), "g".into()],
            records: Vec::new(),
            usage: Usage::default(),
        };
        for (path, covered) in [
            ("a", true),
            ("g/x", true),
            ("a/delegate/0123", true),
            ("ab", false),
            ("gx/y", false),
            ("h", false),
        ] {
            assert_eq!(copy.covers(path), covered, "{path}");
        }
    }

    #[test]
    fn rebased_rows_belong_to_the_new_run() {
        let r = rebase_step(&rec("a", "completed"), "new");
        assert_eq!(r.run_id, "new");
        assert_eq!(
            r.idempotency_key, "old:a:1",
            "the key its effect was made under"
        );
        let call = crate::store::ToolCallRecord {
            run_id: "old".into(),
            step_path: "s".into(),
            iteration: 1,
            turn: 2,
            call_index: 3,
            call_id: "c".into(),
            tool: "t".into(),
            arguments_json: "{}".into(),
            effect: crate::domain::ToolEffect::Read,
            effect_key: "old:s:1:2:3".into(),
            status: crate::domain::ToolCallStatus::Completed,
            attempt: 1,
            result_json: None,
            approval_token: None,
            approval_deadline: None,
            decided_by: None,
            started_at: 0,
            finished_at: None,
            duration_ms: None,
        };
        let j = StepJournal {
            run_id: "old".into(),
            step_path: "s".into(),
            calls: vec![call],
            ..StepJournal::default()
        };
        let j = rebase_journal(&j, "new");
        assert_eq!(j.calls[0].run_id, "new");
        assert_eq!(j.calls[0].effect_key, "new:s:1:2:3");
    }
}
