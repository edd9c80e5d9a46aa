//! The step journal's resume decisions (SPEC 10): given the journal rows an agent
//! step left behind, what the agent loop reuses, requests again, runs, re-runs,
//! re-arms or escalates. Pure; the loop performs the plan and commits the rows
//! (`store::journal`).
//!
//! A fresh step is planned the same way from an empty journal, so starting and
//! resuming share one code path, as for runs (`run::plan`).
//!
//! The step record's tokens and cost stay the sum of its turns: the loop sets the
//! record's usage from [`StepJournal::usage`] (every turn of every iteration,
//! delegations' turns included) instead of adding up what it saw in this process,
//! so reused turns count once and a re-requested turn counts with the usage of the
//! answer it finally got.

use serde_json::Value;

use super::output::Usage;
use crate::domain::{DelegationStatus, ToolCallStatus, ToolEffect, TurnStatus, UnixMillis};
use crate::pipeline::OnInterrupted;
use crate::store::{StepJournal, ToolCallRecord, TurnRecord, DELEGATE_INFIX};

/// `max_turns` when the agent does not say.
pub const DEFAULT_MAX_TURNS: u32 = 10;

/// How many characters of a delegation's key name its journal path.
pub const DELEGATION_PATH_KEY_CHARS: usize = 12;

/// A journal row the planner cannot read: the step cannot be resumed from it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    #[error("the journal of `{step_path}` (turn {turn}) has {column} that is not valid: {detail}")]
    BadJson {
        step_path: String,
        turn: u32,
        column: &'static str,
        detail: String,
    },
    #[error("the journal of `{step_path}` has turn {turn} completed without a reply")]
    NoReply { step_path: String, turn: u32 },
}

/// What the loop does next.
#[derive(Debug, Clone, PartialEq)]
pub enum NextTurn {
    /// No turn journaled for this iteration: turn 1, with the prompt.
    Fresh,
    /// This turn was in flight (`started`; it is billed twice, `rebilled`) or
    /// `failed`: request it again with the new messages it had recorded.
    Again {
        turn: u32,
        messages: Vec<Value>,
        rebilled: bool,
    },
    /// The last reused turn proposed tool calls: settle [`JournalPlan::calls`], then
    /// request [`JournalPlan::next_turn`] with their results, in call order, as its
    /// new messages (built with [`tool_message`]).
    AfterCalls,
    /// The last reused turn answered without tool calls: its reply is the step's
    /// answer and no model is called.
    Answered { reply: Value },
}

/// A completed turn whose reply is reused: no model call, no cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ReusedTurn {
    pub turn: u32,
    pub reply: Value,
    pub usage: Usage,
}

/// What happens to one tool call of the last reused turn.
#[derive(Debug, Clone, PartialEq)]
pub enum CallAction {
    /// Completed, failed, rejected or timed out: its recorded result goes back to
    /// the model; the tool is not run.
    Reuse {
        status: ToolCallStatus,
        result: Value,
    },
    /// Never started: run it (attempt 1).
    Run { attempt: u32 },
    /// In flight at the crash and safe to repeat (a `read` call, or a `write` call
    /// under `on_interrupted: rerun`): run it again with the same effect key.
    Rerun { attempt: u32 },
    /// A `write` call in flight under `on_interrupted: escalate` (or one already
    /// escalated): escalate the step naming the tool and its arguments; do not run.
    Escalate { tool: String, arguments: Value },
    /// Waiting for a human: re-arm the same approval; send nothing new.
    Rearm { token: String, deadline: UnixMillis },
}

/// One tool call of the last reused turn, in the order of its reply.
#[derive(Debug, Clone, PartialEq)]
pub struct CallPlan {
    /// From 1, in the order of the reply's `tool_calls`.
    pub call_index: u32,
    /// The model's id for the call, which its result message must name.
    pub call_id: String,
    pub tool: String,
    pub arguments: Value,
    pub effect_key: String,
    pub action: CallAction,
}

/// What happens to one delegation of the step.
#[derive(Debug, Clone, PartialEq)]
pub enum DelegationAction {
    /// Completed: its answer is reused; the sub-agent is not asked again.
    Reuse { output: Value },
    /// Failed or in flight (a failure is never cached): ask again; the sub-agent's
    /// own journal under `journal_path` says what of it is reused.
    Run,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DelegationPlan {
    pub key: String,
    pub agent: String,
    pub journal_path: String,
    pub action: DelegationAction,
}

/// The resume plan of one agent step (one iteration of it).
#[derive(Debug, Clone, PartialEq)]
pub struct JournalPlan {
    /// Completed turns, from turn 1, whose replies are reused.
    pub reused: Vec<ReusedTurn>,
    /// What the model has seen and answered so far: the new messages and the reply
    /// of every reused turn, in order, followed for [`NextTurn::Again`] by the
    /// messages of the turn requested again (the results of the calls before it).
    pub conversation: Vec<Value>,
    /// The tool list turn 1 offered, so a resumed step offers the same tools.
    pub tools: Option<Value>,
    pub next: NextTurn,
    /// For [`NextTurn::AfterCalls`]: every call of the last reused turn.
    pub calls: Vec<CallPlan>,
    /// The step's own delegations (not those of its sub-agents), by key.
    pub delegations: Vec<DelegationPlan>,
    /// Usage of this iteration's turns so far, delegations' turns included: the
    /// budget check before the next turn starts from it.
    pub usage: Usage,
    /// The number of the next turn to request (for `Answered`, the one that would
    /// follow the answer).
    pub next_turn: u32,
    /// The next turn is the last `max_turns` allows (or past it, when `max_turns`
    /// was lowered or the model proposed calls on its final turn): ask it for a
    /// final answer, without tools. Never set for [`NextTurn::Answered`].
    pub final_turn: bool,
}

impl JournalPlan {
    /// `turns` of `agent_turn_reused`.
    pub fn reused_turns(&self) -> u32 {
        u32::try_from(self.reused.len()).unwrap_or(u32::MAX)
    }

    /// Model calls this resume pays for twice (`vectorstep_agent_rebilled_calls_total`).
    pub fn rebilled(&self) -> u32 {
        u32::from(matches!(self.next, NextTurn::Again { rebilled: true, .. }))
    }

    /// The plan of the delegation with this key, if the step journaled one.
    pub fn delegation(&self, key: &str) -> Option<&DelegationPlan> {
        self.delegations.iter().find(|d| d.key == key)
    }
}

/// What [`plan`] plans from.
#[derive(Debug, Clone, Copy)]
pub struct JournalInput<'a> {
    /// The step's journal; the plan is for its `step_path` (for a sub-agent, a
    /// `StepJournal::sub` of its parent's).
    pub journal: &'a StepJournal,
    /// The `loop_until` iteration being planned (from 1).
    pub iteration: u32,
    /// The pipeline's `durable.on_interrupted`.
    pub on_interrupted: OnInterrupted,
    pub max_turns: u32,
}

/// Plans the resume of one agent step from its journal.
pub fn plan(input: &JournalInput<'_>) -> Result<JournalPlan, Error> {
    let j = input.journal;
    let path = j.step_path.as_str();
    let own: Vec<&TurnRecord> = j
        .turns
        .iter()
        .filter(|t| t.step_path == path && t.iteration == input.iteration)
        .collect();
    let tools = match own
        .iter()
        .find(|t| t.turn == 1)
        .and_then(|t| t.tools_json.as_deref())
    {
        Some(text) => Some(json(path, 1, "tools_json", text)?),
        None => None,
    };

    let mut reused = Vec::new();
    let mut conversation = Vec::new();
    let mut again = None;
    // Turns count from 1 without gaps; a row past a gap was never requested by
    // this step's loop and is ignored.
    for (t, expected) in own.iter().zip(1_u32..) {
        if t.turn != expected {
            break;
        }
        let messages = messages(t)?;
        if t.status != TurnStatus::Completed {
            conversation.extend(messages.iter().cloned());
            again = Some((t.turn, messages, t.status == TurnStatus::Started));
            break;
        }
        let reply = match t.reply_json.as_deref() {
            Some(text) => json(path, t.turn, "reply_json", text)?,
            None => {
                return Err(Error::NoReply {
                    step_path: path.to_string(),
                    turn: t.turn,
                })
            }
        };
        conversation.extend(messages);
        conversation.push(reply.clone());
        reused.push(ReusedTurn {
            turn: t.turn,
            reply,
            usage: usage_of(t),
        });
    }

    let mut calls = Vec::new();
    let (next, next_turn) = match (again, reused.last()) {
        (Some((turn, messages, rebilled)), _) => (
            NextTurn::Again {
                turn,
                messages,
                rebilled,
            },
            turn,
        ),
        (None, None) => (NextTurn::Fresh, 1),
        (None, Some(last)) => {
            calls = plan_calls(input, last)?;
            let next = if calls.is_empty() {
                NextTurn::Answered {
                    reply: last.reply.clone(),
                }
            } else {
                NextTurn::AfterCalls
            };
            (next, last.turn + 1)
        }
    };
    let asks = !matches!(next, NextTurn::Answered { .. });
    Ok(JournalPlan {
        reused,
        conversation,
        tools,
        next,
        calls,
        delegations: plan_delegations(j),
        usage: j.usage_of_iteration(input.iteration),
        next_turn,
        final_turn: asks && next_turn >= input.max_turns.max(1),
    })
}

impl StepJournal {
    /// Usage of every turn in the journal (all iterations, delegations' turns
    /// included): what the step record's tokens and cost must equal.
    pub fn usage(&self) -> Usage {
        sum(self.turns.iter())
    }

    /// Usage of one iteration's turns, delegations' turns included.
    pub fn usage_of_iteration(&self, iteration: u32) -> Usage {
        sum(self.turns.iter().filter(|t| t.iteration == iteration))
    }
}

/// `<run_id>:<step path>:<iteration>:<turn>:<call index>`: the key a tool call
/// deduplicates its effect on, the same for every attempt.
pub fn effect_key(
    run_id: &str,
    step_path: &str,
    iteration: u32,
    turn: u32,
    call_index: u32,
) -> String {
    format!("{run_id}:{step_path}:{iteration}:{turn}:{call_index}")
}

/// `blake3(agent | question | context)` in hex: the same question to the same
/// agent with the same context is one delegation, reused after a crash.
pub fn delegation_key(agent: &str, question: &str, context: &str) -> String {
    blake3::hash(format!("{agent}|{question}|{context}").as_bytes())
        .to_hex()
        .to_string()
}

/// `<step path>/delegate/<key prefix>`: where a delegation's sub-agent journals
/// its own turns and calls.
pub fn delegation_path(step_path: &str, key: &str) -> String {
    let prefix: String = key.chars().take(DELEGATION_PATH_KEY_CHARS).collect();
    format!("{step_path}{DELEGATE_INFIX}{prefix}")
}

/// The message that hands a tool's result back to the model (OpenAI-compatible
/// `role: tool`): a string result as it is, anything else as its JSON text.
pub fn tool_message(call_id: &str, result: &Value) -> Value {
    let content = match result {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    serde_json::json!({"role": "tool", "tool_call_id": call_id, "content": content})
}

fn sum<'a>(turns: impl Iterator<Item = &'a TurnRecord>) -> Usage {
    let mut usage = Usage::default();
    for t in turns {
        usage.add(&usage_of(t));
    }
    usage
}

fn usage_of(t: &TurnRecord) -> Usage {
    Usage {
        input_tokens: t.input_tokens,
        output_tokens: t.output_tokens,
        cost_usd: t.cost_usd,
    }
}

fn json(step_path: &str, turn: u32, column: &'static str, text: &str) -> Result<Value, Error> {
    serde_json::from_str(text).map_err(|e| Error::BadJson {
        step_path: step_path.to_string(),
        turn,
        column,
        detail: e.to_string(),
    })
}

fn messages(t: &TurnRecord) -> Result<Vec<Value>, Error> {
    match json(&t.step_path, t.turn, "messages_json", &t.messages_json)? {
        Value::Array(items) => Ok(items),
        _ => Err(Error::BadJson {
            step_path: t.step_path.clone(),
            turn: t.turn,
            column: "messages_json",
            detail: "expected a JSON array of messages".into(),
        }),
    }
}

/// A call as the reply proposed it: id, tool name, arguments. OpenAI-compatible
/// replies carry `function: {name, arguments}` with the arguments as JSON text; a
/// flat `{name, arguments}` is read too.
fn proposed(call: &Value) -> (String, String, Value) {
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_string();
    let function = call.get("function").unwrap_or(call);
    let arguments = match function.get("arguments") {
        Some(Value::String(s)) => {
            serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
        }
        Some(v) => v.clone(),
        None => Value::Object(Default::default()),
    };
    (text(call.get("id")), text(function.get("name")), arguments)
}

fn plan_calls(input: &JournalInput<'_>, last: &ReusedTurn) -> Result<Vec<CallPlan>, Error> {
    let j = input.journal;
    let proposals: Vec<(String, String, Value)> = last
        .reply
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| calls.iter().map(proposed).collect())
        .unwrap_or_default();
    let rows: Vec<&ToolCallRecord> = j
        .calls
        .iter()
        .filter(|c| {
            c.step_path == j.step_path && c.iteration == input.iteration && c.turn == last.turn
        })
        .collect();
    let count = rows
        .iter()
        .map(|c| c.call_index)
        .max()
        .unwrap_or(0)
        .max(u32::try_from(proposals.len()).unwrap_or(u32::MAX));
    let mut out = Vec::new();
    for index in 1..=count {
        let row = rows.iter().find(|c| c.call_index == index);
        let plan = match row {
            Some(row) => {
                let arguments = json(
                    &j.step_path,
                    last.turn,
                    "arguments_json",
                    &row.arguments_json,
                )?;
                let action = call_action(input.on_interrupted, row, &arguments, last.turn)?;
                CallPlan {
                    call_index: index,
                    call_id: row.call_id.clone(),
                    tool: row.tool.clone(),
                    arguments,
                    effect_key: row.effect_key.clone(),
                    action,
                }
            }
            None => {
                let (call_id, tool, arguments) = usize::try_from(index - 1)
                    .ok()
                    .and_then(|i| proposals.get(i))
                    .cloned()
                    .unwrap_or_default();
                CallPlan {
                    call_index: index,
                    call_id,
                    tool,
                    arguments,
                    effect_key: effect_key(
                        &j.run_id,
                        &j.step_path,
                        input.iteration,
                        last.turn,
                        index,
                    ),
                    action: CallAction::Run { attempt: 1 },
                }
            }
        };
        out.push(plan);
    }
    Ok(out)
}

fn call_action(
    policy: OnInterrupted,
    row: &ToolCallRecord,
    arguments: &Value,
    turn: u32,
) -> Result<CallAction, Error> {
    let escalate = || CallAction::Escalate {
        tool: row.tool.clone(),
        arguments: arguments.clone(),
    };
    if row.status.is_settled() {
        let result = match row.result_json.as_deref() {
            Some(text) => json(&row.step_path, turn, "result_json", text)?,
            None => Value::Null,
        };
        return Ok(CallAction::Reuse {
            status: row.status,
            result,
        });
    }
    if row.status == ToolCallStatus::Escalated {
        return Ok(escalate());
    }
    if row.status == ToolCallStatus::Waiting {
        if let (Some(token), Some(deadline)) = (&row.approval_token, row.approval_deadline) {
            return Ok(CallAction::Rearm {
                token: token.clone(),
                deadline,
            });
        }
        // A parked call without its approval cannot be re-armed; it is treated as
        // in flight, which for a write call is what the policy is for.
    }
    let rerun = CallAction::Rerun {
        attempt: row.attempt.max(1) + 1,
    };
    Ok(match (row.effect, policy) {
        (ToolEffect::Read, _) | (ToolEffect::Write, OnInterrupted::Rerun) => rerun,
        (ToolEffect::Write, OnInterrupted::Escalate) => escalate(),
    })
}

fn plan_delegations(j: &StepJournal) -> Vec<DelegationPlan> {
    j.delegations
        .iter()
        .filter(|d| d.step_path == j.step_path)
        .map(|d| DelegationPlan {
            key: d.key.clone(),
            agent: d.agent.clone(),
            journal_path: d.journal_path.clone(),
            action: match (d.status, d.output_json.as_deref()) {
                // A completed answer that cannot be read back is not an answer:
                // the sub-agent is asked again (its own journal is reused).
                (DelegationStatus::Completed, Some(text)) => match serde_json::from_str(text) {
                    Ok(output) => DelegationAction::Reuse { output },
                    Err(_) => DelegationAction::Run,
                },
                _ => DelegationAction::Run,
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DelegationRecord;
    use serde_json::json;

    const RUN: &str = "r1";
    const STEP: &str = "triage";

    fn turn(n: u32, status: TurnStatus, reply: Option<Value>) -> TurnRecord {
        turn_at(STEP, n, status, reply)
    }

    fn turn_at(path: &str, n: u32, status: TurnStatus, reply: Option<Value>) -> TurnRecord {
        TurnRecord {
            run_id: RUN.into(),
            step_path: path.into(),
            iteration: 1,
            turn: n,
            status,
            messages_json: json!([{"role": "user", "content": format!("m{n}")}]).to_string(),
            reply_json: reply.map(|r| r.to_string()),
            tools_json: (n == 1).then(|| json!([{"name": "disk_usage"}]).to_string()),
            input_tokens: 10 * u64::from(n),
            output_tokens: u64::from(n),
            cost_usd: Some(0.5),
            error: None,
            started_at: 1,
            finished_at: None,
        }
    }

    /// A reply proposing `n` calls of `lookup`, OpenAI style (arguments as JSON text).
    fn calls_reply(n: u32) -> Value {
        let calls: Vec<Value> = (1..=n)
            .map(|i| {
                json!({"id": format!("c{i}"), "type": "function",
                       "function": {"name": "lookup", "arguments": format!("{{\"i\":{i}}}")}})
            })
            .collect();
        json!({"role": "assistant", "content": null, "tool_calls": calls})
    }

    fn answer() -> Value {
        json!({"role": "assistant", "content": "{\"summary\":\"ok\"}"})
    }

    fn call(turn: u32, index: u32, effect: ToolEffect, status: ToolCallStatus) -> ToolCallRecord {
        ToolCallRecord {
            run_id: RUN.into(),
            step_path: STEP.into(),
            iteration: 1,
            turn,
            call_index: index,
            call_id: format!("c{index}"),
            tool: "lookup".into(),
            arguments_json: format!("{{\"i\":{index}}}"),
            effect,
            effect_key: effect_key(RUN, STEP, 1, turn, index),
            status,
            attempt: 2,
            result_json: status.is_settled().then(|| format!("{{\"r\":{index}}}")),
            approval_token: (status == ToolCallStatus::Waiting).then(|| "tok".to_string()),
            approval_deadline: (status == ToolCallStatus::Waiting).then_some(900),
            decided_by: None,
            started_at: 2,
            finished_at: None,
            duration_ms: None,
        }
    }

    fn journal(turns: Vec<TurnRecord>, calls: Vec<ToolCallRecord>) -> StepJournal {
        StepJournal {
            run_id: RUN.into(),
            step_path: STEP.into(),
            turns,
            calls,
            delegations: Vec::new(),
        }
    }

    /// The shape of a plan: the next turn's kind, its number, whether it is the
    /// final one, reused and rebilled counts, and every call's action.
    #[derive(Debug, PartialEq)]
    struct Shape {
        next: &'static str,
        next_turn: u32,
        final_turn: bool,
        reused: u32,
        rebilled: u32,
        calls: Vec<CallAction>,
    }

    fn shape(next: &'static str, next_turn: u32, reused: u32) -> Shape {
        Shape {
            next,
            next_turn,
            final_turn: false,
            reused,
            rebilled: 0,
            calls: Vec::new(),
        }
    }

    fn check(j: &StepJournal, policy: OnInterrupted, max_turns: u32, expected: Shape) {
        let p = plan(&JournalInput {
            journal: j,
            iteration: 1,
            on_interrupted: policy,
            max_turns,
        })
        .expect("a readable journal");
        let got = Shape {
            next: match p.next {
                NextTurn::Fresh => "fresh",
                NextTurn::Again { .. } => "again",
                NextTurn::AfterCalls => "after_calls",
                NextTurn::Answered { .. } => "answered",
            },
            next_turn: p.next_turn,
            final_turn: p.final_turn,
            reused: p.reused_turns(),
            rebilled: p.rebilled(),
            calls: p.calls.iter().map(|c| c.action.clone()).collect(),
        };
        assert_eq!(got, expected, "{j:#?}");
    }

    fn reuse(index: u32, status: ToolCallStatus) -> CallAction {
        CallAction::Reuse {
            status,
            result: json!({"r": index}),
        }
    }

    #[test]
    fn every_turn_outcome() {
        use OnInterrupted::{Escalate, Rerun};
        use TurnStatus::*;
        // Nothing journaled: turn 1 with the prompt.
        check(&journal(vec![], vec![]), Rerun, 10, shape("fresh", 1, 0));
        // With max_turns 1 the first turn is already the final one.
        check(
            &journal(vec![], vec![]),
            Rerun,
            1,
            Shape {
                final_turn: true,
                ..shape("fresh", 1, 0)
            },
        );
        // Turn 1 in flight: requested again and billed twice.
        check(
            &journal(vec![turn(1, Started, None)], vec![]),
            Escalate,
            10,
            Shape {
                rebilled: 1,
                ..shape("again", 1, 0)
            },
        );
        // A failed turn is requested again, but it was not billed.
        check(
            &journal(
                vec![
                    turn(1, Completed, Some(calls_reply(1))),
                    turn(2, Failed, None),
                ],
                vec![call(1, 1, ToolEffect::Read, ToolCallStatus::Completed)],
            ),
            Rerun,
            10,
            shape("again", 2, 1),
        );
        // Turn 2 in flight after a reused turn 1; with max_turns 2 it is the final.
        check(
            &journal(
                vec![
                    turn(1, Completed, Some(calls_reply(1))),
                    turn(2, Started, None),
                ],
                vec![call(1, 1, ToolEffect::Write, ToolCallStatus::Completed)],
            ),
            Rerun,
            2,
            Shape {
                rebilled: 1,
                final_turn: true,
                ..shape("again", 2, 1)
            },
        );
        // The last turn answered without tool calls: nothing is requested.
        check(
            &journal(
                vec![
                    turn(1, Completed, Some(calls_reply(1))),
                    turn(2, Completed, Some(answer())),
                ],
                vec![call(1, 1, ToolEffect::Read, ToolCallStatus::Completed)],
            ),
            Rerun,
            2,
            shape("answered", 3, 2),
        );
        // A gap: turn 3 without turn 2 was never this loop's; it is ignored.
        check(
            &journal(
                vec![turn(1, Completed, Some(answer())), turn(3, Started, None)],
                vec![],
            ),
            Rerun,
            10,
            shape("answered", 2, 1),
        );
        // The model proposed calls on its final turn: past max_turns, still final.
        check(
            &journal(
                vec![turn(1, Completed, Some(calls_reply(1)))],
                vec![call(1, 1, ToolEffect::Read, ToolCallStatus::Completed)],
            ),
            Rerun,
            1,
            Shape {
                final_turn: true,
                calls: vec![reuse(1, ToolCallStatus::Completed)],
                ..shape("after_calls", 2, 1)
            },
        );
        // All calls of the last turn settled, the next turn not started yet; the
        // next turn (3 of 3) is the final one.
        check(
            &journal(
                vec![
                    turn(1, Completed, Some(calls_reply(1))),
                    turn(2, Completed, Some(calls_reply(2))),
                ],
                vec![
                    call(1, 1, ToolEffect::Read, ToolCallStatus::Completed),
                    call(2, 1, ToolEffect::Read, ToolCallStatus::Completed),
                    call(2, 2, ToolEffect::Write, ToolCallStatus::Failed),
                ],
            ),
            Rerun,
            3,
            Shape {
                final_turn: true,
                calls: vec![
                    reuse(1, ToolCallStatus::Completed),
                    reuse(2, ToolCallStatus::Failed),
                ],
                ..shape("after_calls", 3, 2)
            },
        );
    }

    #[test]
    fn every_call_outcome() {
        use OnInterrupted::{Escalate, Rerun};
        use ToolCallStatus::*;
        use ToolEffect::{Read, Write};
        let reply = |n| vec![turn(1, TurnStatus::Completed, Some(calls_reply(n)))];
        let after = |calls| Shape {
            calls,
            ..shape("after_calls", 2, 1)
        };
        // Settled calls are reused under either policy; a call with no row runs.
        for policy in [Rerun, Escalate] {
            check(
                &journal(
                    reply(5),
                    vec![
                        call(1, 1, Write, Completed),
                        call(1, 2, Write, Failed),
                        call(1, 3, Write, Rejected),
                        call(1, 4, Write, TimedOut),
                    ],
                ),
                policy,
                10,
                after(vec![
                    reuse(1, Completed),
                    reuse(2, Failed),
                    reuse(3, Rejected),
                    reuse(4, TimedOut),
                    CallAction::Run { attempt: 1 },
                ]),
            );
        }
        // A read call in flight runs again under either policy, attempt + 1.
        for policy in [Rerun, Escalate] {
            check(
                &journal(reply(1), vec![call(1, 1, Read, Started)]),
                policy,
                10,
                after(vec![CallAction::Rerun { attempt: 3 }]),
            );
        }
        // A write call in flight follows the policy.
        check(
            &journal(reply(1), vec![call(1, 1, Write, Started)]),
            Rerun,
            10,
            after(vec![CallAction::Rerun { attempt: 3 }]),
        );
        let escalated = CallAction::Escalate {
            tool: "lookup".into(),
            arguments: json!({"i": 1}),
        };
        check(
            &journal(reply(1), vec![call(1, 1, Write, Started)]),
            Escalate,
            10,
            after(vec![escalated.clone()]),
        );
        // A call already escalated stays escalated, whatever the policy now says.
        check(
            &journal(reply(1), vec![call(1, 1, Write, Escalated)]),
            Rerun,
            10,
            after(vec![escalated.clone()]),
        );
        // A waiting call is re-armed with its token and deadline.
        check(
            &journal(reply(1), vec![call(1, 1, Write, Waiting)]),
            Escalate,
            10,
            after(vec![CallAction::Rearm {
                token: "tok".into(),
                deadline: 900,
            }]),
        );
        // A waiting row that lost its approval is in flight: the policy decides.
        let mut lost = call(1, 1, Write, Waiting);
        lost.approval_token = None;
        check(
            &journal(reply(1), vec![lost]),
            Escalate,
            10,
            after(vec![escalated]),
        );
        // Attempt 0 (never recorded) counts as 1.
        let mut first = call(1, 1, Read, Started);
        first.attempt = 0;
        check(
            &journal(reply(1), vec![first]),
            Rerun,
            10,
            after(vec![CallAction::Rerun { attempt: 2 }]),
        );
    }

    #[test]
    fn another_iteration_starts_fresh() {
        let j = journal(vec![turn(1, TurnStatus::Completed, Some(answer()))], vec![]);
        let p = plan(&JournalInput {
            journal: &j,
            iteration: 2,
            on_interrupted: OnInterrupted::Rerun,
            max_turns: 10,
        })
        .expect("plan");
        assert_eq!(p.next, NextTurn::Fresh);
        assert_eq!((p.reused_turns(), p.tools.clone()), (0, None));
        assert_eq!(p.usage, Usage::default());
        assert!(p.conversation.is_empty());
    }

    #[test]
    fn a_call_not_started_comes_from_the_reply() {
        let j = journal(
            vec![turn(1, TurnStatus::Completed, Some(calls_reply(2)))],
            vec![call(1, 1, ToolEffect::Read, ToolCallStatus::Completed)],
        );
        let p = plan(&JournalInput {
            journal: &j,
            iteration: 1,
            on_interrupted: OnInterrupted::Rerun,
            max_turns: 10,
        })
        .expect("plan");
        let second = &p.calls[1];
        assert_eq!(second.call_index, 2);
        assert_eq!(second.call_id, "c2");
        assert_eq!(second.tool, "lookup");
        assert_eq!(second.arguments, json!({"i": 2}));
        assert_eq!(second.effect_key, "r1:triage:1:1:2");
        assert_eq!(p.calls[0].effect_key, "r1:triage:1:1:1");
    }

    #[test]
    fn the_conversation_is_rebuilt_in_order() {
        let j = journal(
            vec![
                turn(1, TurnStatus::Completed, Some(calls_reply(1))),
                turn(2, TurnStatus::Started, None),
            ],
            vec![call(1, 1, ToolEffect::Read, ToolCallStatus::Completed)],
        );
        let p = plan(&JournalInput {
            journal: &j,
            iteration: 1,
            on_interrupted: OnInterrupted::Rerun,
            max_turns: 10,
        })
        .expect("plan");
        assert_eq!(
            p.conversation,
            vec![
                json!({"role": "user", "content": "m1"}),
                calls_reply(1),
                json!({"role": "user", "content": "m2"}),
            ]
        );
        assert_eq!(
            p.next,
            NextTurn::Again {
                turn: 2,
                messages: vec![json!({"role": "user", "content": "m2"})],
                rebilled: true,
            }
        );
        assert_eq!(p.reused[0].reply, calls_reply(1));
        assert_eq!(p.tools, Some(json!([{"name": "disk_usage"}])));
        assert!(
            p.calls.is_empty(),
            "the calls before a requested turn are done"
        );
    }

    #[test]
    fn usage_counts_every_turn_once_with_delegations() {
        let mut sub = turn_at(
            "triage/delegate/abc",
            1,
            TurnStatus::Completed,
            Some(answer()),
        );
        sub.cost_usd = None;
        let mut later = turn(1, TurnStatus::Completed, Some(answer()));
        later.iteration = 2;
        let j = journal(
            vec![
                turn(1, TurnStatus::Completed, Some(calls_reply(1))),
                turn(2, TurnStatus::Started, None),
                sub,
                later,
            ],
            vec![],
        );
        let p = plan(&JournalInput {
            journal: &j,
            iteration: 1,
            on_interrupted: OnInterrupted::Rerun,
            max_turns: 10,
        })
        .expect("plan");
        // Iteration 1: turns 1 and 2 of the step and the sub-agent's turn 1.
        assert_eq!(
            p.usage,
            Usage {
                input_tokens: 10 + 20 + 10,
                output_tokens: 1 + 2 + 1,
                cost_usd: Some(1.0),
            }
        );
        assert_eq!(j.usage().input_tokens, 50);
        assert_eq!(j.usage().cost_usd, Some(1.5));
        assert_eq!(j.usage_of_iteration(2).tokens(), 11);
        assert_eq!(StepJournal::default().usage(), Usage::default());
        // The sub-agent's turns are not the step's conversation.
        assert_eq!(p.reused_turns(), 1);
    }

    #[test]
    fn delegations_completed_are_reused_failed_run_again() {
        let d = |key: &str, status: DelegationStatus, output: Option<&str>| DelegationRecord {
            run_id: RUN.into(),
            step_path: STEP.into(),
            key: key.into(),
            agent: "db-expert".into(),
            question: "why?".into(),
            status,
            output_json: output.map(str::to_string),
            journal_path: delegation_path(STEP, key),
            started_at: 1,
            finished_at: None,
        };
        let mut nested = d("n", DelegationStatus::Completed, Some("1"));
        nested.step_path = "triage/delegate/a".into();
        let mut j = journal(vec![], vec![]);
        j.delegations = vec![
            d("a", DelegationStatus::Completed, Some(r#"{"answer":42}"#)),
            d("b", DelegationStatus::Failed, None),
            d("c", DelegationStatus::Started, None),
            d("e", DelegationStatus::Completed, Some("not json")),
            nested,
        ];
        let p = plan(&JournalInput {
            journal: &j,
            iteration: 1,
            on_interrupted: OnInterrupted::Rerun,
            max_turns: 10,
        })
        .expect("plan");
        let got: Vec<(&str, &DelegationAction)> = p
            .delegations
            .iter()
            .map(|d| (d.key.as_str(), &d.action))
            .collect();
        let reuse = DelegationAction::Reuse {
            output: json!({"answer": 42}),
        };
        assert_eq!(
            got,
            vec![
                ("a", &reuse),
                ("b", &DelegationAction::Run),
                ("c", &DelegationAction::Run),
                ("e", &DelegationAction::Run),
            ],
            "the sub-agent's own delegation is its plan's, not the step's"
        );
        assert_eq!(
            p.delegation("a").map(|d| d.journal_path.as_str()),
            Some("triage/delegate/a")
        );
        assert_eq!(p.delegation("zz"), None);
    }

    #[test]
    fn a_sub_agent_is_planned_from_its_part_of_the_journal() {
        let path = "triage/delegate/abc";
        let j = journal(
            vec![
                turn(1, TurnStatus::Completed, Some(calls_reply(1))),
                turn_at(path, 1, TurnStatus::Completed, Some(answer())),
            ],
            vec![],
        );
        let sub = j.sub(path);
        assert_eq!(sub.turns.len(), 1);
        let p = plan(&JournalInput {
            journal: &sub,
            iteration: 1,
            on_interrupted: OnInterrupted::Rerun,
            max_turns: 10,
        })
        .expect("plan");
        assert_eq!(p.next, NextTurn::Answered { reply: answer() });
    }

    #[test]
    fn an_unreadable_row_is_an_error_not_a_guess() {
        let mut bad = turn(1, TurnStatus::Completed, Some(answer()));
        bad.messages_json = "{not json".into();
        let plan_of = |t: TurnRecord| {
            let j = journal(vec![t], vec![]);
            plan(&JournalInput {
                journal: &j,
                iteration: 1,
                on_interrupted: OnInterrupted::Rerun,
                max_turns: 10,
            })
        };
        assert!(matches!(
            plan_of(bad),
            Err(Error::BadJson {
                column: "messages_json",
                turn: 1,
                ..
            })
        ));
        let mut object = turn(1, TurnStatus::Completed, Some(answer()));
        object.messages_json = "{}".into();
        assert!(matches!(plan_of(object), Err(Error::BadJson { .. })));
        let no_reply = turn(1, TurnStatus::Completed, None);
        assert_eq!(
            plan_of(no_reply).map(|_| ()).unwrap_err().to_string(),
            "the journal of `triage` has turn 1 completed without a reply"
        );
    }

    #[test]
    fn keys_and_paths() {
        assert_eq!(effect_key("r", "g/b", 2, 3, 4), "r:g/b:2:3:4");
        let k = delegation_key("db-expert", "why?", "{}");
        assert_eq!(k.len(), 64);
        assert_eq!(k, blake3::hash(b"db-expert|why?|{}").to_hex().to_string());
        assert_ne!(k, delegation_key("db-expert", "why?", "{\"x\":1}"));
        assert_eq!(
            delegation_path("triage", &k),
            format!("triage/delegate/{}", &k[..12])
        );
        assert_eq!(
            tool_message("c1", &json!({"free": 3})),
            json!({"role": "tool", "tool_call_id": "c1", "content": "{\"free\":3}"})
        );
        assert_eq!(
            tool_message("c1", &json!("plain")),
            json!({"role": "tool", "tool_call_id": "c1", "content": "plain"})
        );
    }
}
