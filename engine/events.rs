//! The run-log event catalogue: every event a run's log can hold, with its name,
//! level and fields, declared once.
//!
//! The runner emits events only by building an [`Event`] and turning it into a
//! store write with [`Event::write`]; no event name is written anywhere else. The
//! fields are typed: a variant's fields, in declaration order, are the event's
//! `fields_json` object, so the JSON the API returns is exactly what the variant
//! holds. A few names are shared by two variants whose fields differ (for example
//! `branch_failed` for a failed branch and for a group that timed out); each variant
//! is one row of the table in `docs/run-log.md`, and a test fails when that table
//! and [`CATALOGUE`] disagree. The message is free text chosen by the emitter.

use serde::Serialize;
use serde_json::Value;

use crate::domain::{ApprovalStatus, Level, RunStatus, StepStatus};
use crate::store::{EventRecord, Write};

/// What the catalogue says of one variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// The Rust variant, for error messages.
    pub variant: &'static str,
    /// The event name, as stored and returned by the API.
    pub name: &'static str,
    /// The levels the variant is logged at; the first unless [`Event::level`]
    /// says otherwise for this event.
    pub levels: &'static [Level],
    /// The keys of its fields object, in order.
    pub fields: &'static [&'static str],
}

/// Declares the events: the enum, its metadata table and its name lookup.
macro_rules! catalogue {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident = $name:literal [$($level:ident),+] {
            $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)?
        }
    )+) => {
        /// One run-log event with its fields.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(untagged)]
        pub enum Event {
            $(
                $(#[doc = $doc])*
                $variant { $($(#[$fmeta])* $field: $ty),* },
            )+
        }

        /// Every variant, in declaration order.
        pub const CATALOGUE: &[Spec] = &[$(
            Spec {
                variant: stringify!($variant),
                name: $name,
                levels: &[$(Level::$level),+],
                fields: &[$(stringify!($field)),*],
            },
        )+];

        impl Event {
            /// This event's row of the catalogue.
            pub fn spec(&self) -> &'static Spec {
                match self {
                    $(Event::$variant { .. } => &Spec {
                        variant: stringify!($variant),
                        name: $name,
                        levels: &[$(Level::$level),+],
                        fields: &[$(stringify!($field)),*],
                    },)+
                }
            }
        }
    };
}

catalogue! {
    /// A run was created (its first commit).
    RunStarted = "run_started" [Info] {
        pipeline: String,
        source: String,
        config_fingerprint: String,
        parent_run_id: Option<String>,
        /// A replay (`POST /runs/{id}/replay`): the run it replays; left out of
        /// every other run's event.
        #[serde(skip_serializing_if = "Option::is_none")]
        replay_of: Option<String>,
        /// A replay: who asked for it (the operator, or the body's `by` without
        /// auth); left out when nobody is known.
        #[serde(skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    }
    /// The run reached a terminal status. Info when it ended well (`completed`,
    /// `stopped`), warn otherwise.
    RunFinished = "run_finished" [Info, Warn] {
        status: RunStatus,
        terminal_step: Option<String>,
        reason: Option<String>,
    }
    /// The run was failed because the store could not record its progress.
    RunFailedUnrecorded = "run_finished" [Error] {
        status: RunStatus,
        terminal_step: Option<String>,
        reason: String,
    }
    /// The run was resumed after a restart.
    RunResumed = "run_resumed" [Warn] {
        steps_skipped: usize,
        branches_skipped: usize,
        in_flight: Vec<String>,
        on_interrupted: String,
        resume_count: u32,
        /// On a shared store: the replica that drove the run before (absent when
        /// this replica's own earlier drive, or nobody, held it).
        #[serde(skip_serializing_if = "Option::is_none")]
        from_replica: Option<String>,
        /// On a shared store: the replica driving it now.
        #[serde(skip_serializing_if = "Option::is_none")]
        replica: Option<String>,
    }
    /// The run was not resumed after a restart (`reason`: `pipeline_missing`,
    /// `not_durable`, `config_changed`, `max_age_exceeded`,
    /// `resume_attempts_exhausted`).
    RunInterrupted = "run_interrupted" [Warn] {
        reason: String,
    }
    /// A cancel took effect at a step boundary.
    RunCancelledAtBoundary = "run_cancelled" [Warn] {
        before_step: String,
        by: Option<String>,
    }
    /// A cancel arrived while this step ran; the step's result was recorded.
    RunCancelledDuringStep = "run_cancelled" [Warn] {
        step: String,
        by: Option<String>,
    }
    /// A `vectorstep run` process was stopped by a signal; the steps in flight
    /// were recorded `failed`.
    RunCancelledBySignal = "run_cancelled" [Warn] {
        signal: String,
        in_flight: Vec<String>,
    }
    /// The pipeline's steps changed while the run was down.
    ResumeSkippedConfigChanged = "resume_skipped_config_changed" [Warn] {
        stored_fingerprint: String,
        current_fingerprint: String,
    }
    /// The run is older than `max_resume_age_seconds`.
    ResumeSkippedMaxAgeExceeded = "resume_skipped_max_age_exceeded" [Warn] {
        age_seconds: f64,
        max_resume_age_seconds: u64,
    }
    /// The run was resumed `max_resume_attempts` times already.
    ResumeAttemptsExhausted = "resume_attempts_exhausted" [Warn] {
        resume_count: u32,
        max_resume_attempts: u32,
    }
    /// A step in flight at the restart was escalated (`on_interrupted: escalate`).
    ResumeStepEscalated = "resume_step_escalated" [Warn] {
        step: String,
    }
    /// A group in flight at the restart was escalated; `branches` were in flight.
    ResumeGroupEscalated = "resume_step_escalated" [Warn] {
        step: String,
        branches: Vec<String>,
    }
    /// A step's executor is about to be called.
    StepStarted = "step_started" [Info] {
        step: String,
        executor: String,
        agent: Option<String>,
        attempt: u32,
        rerun_after_restart: bool,
    }
    /// A step passed its gate.
    StepCompleted = "step_completed" [Info] {
        step: String,
        confidence: f64,
        threshold: f64,
        tokens: u64,
        cost_usd: Option<f64>,
    }
    /// A step said `proceed: false`.
    StepStopped = "step_stopped" [Warn] {
        step: String,
        confidence: f64,
        threshold: f64,
        tokens: u64,
        cost_usd: Option<f64>,
    }
    /// A step's confidence was below its threshold with `on_low_confidence: escalate`.
    StepEscalated = "step_escalated" [Warn] {
        step: String,
        confidence: f64,
        threshold: f64,
        tokens: u64,
        cost_usd: Option<f64>,
    }
    /// A step's confidence was below its threshold with `on_low_confidence: abort`.
    StepAborted = "step_aborted" [Warn] {
        step: String,
        confidence: f64,
        threshold: f64,
        tokens: u64,
        cost_usd: Option<f64>,
    }
    /// A parallel group or fan-out settled as stopped.
    UnitStopped = "step_stopped" [Warn] {
        step: String,
        confidence: f64,
    }
    /// A parallel group or fan-out settled as escalated, or a step in flight at the
    /// restart was escalated without running (`confidence` 0).
    UnitEscalated = "step_escalated" [Warn] {
        step: String,
        confidence: f64,
    }
    /// A parallel group or fan-out settled as aborted.
    UnitAborted = "step_aborted" [Warn] {
        step: String,
        confidence: f64,
    }
    /// A parallel group or fan-out settled as failed.
    UnitFailed = "step_failed" [Warn] {
        step: String,
        confidence: f64,
    }
    /// A step's last attempt failed.
    StepFailed = "step_failed" [Error] {
        step: String,
        error: String,
        attempt: u32,
    }
    /// A step failed and has `on_failure: continue`.
    StepFailedContinuing = "step_failed_continuing" [Warn] {
        step: String,
        error: Option<String>,
    }
    /// A step's `when` was false (info) or could not be evaluated (warn, with the error).
    StepSkipped = "step_skipped" [Info, Warn] {
        step: String,
        when_error: Option<String>,
    }
    /// A replay copied this top-level entry's records (its branches, fan-out
    /// items and agent journal included) from `from_run`; it does not run again.
    StepReused = "step_reused" [Info] {
        step: String,
        from_run: String,
    }
    /// A step's attempt failed and is tried again after `delay_seconds`.
    StepRetrying = "step_retrying" [Warn] {
        step: String,
        error: String,
        attempt: u32,
        delay_seconds: f64,
    }
    /// A looping step starts an iteration after the first.
    LoopIteration = "loop_iteration" [Info] {
        step: String,
        iteration: u32,
        max_iterations: u32,
    }
    /// A looping step reached its `loop_until` confidence.
    LoopConverged = "loop_converged" [Info] {
        step: String,
        iterations: u32,
        confidence: f64,
    }
    /// A looping step used all its iterations without reaching the confidence.
    LoopExhausted = "loop_exhausted" [Info] {
        step: String,
        iterations: u32,
        confidence: f64,
    }
    /// A parallel group started its branches.
    ParallelGroupStarted = "parallel_group_started" [Info] {
        group: String,
        branches: usize,
    }
    /// A parallel group joined its branches. Info when the join completed, warn
    /// otherwise.
    ParallelGroupCompleted = "parallel_group_completed" [Info, Warn] {
        step: String,
        group: String,
        confidence: f64,
        completed: usize,
        total: usize,
        status: StepStatus,
    }
    /// A branch of a group or fan-out finished.
    BranchCompleted = "branch_completed" [Info] {
        branch: String,
        group: String,
        confidence: f64,
        error: Option<String>,
    }
    /// A branch of a group or fan-out failed.
    BranchFailed = "branch_failed" [Warn] {
        branch: String,
        group: String,
        confidence: f64,
        error: Option<String>,
    }
    /// A group or fan-out ran out of time; its branches still running were failed.
    GroupTimedOut = "branch_failed" [Error] {
        group: String,
        reason: String,
    }
    /// A fan-out recorded its item list and started its branches.
    FanOutStarted = "fan_out_started" [Info] {
        step: String,
        items: usize,
    }
    /// A fan-out joined its branches. Info when the join completed, warn otherwise.
    FanOutCompleted = "fan_out_completed" [Info, Warn] {
        step: String,
        group: String,
        confidence: f64,
        completed: usize,
        total: usize,
        status: StepStatus,
    }
    /// A fan-out had no items and `on_empty: complete`.
    FanOutEmpty = "fan_out_empty" [Warn] {
        step: String,
    }
    /// A fan-out had no items and `on_empty: abort`; the step failed.
    FanOutEmptyAborted = "fan_out_empty" [Error] {
        step: String,
    }
    /// A fan-out had no items and `on_empty: skip`.
    FanOutSkipped = "fan_out_skipped" [Warn] {
        step: String,
    }
    /// A fan-out's `over` could not be resolved or had more than `max_items` items.
    FanOutFailed = "fan_out_failed" [Error] {
        step: String,
    }
    /// The run's token or cost budget was exceeded after this step.
    BudgetExceeded = "budget_exceeded" [Warn] {
        step: String,
        tokens_used: u64,
        cost_usd: f64,
    }
    /// A human step asked for approval.
    ApprovalRequested = "approval_requested" [Info] {
        step: String,
        token: String,
        deadline_at: String,
        url: String,
    }
    /// A human step's wait was re-armed after a restart (or found decided).
    ApprovalRearmed = "approval_rearmed" [Warn] {
        step: String,
        token: String,
        deadline_at: String,
        status: ApprovalStatus,
    }
    /// An approval was decided; `via` and `client` say through what and from where.
    ApprovalDecided = "approval_decided" [Info] {
        step: String,
        token: String,
        decision: ApprovalStatus,
        by: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        via: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        client: Option<String>,
    }
    /// An approval passed its deadline (auto-approved in the testing stage).
    ApprovalTimedOut = "approval_timed_out" [Warn] {
        step: String,
        token: String,
        auto_approved: bool,
    }
    /// An agent turn's reply was recorded (before any of its tool calls ran).
    AgentTurnCompleted = "agent_turn_completed" [Info] {
        step: String,
        turn: u32,
        tool_calls: u32,
        input_tokens: u64,
        output_tokens: u64,
    }
    /// A resumed agent step reused its recorded turns instead of asking the model.
    AgentTurnReused = "agent_turn_reused" [Info] {
        step: String,
        turns: u32,
    }
    /// A tool call was recorded as started, just before it runs.
    ToolCallStarted = "tool_call_started" [Info] {
        step: String,
        turn: u32,
        call_index: u32,
        tool: String,
        effect_key: String,
        attempt: u32,
    }
    /// A tool call returned its result.
    ToolCallCompleted = "tool_call_completed" [Info] {
        step: String,
        turn: u32,
        call_index: u32,
        tool: String,
        duration_ms: u64,
    }
    /// A tool call failed or was refused; the error went back to the model.
    ToolCallFailed = "tool_call_failed" [Warn] {
        step: String,
        turn: u32,
        call_index: u32,
        tool: String,
        error: String,
    }
    /// A resumed agent step reused a tool call's recorded result.
    ToolCallReused = "tool_call_reused" [Info] {
        step: String,
        turn: u32,
        call_index: u32,
        tool: String,
    }
    /// A tool call that needs approval was put to a human.
    ToolApprovalRequested = "tool_approval_requested" [Warn] {
        step: String,
        turn: u32,
        call_index: u32,
        tool: String,
        token: String,
        deadline_at: String,
    }
    /// A human decided a tool call's approval.
    ToolApprovalDecided = "tool_approval_decided" [Info] {
        step: String,
        turn: u32,
        call_index: u32,
        tool: String,
        approved: bool,
        by: String,
    }
    /// Nobody decided a tool call's approval in time; the model is told so.
    ToolApprovalTimedOut = "tool_approval_timed_out" [Warn] {
        step: String,
        turn: u32,
        call_index: u32,
        tool: String,
    }
    /// A sub-agent answered a delegation.
    DelegationCompleted = "delegation_completed" [Info] {
        step: String,
        agent: String,
        key: String,
    }
    /// A resumed step reused a delegation's recorded answer.
    DelegationReused = "delegation_reused" [Info] {
        step: String,
        agent: String,
        key: String,
    }
    /// A notification was delivered.
    NotificationSent = "notification_sent" [Info] {
        action: String,
        channel: String,
        notification_id: String,
        error: Option<String>,
    }
    /// A notification could not be delivered and is not tried again.
    NotificationFailed = "notification_failed" [Warn] {
        action: String,
        channel: String,
        notification_id: String,
        error: Option<String>,
    }
    /// A step's `on_failure.webhook` was delivered.
    StepFailureWebhookSent = "step_failure_webhook_sent" [Info] {
        action: String,
        channel: String,
        notification_id: String,
        error: Option<String>,
    }
    /// A step's `on_failure.webhook` could not be delivered.
    StepFailureWebhookFailed = "step_failure_webhook_failed" [Warn] {
        action: String,
        channel: String,
        notification_id: String,
        error: Option<String>,
    }
}

impl Event {
    /// The event name, as stored and returned by the API.
    pub fn name(&self) -> &'static str {
        self.spec().name
    }

    /// The level this event is logged at: the catalogue's level, or for the
    /// events listed with two, the one these fields call for.
    pub fn level(&self) -> Level {
        match self {
            Event::RunFinished { status, .. } => {
                if status.is_success() {
                    Level::Info
                } else {
                    Level::Warn
                }
            }
            Event::StepSkipped { when_error, .. } => {
                if when_error.is_some() {
                    Level::Warn
                } else {
                    Level::Info
                }
            }
            Event::ParallelGroupCompleted { status, .. }
            | Event::FanOutCompleted { status, .. } => {
                if *status == StepStatus::Completed {
                    Level::Info
                } else {
                    Level::Warn
                }
            }
            _ => self.spec().levels[0],
        }
    }

    /// The fields object, as stored in `fields_json`.
    pub fn fields(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The store write that appends this event to the run's log.
    pub fn write(&self, run_id: &str, ts: i64, msg: impl Into<String>) -> Write {
        Write::AppendEvent(self.record(run_id, ts, msg))
    }

    /// The row this event is stored as.
    pub fn record(&self, run_id: &str, ts: i64, msg: impl Into<String>) -> EventRecord {
        EventRecord {
            id: 0,
            run_id: run_id.to_string(),
            ts,
            level: self.level().to_string(),
            event: self.name().to_string(),
            msg: msg.into(),
            fields_json: serde_json::to_string(self).unwrap_or_else(|_| "{}".into()),
        }
    }

    /// The event for a step that passed its gate with `status` (one of `completed`,
    /// `stopped`, `escalated`, `aborted`; anything else is reported as escalated,
    /// which the gate never returns).
    pub fn step_gated(
        status: StepStatus,
        step: String,
        confidence: f64,
        threshold: f64,
        tokens: u64,
        cost_usd: Option<f64>,
    ) -> Event {
        match status {
            StepStatus::Completed => Event::StepCompleted {
                step,
                confidence,
                threshold,
                tokens,
                cost_usd,
            },
            StepStatus::Stopped => Event::StepStopped {
                step,
                confidence,
                threshold,
                tokens,
                cost_usd,
            },
            StepStatus::Aborted => Event::StepAborted {
                step,
                confidence,
                threshold,
                tokens,
                cost_usd,
            },
            _ => Event::StepEscalated {
                step,
                confidence,
                threshold,
                tokens,
                cost_usd,
            },
        }
    }

    /// The event for a group or fan-out that settled with `status` other than
    /// `completed`; `None` for a status that needs none.
    pub fn group_settled(status: StepStatus, step: String, confidence: f64) -> Option<Event> {
        Some(match status {
            StepStatus::Stopped => Event::UnitStopped { step, confidence },
            StepStatus::Escalated => Event::UnitEscalated { step, confidence },
            StepStatus::Aborted => Event::UnitAborted { step, confidence },
            StepStatus::Failed => Event::UnitFailed { step, confidence },
            _ => return None,
        })
    }
}

/// The name of the event of `variant` (`"RunResumed"` → `run_resumed`), for
/// code that reads the log back (the UI's resume history).
pub fn name_of_variant(variant: &str) -> Option<&'static str> {
    CATALOGUE
        .iter()
        .find(|s| s.variant == variant)
        .map(|s| s.name)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// One row of a table: (event, levels, fields), each as it is written.
    type Row = (String, Vec<String>, Vec<String>);

    /// The rows of the event table in `docs/run-log.md`: lines of the form
    /// ``| `name` | level, level | `field`, `field` | what it means |``.
    fn documented() -> Vec<Row> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/run-log.md");
        let text = std::fs::read_to_string(path).expect("docs/run-log.md is readable");
        let words = |cell: &str| -> Vec<String> {
            cell.split(',')
                .map(|w| w.trim().trim_matches('`').to_string())
                .filter(|w| !w.is_empty() && w != "-")
                .collect()
        };
        text.lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
                assert!(cells.len() >= 3, "a row with fewer than 3 cells: {l}");
                (
                    cells[0].trim_matches('`').to_string(),
                    words(cells[1]),
                    words(cells[2]),
                )
            })
            .collect()
    }

    fn catalogued() -> Vec<Row> {
        CATALOGUE
            .iter()
            .map(|s| {
                (
                    s.name.to_string(),
                    s.levels.iter().map(|l| l.to_string()).collect(),
                    s.fields.iter().map(|f| f.to_string()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn the_documented_table_is_the_catalogue() {
        let docs: BTreeSet<Row> = documented().into_iter().collect();
        let code: BTreeSet<Row> = catalogued().into_iter().collect();
        let missing: Vec<_> = code.difference(&docs).collect();
        let extra: Vec<_> = docs.difference(&code).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "docs/run-log.md and engine/events.rs disagree.\n\
             in the catalogue but not documented (add these rows): {missing:#?}\n\
             documented but not in the catalogue (remove or fix these rows): {extra:#?}"
        );
        let rows = documented();
        let unique: BTreeSet<&Row> = rows.iter().collect();
        assert_eq!(
            unique.len(),
            rows.len(),
            "a row of docs/run-log.md is there twice"
        );
    }

    /// No event name is written outside this file (the same check as grepping
    /// `engine/` for each name in quotes). `resume_attempts_exhausted` is also the
    /// sweep's interruption reason, a metric label that happens to share the word.
    #[test]
    fn no_event_name_literal_outside_the_catalogue() {
        let allowed = [("runner/sweep.rs", "resume_attempts_exhausted")];
        let mut found = Vec::new();
        for (file, code) in crate::domain::tests::sources("") {
            if file == "events.rs" {
                continue;
            }
            for spec in CATALOGUE {
                let quoted = format!("\"{}\"", spec.name);
                if code.contains(&quoted) && !allowed.contains(&(file.as_str(), spec.name)) {
                    found.push(format!("{file}: {quoted}"));
                }
            }
        }
        found.dedup();
        assert!(
            found.is_empty(),
            "event names written outside engine/events.rs; emit an Event instead: {found:#?}"
        );
    }

    #[test]
    fn every_variant_has_its_own_row() {
        let variants: BTreeSet<_> = CATALOGUE.iter().map(|s| s.variant).collect();
        assert_eq!(variants.len(), CATALOGUE.len());
        let rows: BTreeSet<_> = catalogued().into_iter().collect();
        assert_eq!(rows.len(), CATALOGUE.len(), "two variants are the same row");
    }

    /// The stored fields are the variant's fields, in order, with an absent
    /// optional `via`/`client` left out rather than null.
    #[test]
    fn fields_are_the_variants_fields() {
        let e = Event::RunCancelledAtBoundary {
            before_step: "b".into(),
            by: None,
        };
        assert_eq!(
            e.record("r", 1, "m").fields_json,
            r#"{"before_step":"b","by":null}"#
        );
        assert_eq!((e.name(), e.level()), ("run_cancelled", Level::Warn));
        let d = Event::ApprovalDecided {
            step: "s".into(),
            token: "t".into(),
            decision: ApprovalStatus::Approved,
            by: "ann".into(),
            via: None,
            client: Some("127.0.0.1".into()),
        };
        assert_eq!(
            d.fields(),
            serde_json::json!({"step": "s", "token": "t", "decision": "approved", "by": "ann", "client": "127.0.0.1"})
        );
    }

    #[test]
    fn levels_follow_the_fields() {
        let finished = |status| Event::RunFinished {
            status,
            terminal_step: None,
            reason: None,
        };
        assert_eq!(finished(RunStatus::Completed).level(), Level::Info);
        assert_eq!(finished(RunStatus::Stopped).level(), Level::Info);
        assert_eq!(finished(RunStatus::Failed).level(), Level::Warn);
        let skipped = |when_error| Event::StepSkipped {
            step: "s".into(),
            when_error,
        };
        assert_eq!(skipped(None).level(), Level::Info);
        assert_eq!(skipped(Some("e".into())).level(), Level::Warn);
        for spec in CATALOGUE {
            assert!(!spec.levels.is_empty(), "{} has no level", spec.variant);
        }
    }
}
