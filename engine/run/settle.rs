//! How a finished unit settles the run, and what a cancel or a drain does at a
//! step boundary. Pure: the driver (`runner::drive`) performs what these return.

use crate::domain::{RunStatus, StepStatus};
use crate::pipeline::Gate;

/// A finished unit, as far as settling the run is concerned.
#[derive(Debug, Clone)]
pub struct UnitEnd<'a> {
    pub status: StepStatus,
    /// The unit's error (a failed executor call, a group timeout); none for a
    /// unit that produced an output, whatever the gate made of it.
    pub error: Option<&'a str>,
    pub summary: &'a str,
    pub confidence: f64,
    pub gate: &'a Gate,
    /// A plain step (only plain steps have `on_failure`).
    pub is_step: bool,
    /// `on_failure: continue` of a plain step.
    pub continue_on_failure: bool,
    /// The run's budget message when its usage, this unit's included, breaks it.
    pub budget_exceeded: Option<String>,
}

/// What the run does after a unit.
#[derive(Debug, Clone, PartialEq)]
pub enum Settle {
    /// The run goes on; the unit's output becomes the run's final output and its
    /// writes ride in the next commit.
    Continue,
    /// A failed step with `on_failure: continue`: the run goes on, but the unit is
    /// committed now and its failure webhook delivered now, not at the run's end.
    Deliver,
    /// The unit ends the run.
    Finish(Ending),
}

/// How a unit ends the run: committed with the run's terminal status, with the
/// notification it owes.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    pub status: RunStatus,
    /// The run's `reason`.
    pub reason: String,
    /// The `notifications:` action owed (see [`notification`]).
    pub notification: String,
    /// `escalation_reason` in the notification's context; none for a budget.
    pub escalation_reason: Option<String>,
    /// The budget's message: logged as `budget_exceeded` and used as the
    /// notification's `step_summary`.
    pub budget: Option<String>,
    /// The notification's context carries the unit's `proceed_reason`.
    pub proceed_reason: bool,
    /// The step's `on_failure` webhook is owed as well.
    pub failure_webhook: bool,
    /// The unit's output becomes the run's final output.
    pub keep_output: bool,
}

/// The one mapping from the status a unit ended the run with to the
/// `notifications:` action it owes: `stopped` for a stop, the gate's `on_abort`
/// for an abort, `escalate` for anything else (escalated, failed).
pub fn notification(status: StepStatus, gate: &Gate) -> String {
    match status {
        StepStatus::Stopped => StepStatus::Stopped.as_str().to_string(),
        StepStatus::Aborted => gate.on_abort.clone(),
        _ => "escalate".to_string(),
    }
}

/// Decides how `unit` settles the run.
pub fn settle(unit: &UnitEnd<'_>) -> Settle {
    match unit.status {
        StepStatus::Completed | StepStatus::Skipped => match &unit.budget_exceeded {
            None => Settle::Continue,
            // A tripped budget owes the pipeline's `notify` notifications.
            Some(msg) => Settle::Finish(Ending {
                status: RunStatus::Aborted,
                reason: msg.clone(),
                notification: "notify".to_string(),
                escalation_reason: None,
                budget: Some(msg.clone()),
                proceed_reason: false,
                failure_webhook: false,
                keep_output: true,
            }),
        },
        StepStatus::Failed if unit.is_step && unit.continue_on_failure => Settle::Deliver,
        status => {
            let low = unit.error.is_none() && unit.confidence < unit.gate.confidence_threshold;
            Settle::Finish(Ending {
                status: status.run_ending(),
                reason: unit.error.unwrap_or(unit.summary).to_string(),
                notification: notification(status, unit.gate),
                escalation_reason: Some(if low {
                    "low_confidence".to_string()
                } else {
                    status.as_str().to_string()
                }),
                budget: None,
                proceed_reason: status == StepStatus::Stopped,
                failure_webhook: status == StepStatus::Failed && unit.is_step,
                keep_output: status == StepStatus::Stopped,
            })
        }
    }
}

/// What the driver does at the boundary before a unit, or right after one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// Run the next unit (or settle the one that just ended).
    Proceed,
    /// The run was cancelled: close it `cancelled`, running nothing more.
    Cancel,
    /// Shutdown: leave the run `running` at this boundary; it resumes on the next
    /// start.
    Drain,
}

/// The boundary before a unit. A unit already recorded as started (`in_flight`,
/// a new run's first step) is past its boundary: a cancel or a drain takes effect
/// after it. A cancel wins over a drain.
pub fn before_unit(cancelled: bool, shutting_down: bool, in_flight: bool) -> Boundary {
    if in_flight {
        Boundary::Proceed
    } else if cancelled {
        Boundary::Cancel
    } else if shutting_down {
        Boundary::Drain
    } else {
        Boundary::Proceed
    }
}

/// The boundary after a unit ended: a cancel that arrived while it ran keeps its
/// record as it ended and runs nothing after it. A drain waits for the next
/// boundary, so the unit settles first.
pub fn after_unit(cancelled: bool) -> Boundary {
    if cancelled {
        Boundary::Cancel
    } else {
        Boundary::Proceed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(on_abort: &str) -> Gate {
        Gate {
            confidence_threshold: 0.75,
            on_low_confidence: crate::pipeline::LowConfidence::Escalate,
            on_abort: on_abort.into(),
        }
    }

    /// A row: the unit's status, error, confidence, (is_step, continue), budget.
    struct Row {
        status: StepStatus,
        error: Option<&'static str>,
        confidence: f64,
        step: (bool, bool),
        budget: Option<&'static str>,
    }

    fn row(status: StepStatus) -> Row {
        Row {
            status,
            error: None,
            confidence: 0.9,
            step: (true, false),
            budget: None,
        }
    }

    fn check(input: Row, expected: Settle) {
        let g = gate("page");
        let unit = UnitEnd {
            status: input.status,
            error: input.error,
            summary: "the summary",
            confidence: input.confidence,
            gate: &g,
            is_step: input.step.0,
            continue_on_failure: input.step.1,
            budget_exceeded: input.budget.map(str::to_string),
        };
        assert_eq!(settle(&unit), expected, "{unit:?}");
    }

    fn ending(status: RunStatus, reason: &str, notification: &str, why: &str) -> Ending {
        Ending {
            status,
            reason: reason.into(),
            notification: notification.into(),
            escalation_reason: Some(why.into()),
            budget: None,
            proceed_reason: false,
            failure_webhook: false,
            keep_output: false,
        }
    }

    #[test]
    fn every_settle_outcome() {
        use StepStatus::*;
        check(row(Completed), Settle::Continue);
        check(row(Skipped), Settle::Continue);
        // A budget is checked only after a unit that let the run go on.
        check(
            Row {
                budget: Some("Token budget exceeded"),
                ..row(Completed)
            },
            Settle::Finish(Ending {
                status: RunStatus::Aborted,
                reason: "Token budget exceeded".into(),
                notification: "notify".into(),
                escalation_reason: None,
                budget: Some("Token budget exceeded".into()),
                proceed_reason: false,
                failure_webhook: false,
                keep_output: true,
            }),
        );
        check(
            Row {
                budget: Some("Cost budget exceeded"),
                ..row(Skipped)
            },
            Settle::Finish(Ending {
                status: RunStatus::Aborted,
                reason: "Cost budget exceeded".into(),
                notification: "notify".into(),
                escalation_reason: None,
                budget: Some("Cost budget exceeded".into()),
                proceed_reason: false,
                failure_webhook: false,
                keep_output: true,
            }),
        );
        check(
            Row {
                budget: Some("ignored"),
                ..row(Escalated)
            },
            Settle::Finish(ending(
                RunStatus::Escalated,
                "the summary",
                "escalate",
                "escalated",
            )),
        );
        // on_failure: continue of a plain step.
        check(
            Row {
                error: Some("boom"),
                step: (true, true),
                ..row(Failed)
            },
            Settle::Deliver,
        );
        // A failed step ends the run with its error and owes its failure webhook.
        check(
            Row {
                error: Some("boom"),
                ..row(Failed)
            },
            Settle::Finish(Ending {
                failure_webhook: true,
                ..ending(RunStatus::Failed, "boom", "escalate", "failed")
            }),
        );
        // A failed group has no on_failure: no webhook, no continue.
        check(
            Row {
                error: Some("timed out"),
                step: (false, true),
                ..row(Failed)
            },
            Settle::Finish(ending(RunStatus::Failed, "timed out", "escalate", "failed")),
        );
        check(
            Row {
                confidence: 0.1,
                ..row(Escalated)
            },
            Settle::Finish(ending(
                RunStatus::Escalated,
                "the summary",
                "escalate",
                "low_confidence",
            )),
        );
        check(
            Row {
                confidence: 0.1,
                ..row(Aborted)
            },
            Settle::Finish(ending(
                RunStatus::Aborted,
                "the summary",
                "page",
                "low_confidence",
            )),
        );
        check(
            row(Aborted),
            Settle::Finish(ending(RunStatus::Aborted, "the summary", "page", "aborted")),
        );
        check(
            row(Stopped),
            Settle::Finish(Ending {
                proceed_reason: true,
                keep_output: true,
                ..ending(RunStatus::Stopped, "the summary", "stopped", "stopped")
            }),
        );
        // An escalation with an error is never "low confidence".
        check(
            Row {
                error: Some("in flight"),
                confidence: 0.0,
                ..row(Escalated)
            },
            Settle::Finish(ending(
                RunStatus::Escalated,
                "in flight",
                "escalate",
                "escalated",
            )),
        );
    }

    #[test]
    fn one_notification_per_status() {
        let g = gate("page");
        let cases = [
            (StepStatus::Stopped, "stopped"),
            (StepStatus::Aborted, "page"),
            (StepStatus::Escalated, "escalate"),
            (StepStatus::Failed, "escalate"),
        ];
        for (status, want) in cases {
            assert_eq!(notification(status, &g), want, "{status}");
        }
    }

    #[test]
    fn boundaries() {
        use Boundary::*;
        let cases = [
            // cancelled, shutting down, in flight -> before, after
            ((false, false, false), Proceed, Proceed),
            ((true, false, false), Cancel, Cancel),
            ((false, true, false), Drain, Proceed),
            ((true, true, false), Cancel, Cancel),
            ((true, true, true), Proceed, Cancel),
            ((false, true, true), Proceed, Proceed),
        ];
        for ((c, s, f), before, after) in cases {
            assert_eq!(before_unit(c, s, f), before, "{c} {s} {f}");
            assert_eq!(after_unit(c), after, "{c}");
        }
    }
}
