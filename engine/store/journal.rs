//! `agent_turns`, `tool_calls`, `agent_delegations`: the step journal of tool-using
//! agents (SPEC 10). The agent loop commits these rows like step records, in the
//! same batches (a turn's completion and its first call's start are one commit);
//! the resume planner (`run::journal`) decides from them what is reused.
//!
//! A step's journal is its own rows plus those of its delegations, which the
//! sub-agents journal under `<step path>/delegate/<key prefix>` (and theirs under
//! `.../delegate/...` again). [`Store::journal`] reads both with one range on the
//! primary key. The usage sum lives beside the planner (`StepJournal::usage` in
//! `run::journal`), so the store stays ignorant of the run model's `Usage`.

use std::collections::BTreeMap;

use super::connection::{query_all, Cols};
use super::error::DbError;
use super::sql::Db;
use super::{Error, Outcome, Store};
use crate::domain::{DelegationStatus, RunId, ToolCallStatus, ToolEffect, TurnStatus, UnixMillis};

/// The infix under which a step's delegations journal their own turns and calls.
pub const DELEGATE_INFIX: &str = "/delegate/";

/// A row of `agent_turns`: one model call of an agent step. `messages_json` is a JSON
/// array of only the messages this turn adds before the model call (the prompt on
/// turn 1, the tool results of the previous turn after); `reply_json` is the
/// assistant message with its `tool_calls`; `tools_json` (turn 1 only) is the tool
/// list offered, so a resumed step offers the same tools. Turns count from 1.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRecord {
    pub run_id: RunId,
    pub step_path: String,
    pub iteration: u32,
    pub turn: u32,
    pub status: TurnStatus,
    pub messages_json: String,
    pub reply_json: Option<String>,
    pub tools_json: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// `None` when the model has no price in `pricing`.
    pub cost_usd: Option<f64>,
    pub error: Option<String>,
    pub started_at: UnixMillis,
    pub finished_at: Option<UnixMillis>,
}

/// A row of `tool_calls`: one tool call of a turn's reply. Call indexes count from
/// 1 in the order of the reply's `tool_calls`; `call_id` is the model's id for it.
/// `effect_key` (`<run_id>:<step path>:<iteration>:<turn>:<call index>`, see
/// `run::journal::effect_key`) is unique across the store.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallRecord {
    pub run_id: RunId,
    pub step_path: String,
    pub iteration: u32,
    pub turn: u32,
    pub call_index: u32,
    pub call_id: String,
    pub tool: String,
    pub arguments_json: String,
    pub effect: ToolEffect,
    pub effect_key: String,
    pub status: ToolCallStatus,
    pub attempt: u32,
    pub result_json: Option<String>,
    pub approval_token: Option<String>,
    pub approval_deadline: Option<UnixMillis>,
    pub decided_by: Option<String>,
    pub started_at: UnixMillis,
    pub finished_at: Option<UnixMillis>,
    pub duration_ms: Option<u64>,
}

/// A row of `agent_delegations`: one question a step's agent delegated to a
/// sub-agent, keyed by `blake3(agent | question | context)` in hex (see
/// `run::journal::delegation_key`). `journal_path` is where the sub-agent's own
/// turns and calls are journaled: `<step path>/delegate/<first 12 of key>`.
#[derive(Debug, Clone, PartialEq)]
pub struct DelegationRecord {
    pub run_id: RunId,
    pub step_path: String,
    pub key: String,
    pub agent: String,
    pub question: String,
    pub status: DelegationStatus,
    pub output_json: Option<String>,
    pub journal_path: String,
    pub started_at: UnixMillis,
    pub finished_at: Option<UnixMillis>,
}

/// The journal of one agent step: its turns, tool calls and delegations, and those
/// of its delegations' sub-paths, each ordered by step path (the step's own rows
/// first), then iteration, turn and call index (delegations by key).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepJournal {
    pub run_id: RunId,
    pub step_path: String,
    pub turns: Vec<TurnRecord>,
    pub calls: Vec<ToolCallRecord>,
    pub delegations: Vec<DelegationRecord>,
}

impl StepJournal {
    /// Nothing journaled: the step never started a turn.
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty() && self.calls.is_empty() && self.delegations.is_empty()
    }

    /// The part of this journal under `path` (a delegation's `journal_path`): its
    /// own rows and those of its sub-paths, for planning a sub-agent's resume from
    /// the rows already read.
    pub fn sub(&self, path: &str) -> StepJournal {
        StepJournal {
            run_id: self.run_id.clone(),
            step_path: path.to_string(),
            turns: keep(&self.turns, path, |t| &t.step_path),
            calls: keep(&self.calls, path, |c| &c.step_path),
            delegations: keep(&self.delegations, path, |d| &d.step_path),
        }
    }
}

/// Whether `candidate` is `path` itself or one of its delegation sub-paths.
pub fn is_within(candidate: &str, path: &str) -> bool {
    candidate == path
        || candidate
            .strip_prefix(path)
            .is_some_and(|rest| rest.starts_with(DELEGATE_INFIX))
}

/// The agent step a journal path belongs to: the path up to its first
/// `/delegate/`.
pub fn root_of(path: &str) -> &str {
    match path.find(DELEGATE_INFIX) {
        Some(i) => &path[..i],
        None => path,
    }
}

fn keep<T: Clone>(rows: &[T], path: &str, of: impl Fn(&T) -> &String) -> Vec<T> {
    rows.iter()
        .filter(|r| is_within(of(r), path))
        .cloned()
        .collect()
}

const TURNS: &str = "agent_turns";
const CALLS: &str = "tool_calls";
const DELEGATIONS: &str = "agent_delegations";

const TURN_COLUMNS: &str = "run_id, step_path, iteration, turn, status, messages_json, \
    reply_json, tools_json, input_tokens, output_tokens, cost_usd, error, started_at, \
    finished_at";

const CALL_COLUMNS: &str = "run_id, step_path, iteration, turn, call_index, call_id, tool, \
    arguments_json, effect, effect_key, status, attempt, result_json, approval_token, \
    approval_deadline, decided_by, started_at, finished_at, duration_ms";

const DELEGATION_COLUMNS: &str = "run_id, step_path, key, agent, question, status, \
    output_json, journal_path, started_at, finished_at";

impl TurnRecord {
    fn decode(c: &Cols) -> Result<Self, Error> {
        Ok(TurnRecord {
            run_id: c.get("run_id")?,
            step_path: c.get("step_path")?,
            iteration: c.get("iteration")?,
            turn: c.get("turn")?,
            status: c.word("status")?,
            messages_json: c.get("messages_json")?,
            reply_json: c.get("reply_json")?,
            tools_json: c.get("tools_json")?,
            input_tokens: c.get("input_tokens")?,
            output_tokens: c.get("output_tokens")?,
            cost_usd: c.get("cost_usd")?,
            error: c.get("error")?,
            started_at: c.get("started_at")?,
            finished_at: c.get("finished_at")?,
        })
    }
}

impl ToolCallRecord {
    fn decode(c: &Cols) -> Result<Self, Error> {
        Ok(ToolCallRecord {
            run_id: c.get("run_id")?,
            step_path: c.get("step_path")?,
            iteration: c.get("iteration")?,
            turn: c.get("turn")?,
            call_index: c.get("call_index")?,
            call_id: c.get("call_id")?,
            tool: c.get("tool")?,
            arguments_json: c.get("arguments_json")?,
            effect: c.word("effect")?,
            effect_key: c.get("effect_key")?,
            status: c.word("status")?,
            attempt: c.get("attempt")?,
            result_json: c.get("result_json")?,
            approval_token: c.get("approval_token")?,
            approval_deadline: c.get("approval_deadline")?,
            decided_by: c.get("decided_by")?,
            started_at: c.get("started_at")?,
            finished_at: c.get("finished_at")?,
            duration_ms: c.get("duration_ms")?,
        })
    }
}

impl DelegationRecord {
    fn decode(c: &Cols) -> Result<Self, Error> {
        Ok(DelegationRecord {
            run_id: c.get("run_id")?,
            step_path: c.get("step_path")?,
            key: c.get("key")?,
            agent: c.get("agent")?,
            question: c.get("question")?,
            status: c.word("status")?,
            output_json: c.get("output_json")?,
            journal_path: c.get("journal_path")?,
            started_at: c.get("started_at")?,
            finished_at: c.get("finished_at")?,
        })
    }
}

/// The whole row replaces the stored one, as for step records: the loop always
/// writes a turn's complete current state.
pub(super) fn upsert_turn(db: &impl Db, t: &TurnRecord) -> Result<Outcome, DbError> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "INSERT INTO agent_turns ({TURN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, \
             ?8, ?9, ?10, ?11, ?12, ?13, ?14) \
             ON CONFLICT (run_id, step_path, iteration, turn) DO UPDATE SET \
             status = excluded.status, messages_json = excluded.messages_json, \
             reply_json = excluded.reply_json, tools_json = excluded.tools_json, \
             input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, \
             cost_usd = excluded.cost_usd, error = excluded.error, \
             started_at = excluded.started_at, finished_at = excluded.finished_at"
        )
    });
    db.exec(
        &SQL,
        &[
            &t.run_id,
            &t.step_path,
            &t.iteration,
            &t.turn,
            &t.status.as_str(),
            &t.messages_json,
            &t.reply_json,
            &t.tools_json,
            &t.input_tokens,
            &t.output_tokens,
            &t.cost_usd,
            &t.error,
            &t.started_at,
            &t.finished_at,
        ],
    )?;
    Ok(Outcome::Done)
}

/// Replaces the call at its key. Another call already holding the same
/// `effect_key` fails the write (and so its batch): two calls must never share the
/// key a tool deduplicates on.
pub(super) fn upsert_call(db: &impl Db, c: &ToolCallRecord) -> Result<Outcome, DbError> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "INSERT INTO tool_calls ({CALL_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, \
             ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19) \
             ON CONFLICT (run_id, step_path, iteration, turn, call_index) DO UPDATE SET \
             call_id = excluded.call_id, tool = excluded.tool, \
             arguments_json = excluded.arguments_json, effect = excluded.effect, \
             effect_key = excluded.effect_key, status = excluded.status, \
             attempt = excluded.attempt, result_json = excluded.result_json, \
             approval_token = excluded.approval_token, \
             approval_deadline = excluded.approval_deadline, \
             decided_by = excluded.decided_by, started_at = excluded.started_at, \
             finished_at = excluded.finished_at, duration_ms = excluded.duration_ms"
        )
    });
    db.exec(
        &SQL,
        &[
            &c.run_id,
            &c.step_path,
            &c.iteration,
            &c.turn,
            &c.call_index,
            &c.call_id,
            &c.tool,
            &c.arguments_json,
            &c.effect.as_str(),
            &c.effect_key,
            &c.status.as_str(),
            &c.attempt,
            &c.result_json,
            &c.approval_token,
            &c.approval_deadline,
            &c.decided_by,
            &c.started_at,
            &c.finished_at,
            &c.duration_ms,
        ],
    )?;
    Ok(Outcome::Done)
}

pub(super) fn upsert_delegation(db: &impl Db, d: &DelegationRecord) -> Result<Outcome, DbError> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "INSERT INTO agent_delegations ({DELEGATION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, \
             ?5, ?6, ?7, ?8, ?9, ?10) \
             ON CONFLICT (run_id, step_path, key) DO UPDATE SET \
             agent = excluded.agent, question = excluded.question, \
             status = excluded.status, output_json = excluded.output_json, \
             journal_path = excluded.journal_path, started_at = excluded.started_at, \
             finished_at = excluded.finished_at"
        )
    });
    db.exec(
        &SQL,
        &[
            &d.run_id,
            &d.step_path,
            &d.key,
            &d.agent,
            &d.question,
            &d.status.as_str(),
            &d.output_json,
            &d.journal_path,
            &d.started_at,
            &d.finished_at,
        ],
    )?;
    Ok(Outcome::Done)
}

/// The journal tables, for retention: a pruned run's rows go with it.
pub(super) const TABLES: [&str; 3] = [TURNS, CALLS, DELEGATIONS];

/// `step_path = ?2` or under `?2/delegate/`, as a range on the primary key: every
/// path from `p` up to (not including) `p/delegate0` (`0` follows `/`), minus those
/// between `p` and `p/delegate/` (`p-2`, `p/alpha`: other steps).
const STEP_RANGE: &str = "run_id = ?1 AND step_path >= ?2 AND step_path < ?4 \
    AND (step_path = ?2 OR step_path >= ?3)";

impl Store {
    /// The journal of the agent step at `step_path`, with its delegations'
    /// sub-paths. Bounded by one step, so async code may call it directly (the
    /// agent loop does when it starts or resumes a step).
    pub fn journal(&self, run_id: &str, step_path: &str) -> Result<StepJournal, Error> {
        let below = format!("{step_path}{DELEGATE_INFIX}");
        let end = format!("{step_path}/delegate0");
        self.read(|conn| {
            let turns = query_all(
                conn,
                TURNS,
                &format!(
                    "SELECT {TURN_COLUMNS} FROM agent_turns WHERE {STEP_RANGE} \
                     ORDER BY step_path, iteration, turn"
                ),
                &[&run_id, &step_path, &below, &end],
                TurnRecord::decode,
            )?;
            let calls = query_all(
                conn,
                CALLS,
                &format!(
                    "SELECT {CALL_COLUMNS} FROM tool_calls WHERE {STEP_RANGE} \
                     ORDER BY step_path, iteration, turn, call_index"
                ),
                &[&run_id, &step_path, &below, &end],
                ToolCallRecord::decode,
            )?;
            let delegations = query_all(
                conn,
                DELEGATIONS,
                &format!(
                    "SELECT {DELEGATION_COLUMNS} FROM agent_delegations WHERE {STEP_RANGE} \
                     ORDER BY step_path, key"
                ),
                &[&run_id, &step_path, &below, &end],
                DelegationRecord::decode,
            )?;
            Ok(StepJournal {
                run_id: run_id.to_string(),
                step_path: step_path.to_string(),
                turns,
                calls,
                delegations,
            })
        })
    }

    /// Every agent step's journal in the run, one per step path (delegation
    /// sub-paths inside their step's), ordered by step path. Its cost grows with
    /// the run's turns, like the run log: the API calls it inside `spawn_blocking`.
    pub fn journals_of_run(&self, run_id: &str) -> Result<Vec<StepJournal>, Error> {
        let (turns, calls, delegations) = self.read(|conn| {
            let turns = query_all(
                conn,
                TURNS,
                &format!(
                    "SELECT {TURN_COLUMNS} FROM agent_turns WHERE run_id = ?1 \
                     ORDER BY step_path, iteration, turn"
                ),
                &[&run_id],
                TurnRecord::decode,
            )?;
            let calls = query_all(
                conn,
                CALLS,
                &format!(
                    "SELECT {CALL_COLUMNS} FROM tool_calls WHERE run_id = ?1 \
                     ORDER BY step_path, iteration, turn, call_index"
                ),
                &[&run_id],
                ToolCallRecord::decode,
            )?;
            let delegations = query_all(
                conn,
                DELEGATIONS,
                &format!(
                    "SELECT {DELEGATION_COLUMNS} FROM agent_delegations WHERE run_id = ?1 \
                     ORDER BY step_path, key"
                ),
                &[&run_id],
                DelegationRecord::decode,
            )?;
            Ok((turns, calls, delegations))
        })?;
        let mut out: BTreeMap<String, StepJournal> = BTreeMap::new();
        for t in turns {
            entry(&mut out, run_id, &t.step_path).turns.push(t);
        }
        for c in calls {
            entry(&mut out, run_id, &c.step_path).calls.push(c);
        }
        for d in delegations {
            entry(&mut out, run_id, &d.step_path).delegations.push(d);
        }
        Ok(out.into_values().collect())
    }
}

/// The journal of the agent step `path` belongs to, created on first use.
fn entry<'a>(
    out: &'a mut BTreeMap<String, StepJournal>,
    run_id: &str,
    path: &str,
) -> &'a mut StepJournal {
    let root = root_of(path);
    out.entry(root.to_string()).or_insert_with(|| StepJournal {
        run_id: run_id.to_string(),
        step_path: root.to_string(),
        ..StepJournal::default()
    })
}
