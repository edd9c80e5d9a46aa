//! `agent` steps whose agent uses tools: a loop of turns (decided by `run::turns`),
//! every turn and tool call journaled (resumed by `run::journal`), so that a crash
//! costs no model call, no tool effect twice.
//!
//! Write order, each line one commit (one fsync):
//! 1. turn N `started` with its new messages (the tool results of turn N-1 ride in
//!    this commit as their calls' `completed` rows);
//! 2. turn N `completed` with its reply and usage, together with its first tool
//!    call `started`;
//! 3. each further call `started`, together with the previous call's result;
//! 4. the answer: the last turn `completed` (the step's own record follows).
//!
//! Agents without tools keep the one-shot `agent` executor.

mod model;
mod toolbox;

use std::sync::Arc;

use serde_json::Value;

use super::human::tool as human_tool;
use super::unit::{CallFailure, HumanMode, UnitFacts};
use super::Services;
use crate::agent::openai::{self, AssistantReply, ToolSpec};
use crate::domain::{DelegationStatus, ToolCallStatus, ToolEffect, TurnStatus};
use crate::events::Event;
use crate::executor::{agent as single, Call, Outcome};
use crate::pipeline::{ExecutorConfig, OnInterrupted};
use crate::run::journal::{self, CallAction, JournalInput, NextTurn};
use crate::run::turns::{self, AfterReply, CallCheck, CallStep, Reply, TurnKind};
use crate::run::{StepOutput, Usage};
use crate::store::{ToolCallRecord, TurnRecord, Write};
use model::{Model, ModelError};
use toolbox::{Tool, Toolbox};

/// Whether the step's agent runs the loop: it lists tools or delegates, or its
/// provider is scripted (which the one-shot executor cannot call).
pub(super) fn runs_loop(config: &crate::config::Config, call: &Call<'_>) -> bool {
    runs_loop_for(config, call.action)
}

/// [`runs_loop`] for a step's action: such a step is resumed from its journal,
/// which decides per turn and per call (under `on_interrupted: escalate` too).
pub(super) fn runs_loop_for(
    config: &crate::config::Config,
    action: &crate::pipeline::Action,
) -> bool {
    let ExecutorConfig::Agent(a) = &action.config else {
        return false;
    };
    let Some(agent) = config.agents.get(&a.agent) else {
        return false;
    };
    let scripted = config
        .providers
        .get(&agent.provider)
        .is_some_and(|p| matches!(p.kind, crate::config::ProviderKind::Scripted { .. }));
    !agent.tools.is_empty() || !agent.delegates.is_empty() || scripted
}

/// One tool an agent may use, as `vectorstep tools list` shows it.
#[derive(Debug, Clone)]
pub struct ListedTool {
    pub name: String,
    pub source: String,
    pub effect: ToolEffect,
    pub needs_approval: bool,
}

/// The tools `agent` would be offered now (MCP servers are asked), and the
/// `only` entries a live server does not have (`server/tool`).
pub async fn list_tools(
    config: &crate::config::Config,
    mcp: &crate::mcp::McpServers,
    agent: &str,
) -> Result<(Vec<ListedTool>, Vec<String>), String> {
    let b = Toolbox::gather(config, mcp, agent).await?;
    let tools = b
        .tools
        .iter()
        .map(|t| ListedTool {
            name: t.spec.name.clone(),
            source: match &t.source {
                toolbox::Source::Declared => "declared".to_string(),
                toolbox::Source::Mcp { server } => format!("mcp:{server}"),
                toolbox::Source::Delegate => "delegate".to_string(),
            },
            effect: t.effect,
            needs_approval: t.needs_approval,
        })
        .collect();
    let missing = b.missing.iter().map(|(s, t)| format!("{s}/{t}")).collect();
    Ok((tools, missing))
}

/// One agent step's loop, in the task of its step.
struct Loop<'a> {
    services: &'a Arc<Services>,
    call: &'a Call<'a>,
    iteration: u32,
    model: Model<'a>,
    toolbox: Toolbox,
    max_turns: u32,
    /// Writes that ride in the next commit (see the write order above).
    pending: Vec<Write>,
    /// Usage of every turn of this iteration, journaled ones included.
    usage: Usage,
    /// How long the last tool call took (recorded with its result).
    last_duration_ms: u64,
    /// The run's team and stage (a tool approval is routed by them).
    team: Option<String>,
    stage: String,
    /// The run's spending before this step, and its budget.
    spent: Usage,
    budget: Option<&'a crate::pipeline::Budget>,
    /// What the step's own calls need to start a delegation's loop.
    facts: UnitFacts<'a>,
    policy: OnInterrupted,
    /// Whether a tool approval may park the run, and whether this drive is the one
    /// that unparked it (what was reused is then not logged again: to the run log a
    /// parked wait is one uninterrupted wait). Delegations never park.
    human: HumanMode,
    /// Delegations completed before a restart, by key: their answers are reused.
    delegated: std::collections::HashMap<String, Value>,
}

pub(super) async fn run<'a>(
    services: &'a Arc<Services>,
    call: &'a Call<'a>,
    facts: UnitFacts<'a>,
    policy: OnInterrupted,
    human: HumanMode,
) -> Result<Outcome, CallFailure> {
    let ExecutorConfig::Agent(a) = &call.action.config else {
        return Err(CallFailure::Config(
            "executor_config.agent is missing".into(),
        ));
    };
    let config = &services.config;
    let model = Model::new(config, &services.http, &a.agent).map_err(model_failure)?;
    let iteration = facts.record.iteration;
    let recorded = super::persist::read(services, call.run_id, || {
        services.store.journal(call.run_id, call.step_path)
    })
    .await
    .map_err(|e| CallFailure::Error(e.to_string()))?;
    let plan = journal::plan(&JournalInput {
        journal: &recorded,
        iteration,
        on_interrupted: policy,
        max_turns: model.agent.max_turns,
    })
    .map_err(|e| CallFailure::Config(e.to_string()))?;
    let toolbox = match &plan.tools {
        Some(v) => Toolbox::from_json(v).map_err(CallFailure::Config)?,
        None => Toolbox::gather(config, &services.mcp, &a.agent)
            .await
            .map_err(CallFailure::Error)?,
    };
    let mut lp = Loop {
        services,
        call,
        iteration,
        max_turns: model.agent.max_turns,
        model,
        toolbox,
        pending: Vec::new(),
        usage: plan.usage,
        last_duration_ms: 0,
        team: facts.team.map(str::to_string),
        stage: facts.stage.to_string(),
        spent: facts.spent,
        budget: facts.budget,
        facts,
        policy,
        human,
        delegated: plan
            .delegations
            .iter()
            .filter_map(|d| match &d.action {
                journal::DelegationAction::Reuse { output } => {
                    Some((d.key.clone(), output.clone()))
                }
                journal::DelegationAction::Run => None,
            })
            .collect(),
    };
    let metric =
        |outcome: &str, n: u64| crate::telemetry::agent_turns(call.pipeline, &a.agent, outcome, n);
    if plan.reused_turns() > 0 && !human.unparked {
        metric("reused", u64::from(plan.reused_turns()));
        lp.pending.push(lp.ev(
            Event::AgentTurnReused {
                step: call.step_path.to_string(),
                turns: plan.reused_turns(),
            },
            format!(
                "{}: {} recorded turn(s) reused, no model call",
                call.step_path,
                plan.reused_turns()
            ),
        ));
    }
    let mut conversation = plan.conversation;
    let (turn, new_messages) = match plan.next {
        NextTurn::Answered { reply } => {
            let reply = openai::parse_message(&reply, plan.next_turn.saturating_sub(1))
                .map_err(CallFailure::Config)?;
            lp.commit(Vec::new()).await?;
            return lp.answer(&reply).map_err(CallFailure::Error);
        }
        NextTurn::Fresh => (1, openai::first_messages(lp.model.agent, &call.prompt)),
        // The recorded messages of the turn are the tail of `conversation` already.
        NextTurn::Again {
            turn,
            messages,
            rebilled,
        } => {
            if rebilled {
                crate::telemetry::agent_rebilled(call.pipeline, &a.agent);
            }
            metric("rerun", 1);
            let n = conversation.len().saturating_sub(messages.len());
            conversation.truncate(n);
            (turn, messages)
        }
        NextTurn::AfterCalls => {
            let pending = plan.calls.into_iter().map(|c| lp.resumed_call(c)).collect();
            let results = lp.settle_calls(plan.next_turn - 1, pending).await?;
            (plan.next_turn, results)
        }
    };
    lp.turns(turn, conversation, new_messages).await
}

/// One question put to another agent through the `delegate` tool.
struct Delegation {
    agent: String,
    question: String,
    context: String,
    key: String,
    path: String,
}

impl Delegation {
    fn of(arguments: &Value, step_path: &str) -> Delegation {
        let text = |k: &str| {
            arguments
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let (agent, question, context) = (text("agent"), text("question"), text("context"));
        let key = journal::delegation_key(&agent, &question, &context);
        let path = journal::delegation_path(step_path, &key);
        Delegation {
            agent,
            question,
            context,
            key,
            path,
        }
    }

    fn prompt(&self) -> String {
        if self.context.is_empty() {
            self.question.clone()
        } else {
            format!("{}\n\nContext:\n{}", self.question, self.context)
        }
    }
}

fn failure_text(e: &CallFailure) -> String {
    match e {
        CallFailure::Error(m) | CallFailure::Config(m) | CallFailure::Escalate(m) => m.clone(),
        CallFailure::Drained => "the service is shutting down".into(),
        CallFailure::Parked => "parked".into(),
    }
}

/// A tool call the loop still has to settle, and how.
struct PendingCall {
    index: u32,
    call_id: String,
    tool: String,
    arguments: Value,
    effect_key: String,
    action: PendingAction,
}

enum PendingAction {
    Reuse(Value),
    Refuse(String),
    Run {
        attempt: u32,
    },
    Escalate,
    /// Ask a human first; `Some(token)`: the request exists (re-armed after a restart).
    Approve(Option<String>),
}

impl<'a> Loop<'a> {
    /// Before turn `turn`: when the run's budget is spent (what it spent before
    /// this step plus every journaled turn of it), the loop stops here. The step
    /// ends with what it has; the driver's budget check then ends the run
    /// (`budget_exceeded`), as after any step.
    fn budget_spent(&self, turn: u32) -> Option<Outcome> {
        let budget = self.budget?;
        let mut total = self.spent;
        total.add(&self.usage);
        let msg = crate::run::flow::budget_exceeded(
            budget,
            total.tokens(),
            total.cost_usd.unwrap_or(0.0),
        )?;
        let output = StepOutput::new(1.0, format!("stopped before turn {turn}: {msg}"));
        Some(Outcome {
            output,
            usage: self.usage,
        })
    }

    fn turn_metric(&self, outcome: &str) {
        crate::telemetry::agent_turns(self.call.pipeline, self.model.agent_name, outcome, 1);
    }

    fn tool_metric(&self, tool: &str, outcome: &str) {
        crate::telemetry::tool_call(self.call.pipeline, tool, outcome);
    }

    fn ev(&self, event: Event, msg: impl Into<String>) -> Write {
        event.write(self.call.run_id, self.services.now_ms(), msg)
    }

    async fn commit(&mut self, writes: Vec<Write>) -> Result<(), CallFailure> {
        let mut all = std::mem::take(&mut self.pending);
        all.extend(writes);
        if all.is_empty() {
            return Ok(());
        }
        super::persist::commit(self.services, self.call.run_id, all)
            .await
            .map(|_| ())
            .map_err(|e| {
                if self.services.is_shutting_down() {
                    CallFailure::Drained
                } else {
                    CallFailure::Error(e.to_string())
                }
            })
    }

    /// Turns from `turn` on until the model answers.
    async fn turns(
        &mut self,
        mut turn: u32,
        mut conversation: Vec<Value>,
        mut new_messages: Vec<Value>,
    ) -> Result<Outcome, CallFailure> {
        loop {
            if self.services.is_shutting_down() {
                self.commit(Vec::new()).await?;
                return Err(CallFailure::Drained);
            }
            if let Some(out) = self.budget_spent(turn) {
                self.commit(Vec::new()).await?;
                return Ok(out);
            }
            let kind = turns::turn_kind(turn, self.max_turns);
            let started = self.turn_record(turn, &new_messages);
            self.commit(vec![Write::UpsertTurn(started.clone())])
                .await?;
            conversation.append(&mut new_messages);
            let tools: Vec<ToolSpec> = match kind {
                TurnKind::WithTools => self.toolbox.specs(),
                TurnKind::Final => Vec::new(),
            };
            let key = format!("{}:turn:{turn}", self.call.idempotency_key);
            let answer = self
                .model
                .ask(turn, &conversation, &tools, &key)
                .await
                .map_err(model_failure)?;
            self.usage.add(&answer.usage);
            let reply = answer.reply;
            // The whole row again (an upsert replaces it): messages and tools as started.
            let mut done = TurnRecord {
                status: TurnStatus::Completed,
                reply_json: Some(reply.to_message().to_string()),
                input_tokens: answer.usage.input_tokens,
                output_tokens: answer.usage.output_tokens,
                cost_usd: answer.usage.cost_usd,
                finished_at: Some(self.services.now_ms()),
                ..started
            };
            conversation.push(reply.to_message());
            let completed = self.ev(
                Event::AgentTurnCompleted {
                    step: self.call.step_path.to_string(),
                    turn,
                    tool_calls: reply.tool_calls.len() as u32,
                    input_tokens: answer.usage.input_tokens,
                    output_tokens: answer.usage.output_tokens,
                },
                format!("{}: turn {turn} answered", self.call.step_path),
            );
            match turns::after_reply(self.read_reply(&reply), turn, self.max_turns) {
                AfterReply::Answer(_) => {
                    self.commit(vec![Write::UpsertTurn(done), completed])
                        .await?;
                    self.turn_metric(TurnStatus::Completed.as_str());
                    return self.answer(&reply).map_err(CallFailure::Error);
                }
                AfterReply::Fail(e) => {
                    // Recorded as failed: a retry of the step asks this turn again.
                    done.status = TurnStatus::Failed;
                    done.error = Some(e.clone());
                    self.commit(vec![Write::UpsertTurn(done), completed])
                        .await?;
                    self.turn_metric(TurnStatus::Failed.as_str());
                    return Err(CallFailure::Error(e));
                }
                AfterReply::AskForContract(text) => {
                    self.turn_metric(TurnStatus::Completed.as_str());
                    self.pending.push(Write::UpsertTurn(done));
                    self.pending.push(completed);
                    new_messages = vec![serde_json::json!({"role": "user", "content": text})];
                }
                AfterReply::Calls(steps) => {
                    self.turn_metric(TurnStatus::Completed.as_str());
                    self.pending.push(Write::UpsertTurn(done));
                    self.pending.push(completed);
                    let pending = reply
                        .tool_calls
                        .iter()
                        .zip(steps)
                        .enumerate()
                        .map(|(i, (c, step))| self.fresh_call(turn, i as u32 + 1, c, step))
                        .collect();
                    new_messages = self.settle_calls(turn, pending).await?;
                }
            }
            turn += 1;
        }
    }

    /// Turn `turn` recorded as `started` with its new messages (and, on turn 1,
    /// the tools offered).
    fn turn_record(&self, turn: u32, messages: &[Value]) -> TurnRecord {
        TurnRecord {
            run_id: self.call.run_id.to_string(),
            step_path: self.call.step_path.to_string(),
            iteration: self.iteration,
            turn,
            status: TurnStatus::Started,
            messages_json: Value::Array(messages.to_vec()).to_string(),
            reply_json: None,
            tools_json: (turn == 1).then(|| self.toolbox.to_json().to_string()),
            input_tokens: 0,
            output_tokens: 0,
            cost_usd: None,
            error: None,
            started_at: self.services.now_ms(),
            finished_at: None,
        }
    }

    /// The reply as `run::turns` reads it: the answer checked against the output
    /// contract, or each call checked against the tools offered.
    fn read_reply(&self, reply: &AssistantReply) -> Reply {
        if reply.is_final() {
            return Reply::Answer(
                single::parse_reply(reply.content.as_deref().unwrap_or(""))
                    .map(Box::new)
                    .map_err(|e| format!("agent `{}` {e}", self.model.agent_name)),
            );
        }
        Reply::Calls(
            reply
                .tool_calls
                .iter()
                .map(|c| self.check(&c.name, &c.arguments, c.arguments_error.as_deref()))
                .collect(),
        )
    }

    fn check(&self, name: &str, arguments: &Value, unreadable: Option<&str>) -> CallCheck {
        let tool = self.toolbox.get(name);
        let arguments = match (unreadable, tool) {
            (Some(e), _) => Err(e.to_string()),
            (None, Some(t)) => crate::agent::schema::validate(&t.spec.parameters, arguments),
            (None, None) => Ok(()),
        };
        CallCheck {
            known: tool.is_some(),
            arguments,
            needs_approval: tool.is_some_and(|t| t.needs_approval),
        }
    }

    fn answer(&self, reply: &AssistantReply) -> Result<Outcome, String> {
        let agent = self.model.agent;
        let mut output: StepOutput = single::parse_reply(reply.content.as_deref().unwrap_or(""))
            .map_err(|e| format!("agent `{}` {e}", self.model.agent_name))?;
        output
            .extra
            .entry("model")
            .or_insert_with(|| Value::from(agent.model.clone()));
        output
            .extra
            .entry("provider")
            .or_insert_with(|| Value::from(agent.provider.clone()));
        Ok(Outcome {
            output,
            usage: self.usage,
        })
    }

    fn fresh_call(
        &self,
        turn: u32,
        index: u32,
        c: &openai::ToolCall,
        step: CallStep,
    ) -> PendingCall {
        PendingCall {
            index,
            call_id: c.id.clone(),
            tool: c.name.clone(),
            arguments: c.arguments.clone(),
            effect_key: journal::effect_key(
                self.call.run_id,
                self.call.step_path,
                self.iteration,
                turn,
                index,
            ),
            action: match step {
                CallStep::Run => PendingAction::Run { attempt: 1 },
                CallStep::AskApproval => PendingAction::Approve(None),
                CallStep::Refuse(m) => PendingAction::Refuse(m),
            },
        }
    }

    fn resumed_call(&self, c: journal::CallPlan) -> PendingCall {
        let action = match c.action {
            CallAction::Reuse { result, .. } => PendingAction::Reuse(result),
            CallAction::Run { attempt } | CallAction::Rerun { attempt } => {
                // A call that never started is checked as a fresh one would be.
                let check = self.check(&c.tool, &c.arguments, None);
                match turns::after_reply(Reply::Calls(vec![check]), 1, u32::MAX) {
                    AfterReply::Calls(mut s) => match s.pop() {
                        Some(CallStep::Refuse(m)) => PendingAction::Refuse(m),
                        Some(CallStep::AskApproval) if attempt == 1 => PendingAction::Approve(None),
                        _ => PendingAction::Run { attempt },
                    },
                    _ => PendingAction::Run { attempt },
                }
            }
            CallAction::Escalate { .. } => PendingAction::Escalate,
            CallAction::Rearm { token, .. } => PendingAction::Approve(Some(token)),
        };
        PendingCall {
            index: c.call_index,
            call_id: c.call_id,
            tool: c.tool,
            arguments: c.arguments,
            effect_key: c.effect_key,
            action,
        }
    }

    /// Settles the calls of one turn in order; returns their result messages, the
    /// next turn's new messages. Results are recorded in the next commit.
    async fn settle_calls(
        &mut self,
        turn: u32,
        calls: Vec<PendingCall>,
    ) -> Result<Vec<Value>, CallFailure> {
        let mut delegated = self.run_delegations(turn, &calls).await?;
        let mut messages = Vec::new();
        for c in calls {
            let result = match c.action {
                PendingAction::Reuse(ref result) => {
                    if !self.human.unparked {
                        let ev = self.ev(
                            Event::ToolCallReused {
                                step: self.call.step_path.to_string(),
                                turn,
                                call_index: c.index,
                                tool: c.tool.clone(),
                            },
                            format!(
                                "{}: recorded result of `{}` reused",
                                self.call.step_path, c.tool
                            ),
                        );
                        self.pending.push(ev);
                        self.tool_metric(&c.tool, "reused");
                    }
                    messages.push(journal::tool_message(&c.call_id, result));
                    continue;
                }
                PendingAction::Refuse(ref m) => toolbox::ToolResult {
                    text: m.clone(),
                    failed: true,
                },
                PendingAction::Escalate => {
                    let why = format!(
                        "escalated on resume (durable.on_interrupted=escalate): the write call `{}` with arguments {} was in flight when the process stopped and was not run again",
                        c.tool, c.arguments
                    );
                    let rec = self.call_record(turn, &c, ToolCallStatus::Escalated, 1, Some(&why));
                    self.commit(vec![Write::UpsertToolCall(rec)]).await?;
                    return Err(CallFailure::Escalate(why));
                }
                PendingAction::Approve(ref rearm) => {
                    let token = match rearm {
                        Some(t) => self.rearm_approval(t).await?,
                        None => self.ask_approval(turn, &c).await?,
                    };
                    if self.human.may_park && self.park_on(&token).await? {
                        return Err(CallFailure::Parked);
                    }
                    let decision = human_tool::decision(self.services, self.call, &token).await?;
                    if self.human.may_park {
                        // The step may have been parked `waiting`: it runs again.
                        self.pending
                            .push(Write::UpsertStep(self.facts.record.clone()));
                    }
                    self.decided(turn, &c, &decision);
                    match turns::after_decision(&decision, &c.tool) {
                        CallStep::Run => self.run_call(turn, &c, 1).await?,
                        CallStep::Refuse(m) => {
                            let status = match decision {
                                turns::Decision::TimedOut => ToolCallStatus::TimedOut,
                                _ => ToolCallStatus::Rejected,
                            };
                            let text = Value::String(m);
                            let mut rec = self.call_record(turn, &c, status, 1, None);
                            rec.result_json = Some(text.to_string());
                            rec.approval_token = Some(token);
                            self.pending.push(Write::UpsertToolCall(rec));
                            self.tool_metric(&c.tool, ToolCallStatus::Rejected.as_str());
                            messages.push(journal::tool_message(&c.call_id, &text));
                            continue;
                        }
                        // `after_decision` never asks again; should it, nothing runs.
                        CallStep::AskApproval => toolbox::ToolResult {
                            text: "not run: the approval is still open".into(),
                            failed: true,
                        },
                    }
                }
                PendingAction::Run { attempt } => match delegated.remove(&c.index) {
                    Some(r) => r,
                    None => self.run_call(turn, &c, attempt).await?,
                },
            };
            let status = if result.failed {
                ToolCallStatus::Failed
            } else {
                ToolCallStatus::Completed
            };
            let attempt = match c.action {
                PendingAction::Run { attempt } => attempt,
                _ => 1,
            };
            self.tool_metric(
                &c.tool,
                match (result.failed, attempt) {
                    (true, _) => ToolCallStatus::Failed.as_str(),
                    (false, 1) => ToolCallStatus::Completed.as_str(),
                    (false, _) => "rerun",
                },
            );
            let text = Value::String(result.text);
            let rec = self.call_record(turn, &c, status, attempt, None);
            let rec = ToolCallRecord {
                result_json: Some(text.to_string()),
                ..rec
            };
            let ev = if result.failed {
                Event::ToolCallFailed {
                    step: self.call.step_path.to_string(),
                    turn,
                    call_index: c.index,
                    tool: c.tool.clone(),
                    error: crate::executor::http::excerpt(text.as_str().unwrap_or(""), 300),
                }
            } else {
                Event::ToolCallCompleted {
                    step: self.call.step_path.to_string(),
                    turn,
                    call_index: c.index,
                    tool: c.tool.clone(),
                    duration_ms: rec.duration_ms.unwrap_or(0),
                }
            };
            let ev = self.ev(
                ev,
                format!("{}: tool `{}` {status}", self.call.step_path, c.tool),
            );
            self.pending.push(Write::UpsertToolCall(rec));
            self.pending.push(ev);
            messages.push(journal::tool_message(&c.call_id, &text));
        }
        Ok(messages)
    }

    /// Runs this turn's `delegate` calls, all at once: their `started` rows in one
    /// commit, then every sub-agent concurrently. Results by call index.
    async fn run_delegations(
        &mut self,
        turn: u32,
        calls: &[PendingCall],
    ) -> Result<std::collections::HashMap<u32, toolbox::ToolResult>, CallFailure> {
        let mut out = std::collections::HashMap::new();
        let mut started = Vec::new();
        let mut jobs = Vec::new();
        for c in calls {
            let PendingAction::Run { attempt } = c.action else {
                continue;
            };
            let Some(tool) = self.toolbox.get(&c.tool).cloned() else {
                continue;
            };
            if tool.source != toolbox::Source::Delegate {
                continue;
            }
            let ask = Delegation::of(&c.arguments, self.call.step_path);
            if let Some(answer) = self.delegated.get(&ask.key) {
                let ev = self.ev(
                    Event::DelegationReused {
                        step: self.call.step_path.to_string(),
                        agent: ask.agent.clone(),
                        key: ask.key.clone(),
                    },
                    format!(
                        "{}: the answer of `{}` was reused",
                        self.call.step_path, ask.agent
                    ),
                );
                self.pending.push(ev);
                let text = match answer {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                out.insert(
                    c.index,
                    toolbox::ToolResult {
                        text,
                        failed: false,
                    },
                );
                continue;
            }
            started.push(Write::UpsertToolCall(self.call_record_of(
                turn,
                c,
                &tool,
                ToolCallStatus::Started,
                attempt,
            )));
            started.push(Write::UpsertDelegation(self.delegation_record(
                &ask,
                DelegationStatus::Started,
                None,
            )));
            jobs.push((c.index, ask));
        }
        if jobs.is_empty() {
            return Ok(out);
        }
        self.commit(started).await?;
        let asks = jobs.iter().map(|(_, ask)| self.delegate(ask));
        let answers = futures::future::join_all(asks).await;
        // The sub-agents' turns are in the journal (also those reused from before a
        // restart, which the plan already counted): the usage is read back from it
        // rather than added up, so nothing counts twice.
        let journal = super::persist::read(self.services, self.call.run_id, || {
            self.services
                .store
                .journal(self.call.run_id, self.call.step_path)
        })
        .await
        .map_err(|e| CallFailure::Error(e.to_string()))?;
        self.usage = journal.usage_of_iteration(self.iteration);
        for ((index, _), answer) in jobs.into_iter().zip(answers) {
            out.insert(index, answer?);
        }
        Ok(out)
    }

    /// One delegation: the sub-agent's loop, then its row settled in a commit of
    /// its own as soon as it ends (a kill after two of four answered keeps two).
    async fn delegate(&self, ask: &Delegation) -> Result<toolbox::ToolResult, CallFailure> {
        let answer = self.sub_agent(ask).await;
        let (status, result) = match answer {
            Ok(o) => (
                DelegationStatus::Completed,
                toolbox::ToolResult {
                    text: o.output.to_json().to_string(),
                    failed: false,
                },
            ),
            Err(CallFailure::Drained) => return Err(CallFailure::Drained),
            Err(e) => (
                DelegationStatus::Failed,
                toolbox::ToolResult {
                    text: format!(
                        "error: agent `{}` could not answer: {}",
                        ask.agent,
                        failure_text(&e)
                    ),
                    failed: true,
                },
            ),
        };
        let output =
            (status == DelegationStatus::Completed).then(|| Value::String(result.text.clone()));
        let mut writes = vec![Write::UpsertDelegation(
            self.delegation_record(ask, status, output),
        )];
        if status == DelegationStatus::Completed {
            writes.push(self.ev(
                Event::DelegationCompleted {
                    step: self.call.step_path.to_string(),
                    agent: ask.agent.clone(),
                    key: ask.key.clone(),
                },
                format!("{}: `{}` answered", self.call.step_path, ask.agent),
            ));
        }
        super::persist::commit(self.services, self.call.run_id, writes)
            .await
            .map_err(|e| CallFailure::Error(e.to_string()))?;
        Ok(result)
    }

    /// The sub-agent's own loop, journaled under the delegation's path.
    async fn sub_agent(&self, ask: &Delegation) -> Result<Outcome, CallFailure> {
        let config =
            crate::pipeline::ExecutorConfig::Agent(crate::pipeline::executor_config::AgentConfig {
                agent: ask.agent.clone(),
            });
        let action = crate::pipeline::Action {
            config,
            agent: Some(ask.agent.clone()),
            ..self.call.action.clone()
        };
        let key = format!("{}:{}", self.call.idempotency_key, ask.path);
        let call = Call {
            run_id: self.call.run_id,
            pipeline: self.call.pipeline,
            step_path: &ask.path,
            idempotency_key: &key,
            attempt: self.call.attempt,
            action: &action,
            prompt: ask.prompt(),
            rendered: Default::default(),
            timeout: self.call.timeout,
        };
        let mut facts = self.facts;
        facts.spent.add(&self.usage);
        let human = HumanMode {
            may_park: false,
            unparked: false,
        };
        Box::pin(run(self.services, &call, facts, self.policy, human)).await
    }

    fn delegation_record(
        &self,
        ask: &Delegation,
        status: DelegationStatus,
        output: Option<Value>,
    ) -> crate::store::DelegationRecord {
        let now = self.services.now_ms();
        crate::store::DelegationRecord {
            run_id: self.call.run_id.to_string(),
            step_path: self.call.step_path.to_string(),
            key: ask.key.clone(),
            agent: ask.agent.clone(),
            question: ask.question.clone(),
            status,
            output_json: output.map(|o| o.to_string()),
            journal_path: ask.path.clone(),
            started_at: now,
            finished_at: (status != DelegationStatus::Started).then_some(now),
        }
    }

    /// Puts call `c` to a human: the approval row, the call's `waiting` record and
    /// the event in one commit, then the delivery. Returns the token.
    async fn ask_approval(&mut self, turn: u32, c: &PendingCall) -> Result<String, CallFailure> {
        let req = human_tool::ToolRequest {
            tool: &c.tool,
            arguments: &c.arguments,
            team: self.team.as_deref(),
            stage: &self.stage,
            timeout_seconds: self.model.agent.approval_timeout_seconds,
        };
        let a = human_tool::new_request(self.services, self.call, &req, self.services.now_ms());
        let mut rec = self.call_record(turn, c, ToolCallStatus::Waiting, 1, None);
        rec.approval_token = Some(a.token.clone());
        rec.approval_deadline = Some(a.deadline_at);
        rec.finished_at = None;
        rec.duration_ms = None;
        let ev = self.ev(
            Event::ToolApprovalRequested {
                step: self.call.step_path.to_string(),
                turn,
                call_index: c.index,
                tool: c.tool.clone(),
                token: a.token.clone(),
                deadline_at: crate::clock::rfc3339(a.deadline_at),
            },
            format!(
                "{}: tool `{}` waits for approval",
                self.call.step_path, c.tool
            ),
        );
        self.commit(vec![human_tool::insert(&a), Write::UpsertToolCall(rec), ev])
            .await?;
        human_tool::requested(self.services, &a);
        Ok(a.token)
    }

    /// The approval of a call found `waiting` in the journal. After a restart (not
    /// an unpark by this process) a message the previous process never confirmed
    /// sending is sent now, as for a human step; the original one stays valid.
    async fn rearm_approval(&mut self, token: &str) -> Result<String, CallFailure> {
        if !self.human.unparked {
            human_tool::rearmed(self.services, self.call.run_id, token)?;
        }
        Ok(token.to_string())
    }

    /// Parks the run on `token` (see `runner::park`) once the step's `waiting`
    /// record and everything pending are committed; `false` when the decision or
    /// the deadline is already there and this task acts on it.
    async fn park_on(&mut self, token: &str) -> Result<bool, CallFailure> {
        let Some(a) = self
            .services
            .store
            .approval(token)
            .map_err(|e| CallFailure::Error(e.to_string()))?
        else {
            return Ok(false);
        };
        if a.status != crate::domain::ApprovalStatus::Pending {
            return Ok(false);
        }
        self.commit(vec![human_tool::waiting_record(self.facts.record)])
            .await?;
        human_tool::park(self.services, self.call, &a).await
    }

    /// The decision's event rides in the next commit.
    fn decided(&mut self, turn: u32, c: &PendingCall, decision: &turns::Decision) {
        let step = self.call.step_path.to_string();
        let ev = match decision {
            turns::Decision::TimedOut => Event::ToolApprovalTimedOut {
                step,
                turn,
                call_index: c.index,
                tool: c.tool.clone(),
            },
            turns::Decision::Approved => Event::ToolApprovalDecided {
                step,
                turn,
                call_index: c.index,
                tool: c.tool.clone(),
                approved: true,
                by: String::new(),
            },
            turns::Decision::Rejected { by } => Event::ToolApprovalDecided {
                step,
                turn,
                call_index: c.index,
                tool: c.tool.clone(),
                approved: false,
                by: by.clone(),
            },
        };
        let ev = self.ev(
            ev,
            format!("{}: approval of `{}` settled", self.call.step_path, c.tool),
        );
        self.pending.push(ev);
    }

    /// Records the call `started` (with what is pending), then runs it.
    async fn run_call(
        &mut self,
        turn: u32,
        c: &PendingCall,
        attempt: u32,
    ) -> Result<toolbox::ToolResult, CallFailure> {
        let Some(tool) = self.toolbox.get(&c.tool).cloned() else {
            return Ok(toolbox::ToolResult {
                text: "error: no such tool is available to you".into(),
                failed: true,
            });
        };
        let started = self.call_record_of(turn, c, &tool, ToolCallStatus::Started, attempt);
        let ev = self.ev(
            Event::ToolCallStarted {
                step: self.call.step_path.to_string(),
                turn,
                call_index: c.index,
                tool: c.tool.clone(),
                effect_key: c.effect_key.clone(),
                attempt,
            },
            format!("{}: tool `{}` started", self.call.step_path, c.tool),
        );
        self.commit(vec![Write::UpsertToolCall(started), ev])
            .await?;
        pause_point_before_tool_call().await;
        let t0 = std::time::Instant::now();
        let result = toolbox::run(
            &self.services.config,
            &self.services.http,
            &self.services.mcp,
            &tool,
            &c.arguments,
            &c.effect_key,
            attempt,
        )
        .await;
        self.last_duration_ms = t0.elapsed().as_millis() as u64;
        Ok(result)
    }

    fn call_record(
        &self,
        turn: u32,
        c: &PendingCall,
        status: ToolCallStatus,
        attempt: u32,
        result: Option<&str>,
    ) -> ToolCallRecord {
        let effect = self
            .toolbox
            .get(&c.tool)
            .map_or(ToolEffect::Write, |t| t.effect);
        let now = self.services.now_ms();
        ToolCallRecord {
            run_id: self.call.run_id.to_string(),
            step_path: self.call.step_path.to_string(),
            iteration: self.iteration,
            turn,
            call_index: c.index,
            call_id: c.call_id.clone(),
            tool: c.tool.clone(),
            arguments_json: c.arguments.to_string(),
            effect,
            effect_key: c.effect_key.clone(),
            status,
            attempt,
            result_json: result.map(|r| Value::String(r.to_string()).to_string()),
            approval_token: None,
            approval_deadline: None,
            decided_by: None,
            started_at: now.saturating_sub(self.last_duration_ms as i64),
            finished_at: (status != ToolCallStatus::Started).then_some(now),
            duration_ms: (status != ToolCallStatus::Started).then_some(self.last_duration_ms),
        }
    }

    fn call_record_of(
        &self,
        turn: u32,
        c: &PendingCall,
        tool: &Tool,
        status: ToolCallStatus,
        attempt: u32,
    ) -> ToolCallRecord {
        ToolCallRecord {
            effect: tool.effect,
            started_at: self.services.now_ms(),
            finished_at: None,
            duration_ms: None,
            ..self.call_record(turn, c, status, attempt, None)
        }
    }
}

/// For crash tests only: with this variable set, a call recorded `started` waits
/// here forever instead of running, so a kill lands exactly between the commit
/// that recorded the turn's reply (and the call's start) and the tool's effect.
/// Never set it in production.
pub const PAUSE_BEFORE_TOOL_CALL: &str = "VECTORSTEP_TEST_PAUSE_BEFORE_TOOL_CALL";

async fn pause_point_before_tool_call() {
    if std::env::var_os(PAUSE_BEFORE_TOOL_CALL).is_some() {
        tracing::warn!("{PAUSE_BEFORE_TOOL_CALL} is set: the tool call waits here until the process is killed.");
        std::future::pending::<()>().await;
    }
}

fn model_failure(e: ModelError) -> CallFailure {
    match e {
        ModelError::Retriable(m) => CallFailure::Error(m),
        ModelError::Config(m) => CallFailure::Config(m),
    }
}
