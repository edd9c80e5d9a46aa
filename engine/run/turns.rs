//! The agent loop's decisions, pure: whether a turn may offer tools, what a model
//! reply leads to (the step's answer, one more turn asking for the output
//! contract, a failure, or tool calls), and what each proposed tool call needs
//! before it runs. The runner's agent driver performs them: journal commits, the
//! model call, approvals, the tool calls.
//!
//! An agent without tools is a loop of one turn; every rule below then reduces to
//! "the answer meets the contract, or the step fails as it always did".

use super::output::StepOutput;

/// Whether turn `turn` (counted from 1) offers tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnKind {
    WithTools,
    /// The last turn `max_turns` allows: the model is asked for its final answer
    /// and offered no tools.
    Final,
}

pub fn turn_kind(turn: u32, max_turns: u32) -> TurnKind {
    if turn >= max_turns.max(1) {
        TurnKind::Final
    } else {
        TurnKind::WithTools
    }
}

/// What the driver found out about one proposed tool call before deciding.
#[derive(Debug, Clone, PartialEq)]
pub struct CallCheck {
    /// The tool is among those offered to this agent.
    pub known: bool,
    /// Its arguments parse and meet the tool's `parameters` (the error otherwise).
    pub arguments: Result<(), String>,
    /// `approval: required` for this tool.
    pub needs_approval: bool,
}

/// One model reply as the loop sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// An answer without tool calls, checked against the step output contract.
    Answer(Result<Box<StepOutput>, String>),
    /// One or more tool calls (several in one reply are allowed).
    Calls(Vec<CallCheck>),
}

/// What follows a reply on `turn`.
#[derive(Debug, Clone, PartialEq)]
pub enum AfterReply {
    /// The step's output.
    Answer(Box<StepOutput>),
    /// The answer breaks the contract and turns are left: one more turn, whose
    /// user message is this text.
    AskForContract(String),
    /// Nothing more can be asked: the step fails with this error.
    Fail(String),
    /// Perform these calls in order; their results start the next turn.
    Calls(Vec<CallStep>),
}

/// What one proposed tool call needs before it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum CallStep {
    /// Not run: this text goes back to the model as the call's (error) result.
    Refuse(String),
    /// Waits for a human decision first (see [`after_decision`]).
    AskApproval,
    Run,
}

/// The user message of a turn that asks again for the output contract.
pub fn contract_reminder(error: &str) -> String {
    format!(
        "Your answer did not meet the required output: {error}. Answer with one JSON object \
         with `confidence` (a number from 0 to 1), `summary` (text) and \
         `next_step_context` (text), and nothing else."
    )
}

pub fn after_reply(reply: Reply, turn: u32, max_turns: u32) -> AfterReply {
    let kind = turn_kind(turn, max_turns);
    match reply {
        Reply::Answer(Ok(output)) => AfterReply::Answer(output),
        Reply::Answer(Err(e)) => match kind {
            TurnKind::WithTools => AfterReply::AskForContract(contract_reminder(&e)),
            TurnKind::Final => AfterReply::Fail(format!(
                "the final answer (turn {turn} of {max_turns}) did not meet the output contract: {e}"
            )),
        },
        Reply::Calls(_) if kind == TurnKind::Final => AfterReply::Fail(format!(
            "the model asked for tools on its last turn ({turn} of {max_turns}), which offers none; \
             raise `max_turns` or make the task smaller"
        )),
        Reply::Calls(calls) => AfterReply::Calls(calls.iter().map(call_step).collect()),
    }
}

fn call_step(c: &CallCheck) -> CallStep {
    if !c.known {
        return CallStep::Refuse(
            "error: no such tool is available to you; use one of the tools offered".into(),
        );
    }
    if let Err(e) = &c.arguments {
        return CallStep::Refuse(format!("error: invalid arguments: {e}"));
    }
    if c.needs_approval {
        CallStep::AskApproval
    } else {
        CallStep::Run
    }
}

/// How a human answered a tool call's approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Approved,
    Rejected { by: String },
    TimedOut,
}

/// What follows an approval decision: run the call, or hand the model a result
/// that says why it was not run (the loop goes on either way).
pub fn after_decision(decision: &Decision, tool: &str) -> CallStep {
    match decision {
        Decision::Approved => CallStep::Run,
        Decision::Rejected { by } => CallStep::Refuse(format!(
            "not run: a human ({by}) rejected this call of `{tool}`; do not retry it, \
             propose something else or answer"
        )),
        Decision::TimedOut => CallStep::Refuse(format!(
            "not run: nobody approved this call of `{tool}` in time; do not retry it, \
             propose something else or answer"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Result<Box<StepOutput>, String> {
        Ok(Box::new(StepOutput::new(0.9, "done")))
    }

    fn call(known: bool, valid: bool, approval: bool) -> CallCheck {
        CallCheck {
            known,
            arguments: if valid {
                Ok(())
            } else {
                Err("argument `service`: expected string".into())
            },
            needs_approval: approval,
        }
    }

    fn check(reply: Reply, turn: u32, max_turns: u32, expected: &str) {
        let got = after_reply(reply, turn, max_turns);
        let shown = match &got {
            AfterReply::Answer(o) => format!("answer {}", o.summary),
            AfterReply::AskForContract(m) => format!("ask: {m}"),
            AfterReply::Fail(e) => format!("fail: {e}"),
            AfterReply::Calls(steps) => format!(
                "calls {}",
                steps
                    .iter()
                    .map(|s| match s {
                        CallStep::Run => "run".to_string(),
                        CallStep::AskApproval => "approve".to_string(),
                        CallStep::Refuse(m) => format!("refuse({m})"),
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        };
        assert!(
            shown.starts_with(expected),
            "turn {turn}/{max_turns}: expected `{expected}...`, got `{shown}`"
        );
    }

    #[test]
    fn turn_kinds() {
        for (turn, max, kind) in [
            (1, 10, TurnKind::WithTools),
            (9, 10, TurnKind::WithTools),
            (10, 10, TurnKind::Final),
            (11, 10, TurnKind::Final),
            (1, 1, TurnKind::Final),
            // A max of 0 is read as 1: there is always one turn.
            (1, 0, TurnKind::Final),
        ] {
            assert_eq!(turn_kind(turn, max), kind, "turn {turn} of {max}");
        }
    }

    #[test]
    fn what_a_reply_leads_to() {
        check(Reply::Answer(ok()), 1, 10, "answer done");
        check(Reply::Answer(ok()), 10, 10, "answer done");
        // An agent without tools has max_turns 1: a good answer is the output...
        check(Reply::Answer(ok()), 1, 1, "answer done");
        // ...and a bad one fails the step, as a one-shot completion always did.
        check(
            Reply::Answer(Err("missing `summary`".into())),
            1,
            1,
            "fail: the final answer (turn 1 of 1) did not meet the output contract: missing `summary`",
        );
        check(
            Reply::Answer(Err("missing `summary`".into())),
            3,
            10,
            "ask: Your answer did not meet the required output: missing `summary`",
        );
        check(
            Reply::Calls(vec![call(true, true, false)]),
            10,
            10,
            "fail: the model asked for tools on its last turn (10 of 10)",
        );
        check(
            Reply::Calls(vec![
                call(true, true, false),
                call(true, true, true),
                call(false, true, false),
                call(true, false, false),
                call(true, false, true),
            ]),
            2,
            10,
            "calls run,approve,refuse(error: no such tool is available to you; use one of the tools offered),refuse(error: invalid arguments: argument `service`: expected string),refuse(error: invalid arguments: argument `service`: expected string)",
        );
    }

    #[test]
    fn what_a_decision_leads_to() {
        assert_eq!(
            after_decision(&Decision::Approved, "restart"),
            CallStep::Run
        );
        let CallStep::Refuse(m) =
            after_decision(&Decision::Rejected { by: "alice".into() }, "restart")
        else {
            panic!("a rejection must not run the tool");
        };
        assert!(m.contains("alice") && m.contains("`restart`"), "{m}");
        let CallStep::Refuse(m) = after_decision(&Decision::TimedOut, "restart") else {
            panic!("a timeout must not run the tool");
        };
        assert!(m.contains("in time"), "{m}");
    }
}
