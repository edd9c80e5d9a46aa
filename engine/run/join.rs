//! How a parallel group or a fan-out joins its branches. Pure: `runner::group`
//! runs the branches and performs the result.

use crate::domain::StepStatus;
use crate::pipeline::{Gate, Join};

use super::flow;

/// One branch as the join sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Branch {
    /// `(confidence, failed)` once it ended (kept from before a restart or just
    /// run); none for a branch that never reported (a task that ended abnormally).
    pub ended: Option<(f64, bool)>,
    pub weight: f64,
}

/// A group's joined result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Joined {
    pub confidence: f64,
    /// Branches that ended without failing.
    pub completed: usize,
    pub status: StepStatus,
}

/// Joins every branch (a failed or missing branch counts as 0.0) and applies the
/// group's gate. A group's own output always proceeds.
pub fn join_all(strategy: Join, gate: &Gate, branches: &[Branch]) -> Joined {
    let weighted: Vec<(f64, f64)> = branches
        .iter()
        .map(|b| {
            (
                b.ended.map_or(0.0, |e| if e.1 { 0.0 } else { e.0 }),
                b.weight,
            )
        })
        .collect();
    let confidence = flow::join(strategy, &weighted);
    Joined {
        confidence,
        completed: branches
            .iter()
            .filter(|b| matches!(b.ended, Some((_, false))))
            .count(),
        status: flow::gate(confidence, true, gate),
    }
}

/// The confidence of a group escalated on resume: joined over the branches that
/// had ended, 0.0 when none had.
pub fn join_ended(strategy: Join, branches: &[Branch]) -> f64 {
    let weighted: Vec<(f64, f64)> = branches
        .iter()
        .filter_map(|b| b.ended.map(|e| (e.0, b.weight)))
        .collect();
    if weighted.is_empty() {
        0.0
    } else {
        flow::join(strategy, &weighted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::{LowConfidence, OnEmpty};
    use crate::run::flow::{fan_out_items, FanOutItems};
    use serde_json::json;

    fn gate(on_low: LowConfidence) -> Gate {
        Gate {
            confidence_threshold: 0.65,
            on_low_confidence: on_low,
            on_abort: "notify".into(),
        }
    }

    fn ok(c: f64, w: f64) -> Branch {
        Branch {
            ended: Some((c, false)),
            weight: w,
        }
    }

    fn failed(w: f64) -> Branch {
        Branch {
            ended: Some((0.0, true)),
            weight: w,
        }
    }

    fn check(input: (Join, LowConfidence, Vec<Branch>), expected: (f64, usize, StepStatus)) {
        let (strategy, on_low, branches) = input;
        let got = join_all(strategy, &gate(on_low), &branches);
        assert!(
            (got.confidence - expected.0).abs() < 1e-9
                && got.completed == expected.1
                && got.status == expected.2,
            "{strategy:?} {branches:?}: got {got:?}, want {expected:?}"
        );
    }

    #[test]
    fn every_join_strategy() {
        use Join::*;
        use LowConfidence::*;
        use StepStatus::*;
        let three = || vec![ok(0.9, 1.0), ok(0.5, 3.0), ok(0.7, 0.0)];
        check((AllMustPass, Escalate, three()), (0.5, 3, Escalated));
        check((AnyMustPass, Escalate, three()), (0.9, 3, Completed));
        check(
            (WeightedAverage, Escalate, three()),
            ((0.9 + 1.5) / 4.0, 3, Escalated),
        );
        check(
            (WeightedAverage, Proceed, three()),
            ((0.9 + 1.5) / 4.0, 3, Completed),
        );
        check((AllMustPass, Abort, three()), (0.5, 3, Aborted));
        // A failed branch counts as 0.0 and not as completed.
        check(
            (AnyMustPass, Escalate, vec![ok(0.8, 1.0), failed(1.0)]),
            (0.8, 1, Completed),
        );
        check(
            (AllMustPass, Escalate, vec![ok(0.8, 1.0), failed(1.0)]),
            (0.0, 1, Escalated),
        );
        check(
            (WeightedAverage, Escalate, vec![ok(0.8, 1.0), failed(1.0)]),
            (0.4, 1, Escalated),
        );
        // A branch that never reported counts as 0.0 too.
        let lost = Branch {
            ended: None,
            weight: 1.0,
        };
        check((AnyMustPass, Escalate, vec![lost]), (0.0, 0, Escalated));
        // All weights zero: 0.0.
        check(
            (WeightedAverage, Escalate, vec![ok(0.9, 0.0)]),
            (0.0, 1, Escalated),
        );
    }

    #[test]
    fn escalated_groups_join_what_had_ended() {
        let lost = Branch {
            ended: None,
            weight: 1.0,
        };
        assert_eq!(join_ended(Join::AllMustPass, &[lost]), 0.0);
        assert_eq!(join_ended(Join::AllMustPass, &[ok(0.7, 1.0), lost]), 0.7);
        assert_eq!(join_ended(Join::AnyMustPass, &[]), 0.0);
    }

    #[test]
    fn every_on_empty_mode() {
        let cases = [
            (OnEmpty::Skip, FanOutItems::Empty { skipped: true }),
            (OnEmpty::Complete, FanOutItems::Empty { skipped: false }),
            (
                OnEmpty::Abort,
                FanOutItems::Fail {
                    empty: true,
                    reason: "Fan-out 'fo': empty list — on_empty=abort".into(),
                },
            ),
        ];
        for (mode, want) in cases {
            assert_eq!(fan_out_items("fo", vec![], 5, mode), want, "{mode:?}");
            // A non-empty list runs whatever the mode.
            assert_eq!(
                fan_out_items("fo", vec![json!(1)], 5, mode),
                FanOutItems::Run(vec![json!(1)])
            );
        }
    }
}
