//! Every metric name lives here (SPEC 8), so dashboards and code agree. Counters
//! are updated live by the runner and the HTTP layer; with no exporter installed
//! (CLI commands) they cost nothing.

use metrics::{counter, gauge, histogram};

pub const RUNS_STARTED: &str = "vectorstep_runs_started_total";
pub const RUNS_FINISHED: &str = "vectorstep_runs_finished_total";
pub const RUNS_IN_PROGRESS: &str = "vectorstep_runs_in_progress";
pub const RUNS_RESUMED: &str = "vectorstep_runs_resumed_total";
pub const RUNS_ADOPTED: &str = "vectorstep_runs_adopted_total";
pub const RUNS_INTERRUPTED: &str = "vectorstep_runs_interrupted_total";
pub const STEPS: &str = "vectorstep_steps_total";
pub const STEP_DURATION: &str = "vectorstep_step_duration_seconds";
pub const TOKENS: &str = "vectorstep_tokens_total";
pub const COST: &str = "vectorstep_cost_usd_total";
pub const APPROVALS_PENDING: &str = "vectorstep_human_approvals_pending";
pub const APPROVAL_DECISIONS: &str = "vectorstep_human_approval_decisions_total";
pub const WEBHOOKS: &str = "vectorstep_webhooks_total";
pub const NOTIFICATIONS: &str = "vectorstep_notifications_total";
/// Replicas seen alive on a shared (PostgreSQL) store, this one included.
pub const REPLICAS: &str = "vectorstep_replicas";

/// Bucket bounds of `step_duration_seconds`, in seconds: from a 50 ms mock or
/// shell step to an hour-long wait, roughly doubling.
pub const STEP_DURATION_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Every metric with its `# HELP` text (docs/operations.md lists them).
/// Log fields whose value is logged as JSON text ([`json_text`]); the JSON log
/// format embeds them as JSON, so a list is logged as a list.
pub const JSON_FIELDS: &[&str] = &["labels", "in_flight", "added", "changed", "removed"];

/// A value as JSON text, for the log fields of [`JSON_FIELDS`].
pub fn json_text<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

pub const DESCRIPTIONS: &[(&str, &str)] = &[
    (RUNS_STARTED, "Runs started, by pipeline."),
    (RUNS_FINISHED, "Runs that reached a terminal status (interrupted included), by pipeline and status."),
    (RUNS_IN_PROGRESS, "Runs this process is driving now, runs parked on a human approval included."),
    (RUNS_RESUMED, "Runs resumed after a restart, by pipeline."),
    (RUNS_ADOPTED, "Runs taken over from another replica, by pipeline."),
    (RUNS_INTERRUPTED, "Runs ended as interrupted at a restart, by pipeline and reason."),
    (STEPS, "Steps that finished, by pipeline, step, executor and status."),
    (STEP_DURATION, "How long steps took, in seconds, by pipeline, step and executor."),
    (TOKENS, "Model tokens used, by pipeline and direction (input, output)."),
    (COST, "Model cost in US dollars, by pipeline."),
    (APPROVALS_PENDING, "Human approvals waiting for a decision."),
    (APPROVAL_DECISIONS, "Human approval decisions, by pipeline and decision."),
    (WEBHOOKS, "Trigger requests, by source and answer (accepted, deduplicated, no_match, bad_request, ...)."),
    (NOTIFICATIONS, "Notifications sent, by channel and result."),
    (REPLICAS, "Replicas seen alive on the shared store, this one included."),
    (AGENT_TURNS, "Agent model turns, by pipeline, agent and outcome (completed, reused, rerun, failed)."),
    (TOOL_CALLS, "Agent tool calls, by pipeline, tool and outcome (completed, failed, reused, rerun, rejected)."),
    (AGENT_REBILLED, "Model calls asked again after a crash (billed twice), by pipeline and agent."),
];

/// Installs the Prometheus recorder: step durations as a histogram, every
/// metric described.
pub fn install_prometheus(
) -> Result<metrics_exporter_prometheus::PrometheusHandle, metrics_exporter_prometheus::BuildError>
{
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(STEP_DURATION.to_string()),
            STEP_DURATION_BUCKETS,
        )?
        .install_recorder()?;
    for (name, help) in DESCRIPTIONS {
        match *name {
            RUNS_IN_PROGRESS | APPROVALS_PENDING | REPLICAS | COST => {
                metrics::describe_gauge!(*name, *help)
            }
            STEP_DURATION => metrics::describe_histogram!(*name, metrics::Unit::Seconds, *help),
            _ => metrics::describe_counter!(*name, *help),
        }
    }
    Ok(handle)
}

/// Exports every counter labelled by pipeline alone (and the finished runs by
/// each terminal status) at 0 for each loaded pipeline, so `increase()` sees a
/// pipeline's first event. Adding 0 to an existing series changes nothing, so
/// this may run again after a reload.
pub fn zero_pipeline_counters<'a>(pipelines: impl Iterator<Item = &'a str>) {
    use crate::domain::Word as _;
    for p in pipelines {
        for name in [RUNS_STARTED, RUNS_RESUMED] {
            counter!(name, "pipeline" => p.to_string()).increment(0);
        }
        for status in crate::domain::RunStatus::ALL
            .iter()
            .filter(|s| **s != crate::domain::RunStatus::Running)
        {
            counter!(RUNS_FINISHED, "pipeline" => p.to_string(), "status" => status.as_str())
                .increment(0);
        }
        for direction in ["input", "output"] {
            counter!(TOKENS, "pipeline" => p.to_string(), "direction" => direction).increment(0);
        }
    }
}

pub fn run_started(pipeline: &str) {
    counter!(RUNS_STARTED, "pipeline" => pipeline.to_string()).increment(1);
}

pub fn run_finished(pipeline: &str, status: &str) {
    counter!(RUNS_FINISHED, "pipeline" => pipeline.to_string(), "status" => status.to_string())
        .increment(1);
}

pub fn runs_in_progress(n: usize) {
    gauge!(RUNS_IN_PROGRESS).set(n as f64);
}

pub fn run_resumed(pipeline: &str) {
    counter!(RUNS_RESUMED, "pipeline" => pipeline.to_string()).increment(1);
}

/// A run taken over from another replica (SPEC 11.2).
pub fn run_adopted(pipeline: &str) {
    counter!(RUNS_ADOPTED, "pipeline" => pipeline.to_string()).increment(1);
}

pub fn run_interrupted(pipeline: &str, reason: &str) {
    counter!(RUNS_INTERRUPTED, "pipeline" => pipeline.to_string(), "reason" => reason.to_string())
        .increment(1);
}

pub fn step_finished(pipeline: &str, step: &str, executor: &str, status: &str, seconds: f64) {
    counter!(STEPS, "pipeline" => pipeline.to_string(), "step" => step.to_string(),
        "executor" => executor.to_string(), "status" => status.to_string())
    .increment(1);
    histogram!(STEP_DURATION, "pipeline" => pipeline.to_string(), "step" => step.to_string(),
        "executor" => executor.to_string())
    .record(seconds);
}

pub fn usage(pipeline: &str, input_tokens: u64, output_tokens: u64, cost_usd: f64) {
    if input_tokens > 0 {
        counter!(TOKENS, "pipeline" => pipeline.to_string(), "direction" => "input")
            .increment(input_tokens);
    }
    if output_tokens > 0 {
        counter!(TOKENS, "pipeline" => pipeline.to_string(), "direction" => "output")
            .increment(output_tokens);
    }
    if cost_usd > 0.0 {
        // Counters are integers; cost is kept in micro-dollars and exposed as a gauge-like total.
        gauge!(COST, "pipeline" => pipeline.to_string()).increment(cost_usd);
    }
}

pub fn notification(channel: &str, result: &str) {
    counter!(NOTIFICATIONS, "channel" => channel.to_string(), "result" => result.to_string())
        .increment(1);
}

pub fn webhook(source: &str, status: &str) {
    counter!(WEBHOOKS, "source" => source.to_string(), "status" => status.to_string()).increment(1);
}

pub fn approval_decided(pipeline: &str, decision: &str) {
    counter!(APPROVAL_DECISIONS, "pipeline" => pipeline.to_string(), "decision" => decision.to_string()).increment(1);
}

pub fn replicas(n: usize) {
    metrics::gauge!(REPLICAS).set(n as f64);
}

pub fn approvals_pending(n: usize) {
    gauge!(APPROVALS_PENDING).set(n as f64);
}

pub const AGENT_TURNS: &str = "vectorstep_agent_turns_total";
pub const TOOL_CALLS: &str = "vectorstep_tool_calls_total";
pub const AGENT_REBILLED: &str = "vectorstep_agent_rebilled_calls_total";

/// `outcome`: `completed`, `reused`, `rerun` or `failed`.
pub fn agent_turns(pipeline: &str, agent: &str, outcome: &str, n: u64) {
    counter!(AGENT_TURNS, "pipeline" => pipeline.to_string(), "agent" => agent.to_string(),
        "outcome" => outcome.to_string())
    .increment(n);
}

/// `outcome`: `completed`, `failed`, `reused`, `rerun` or `rejected`.
pub fn tool_call(pipeline: &str, tool: &str, outcome: &str) {
    counter!(TOOL_CALLS, "pipeline" => pipeline.to_string(), "tool" => tool.to_string(),
        "outcome" => outcome.to_string())
    .increment(1);
}

/// A model call asked again after a crash: billed twice.
pub fn agent_rebilled(pipeline: &str, agent: &str) {
    counter!(AGENT_REBILLED, "pipeline" => pipeline.to_string(), "agent" => agent.to_string())
        .increment(1);
}
