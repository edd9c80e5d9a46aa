//! `pipeline_steps`: one row per step, branch, parallel group and fan-out of a run,
//! keyed by step path; resume rebuilds a run's state from these rows alone.

use super::connection::{query_all, Cols};
use super::error::DbError;
use super::sql::Db;
use super::{Error, Outcome, Store};
use crate::domain::{RunId, StepKind, StepStatus, UnixMillis};

/// A row of `pipeline_steps`. `kind` is one of `step`, `parallel`, `branch`, `fan_out`,
/// `fan_out_branch`; `items_json` is the fan-out item list, recorded when it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub run_id: RunId,
    pub step_path: String,
    pub step_index: u32,
    pub kind: StepKind,
    pub executor: String,
    pub agent: Option<String>,
    pub status: StepStatus,
    pub attempts: u32,
    pub iteration: u32,
    pub idempotency_key: String,
    pub started_at: UnixMillis,
    pub finished_at: Option<UnixMillis>,
    pub duration_ms: Option<u64>,
    pub primary_confidence: Option<f64>,
    pub effective_confidence: Option<f64>,
    pub output_json: Option<String>,
    pub error: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: Option<f64>,
    pub items_json: Option<String>,
}

const TABLE: &str = "pipeline_steps";

const COLUMNS: &str = "run_id, step_path, step_index, kind, executor, agent, status, \
    attempts, iteration, idempotency_key, started_at, finished_at, duration_ms, \
    primary_confidence, effective_confidence, output_json, error, input_tokens, \
    output_tokens, cost_usd, items_json";

impl StepRecord {
    fn decode(c: &Cols) -> Result<Self, Error> {
        Ok(StepRecord {
            run_id: c.get("run_id")?,
            step_path: c.get("step_path")?,
            step_index: c.get("step_index")?,
            kind: c.word("kind")?,
            executor: c.get("executor")?,
            agent: c.get("agent")?,
            status: c.word("status")?,
            attempts: c.get("attempts")?,
            iteration: c.get("iteration")?,
            idempotency_key: c.get("idempotency_key")?,
            started_at: c.get("started_at")?,
            finished_at: c.get("finished_at")?,
            duration_ms: c.get("duration_ms")?,
            primary_confidence: c.get("primary_confidence")?,
            effective_confidence: c.get("effective_confidence")?,
            output_json: c.get("output_json")?,
            error: c.get("error")?,
            input_tokens: c.get("input_tokens")?,
            output_tokens: c.get("output_tokens")?,
            cost_usd: c.get("cost_usd")?,
            items_json: c.get("items_json")?,
        })
    }
}

/// The whole record replaces the stored one: the run driver always writes the step's
/// complete current state, so a partial update could only lose information.
pub(super) fn upsert(db: &impl Db, step: &StepRecord) -> Result<Outcome, DbError> {
    // Built once: this runs for every step record, thousands of times a second.
    static UPSERT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "INSERT INTO pipeline_steps ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, \
             ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21) \
             ON CONFLICT (run_id, step_path) DO UPDATE SET \
             step_index = excluded.step_index, kind = excluded.kind, \
             executor = excluded.executor, agent = excluded.agent, status = excluded.status, \
             attempts = excluded.attempts, iteration = excluded.iteration, \
             idempotency_key = excluded.idempotency_key, started_at = excluded.started_at, \
             finished_at = excluded.finished_at, duration_ms = excluded.duration_ms, \
             primary_confidence = excluded.primary_confidence, \
             effective_confidence = excluded.effective_confidence, \
             output_json = excluded.output_json, error = excluded.error, \
             input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, \
             cost_usd = excluded.cost_usd, items_json = excluded.items_json"
        )
    });
    db.exec(
        &UPSERT,
        &[
            &step.run_id,
            &step.step_path,
            &step.step_index,
            &step.kind.as_str(),
            &step.executor,
            &step.agent,
            &step.status.as_str(),
            &step.attempts,
            &step.iteration,
            &step.idempotency_key,
            &step.started_at,
            &step.finished_at,
            &step.duration_ms,
            &step.primary_confidence,
            &step.effective_confidence,
            &step.output_json,
            &step.error,
            &step.input_tokens,
            &step.output_tokens,
            &step.cost_usd,
            &step.items_json,
        ],
    )?;
    Ok(Outcome::Done)
}

impl Store {
    /// In pipeline order (`step_index`, then `step_path` so that a group sorts before
    /// its branches and branches sort by name).
    pub fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, Error> {
        self.read(|conn| of_run(conn, run_id))
    }
}

/// The step records of `run_id` in pipeline order, on either backend.
pub(super) fn of_run(db: &impl Db, run_id: &str) -> Result<Vec<StepRecord>, Error> {
    let sql = format!(
        "SELECT {COLUMNS} FROM pipeline_steps WHERE run_id = ?1 ORDER BY step_index, step_path"
    );
    query_all(db, TABLE, &sql, &[&run_id], StepRecord::decode)
}
