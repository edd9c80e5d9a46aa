//! Builders for the rows the runner writes, so every call site fills them the same way.

use crate::domain::{StepKind, StepStatus};
use crate::pipeline::Action;
use crate::run::{StepOutput, Usage};
use crate::store::StepRecord;

/// `<run_id>:<step path>:<iteration>` (SPEC 4).
pub fn idempotency_key(run_id: &str, path: &str, iteration: u32) -> String {
    format!("{run_id}:{path}:{iteration}")
}

/// Where a unit sorts in the run: top-level entries step by 10,000 so their
/// branches (`+1 + position`) sort right after them.
pub fn step_index(entry: usize, branch: Option<usize>) -> u32 {
    let base = (entry as u32).saturating_mul(10_000);
    match branch {
        Some(b) => base.saturating_add(1 + b as u32),
        None => base,
    }
}

pub struct NewRecord<'a> {
    pub run_id: &'a str,
    pub path: &'a str,
    pub index: u32,
    pub kind: StepKind,
    pub action: Option<&'a Action>,
    pub started_at: i64,
    pub attempt: u32,
    pub iteration: u32,
}

/// A record in status `running`, written before the executor is called.
pub fn running(n: NewRecord<'_>) -> StepRecord {
    StepRecord {
        run_id: n.run_id.to_string(),
        step_path: n.path.to_string(),
        step_index: n.index,
        kind: n.kind,
        executor: n
            .action
            .map(|a| a.executor_name.clone())
            .unwrap_or_else(|| n.kind.as_str().to_string()),
        agent: n.action.and_then(|a| a.agent.clone()),
        status: StepStatus::Running,
        attempts: n.attempt,
        iteration: n.iteration,
        idempotency_key: idempotency_key(n.run_id, n.path, n.iteration),
        started_at: n.started_at,
        finished_at: None,
        duration_ms: None,
        primary_confidence: None,
        effective_confidence: None,
        output_json: None,
        error: None,
        input_tokens: 0,
        output_tokens: 0,
        cost_usd: None,
        items_json: None,
    }
}

/// Fills in the terminal state of a record.
pub fn finish(
    rec: &mut StepRecord,
    status: StepStatus,
    output: &StepOutput,
    usage: &Usage,
    error: Option<String>,
    now: i64,
) {
    rec.status = status;
    rec.finished_at = Some(now);
    rec.duration_ms = Some((now - rec.started_at).max(0) as u64);
    let failed = error.is_some();
    rec.primary_confidence = (!failed).then_some(output.confidence);
    rec.effective_confidence = (!failed).then_some(output.confidence);
    rec.output_json = Some(output.to_json().to_string());
    rec.error = error;
    rec.input_tokens = usage.input_tokens;
    rec.output_tokens = usage.output_tokens;
    rec.cost_usd = usage.cost_usd;
}
