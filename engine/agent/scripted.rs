//! The `scripted` provider (SPEC 10): answers an agent's turns from a YAML file
//! instead of a model, for offline demos and `vectorstep test`.
//!
//! ```yaml
//! turns:                      # entry N answers turn N of every agent step
//!   - tool_calls: [{name: pods_list, arguments: {namespace: prod}}]
//!     usage: {input_tokens: 120, output_tokens: 30}
//!   - final: {confidence: 0.9, summary: "api is crash-looping"}
//! agents:                     # or per agent; an agent listed here uses its own
//!   log-analyst: {turns: [...]}
//! ```
//!
//! Turn N always gets entry N, so a resumed step sees the same answers. A reply
//! has the shape of an OpenAI assistant message (tool call ids `call_<turn>_<index>`,
//! arguments as a JSON string), so the loop reads scripted and real replies the
//! same way. The whole file is checked when it loads (every `final` must be a
//! valid step output), each problem with its line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use super::openai::{self, AssistantReply};
use crate::decode::Obj;
use crate::diag::Diagnostics;
use crate::run::StepOutput;
use crate::yaml;

/// A loaded script.
#[derive(Debug, Clone)]
pub struct Script {
    file: PathBuf,
    /// `turns:`, for every agent without its own.
    shared: Option<Vec<Turn>>,
    /// `agents.<name>.turns`.
    by_agent: BTreeMap<String, Vec<Turn>>,
}

/// Token counts a scripted turn reports, as a model would.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedReply {
    /// The assistant message, OpenAI-shaped.
    pub message: Value,
    pub usage: TokenUsage,
}

impl ScriptedReply {
    /// The reply as a whole chat completion (`choices[0].message`, `usage` with
    /// `prompt_tokens` / `completion_tokens`), for code that reads real replies.
    pub fn completion(&self) -> Value {
        json!({
            "choices": [{"index": 0, "message": self.message}],
            "usage": {
                "prompt_tokens": self.usage.input_tokens,
                "completion_tokens": self.usage.output_tokens,
            },
        })
    }

    /// The message read as any reply is (`openai::parse_message`).
    pub fn parsed(&self, turn: u32) -> Result<AssistantReply, String> {
        openai::parse_message(&self.message, turn)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Answer {
    /// `(name, arguments)` per call.
    ToolCalls(Vec<(String, Value)>),
    Final(Value),
}

#[derive(Debug, Clone, PartialEq)]
struct Turn {
    answer: Answer,
    usage: TokenUsage,
}

/// Why a script cannot be loaded or cannot answer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the script {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(Diagnostics),
    #[error("the script {file} has no turns for agent `{agent}` (neither `turns:` nor `agents.{agent}.turns`)")]
    NoScript { file: PathBuf, agent: String },
    #[error(
        "the script {file} has {turns} turn(s) for agent `{agent}`; turn {turn} was asked for"
    )]
    Exhausted {
        file: PathBuf,
        agent: String,
        turn: u32,
        turns: usize,
    },
}

impl Script {
    /// Reads and checks the script at `path` (a provider's resolved `script:`).
    pub fn load(path: &Path) -> Result<Script, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Script::parse(path, &text)
    }

    /// Checks the script text; `file` names it in messages.
    pub fn parse(file: &Path, text: &str) -> Result<Script, Error> {
        let label: Arc<str> = Arc::from(file.display().to_string());
        let mut d = Diagnostics::new();
        let root = match yaml::parse(&label, text) {
            Ok(n) => n,
            Err(e) => {
                d.error(&e.span, "", e.message);
                return Err(Error::Invalid(d));
            }
        };
        let mut script = Script {
            file: file.to_path_buf(),
            shared: None,
            by_agent: BTreeMap::new(),
        };
        if let Some(top) = Obj::new(&root, "", &["turns", "agents"], &[], &mut d) {
            if let Some(n) = top.get("turns") {
                script.shared = decode_turns(n, "turns", &mut d);
            }
            if let Some(n) = top.get("agents") {
                decode_agents(n, &mut script.by_agent, &mut d);
            }
            if !top.has("turns") && !top.has("agents") {
                d.error_hint(
                    top.span(),
                    "",
                    "the script has neither `turns` nor `agents`",
                    "e.g. `turns: [{final: {confidence: 1.0, summary: \"done\"}}]`",
                );
            }
        }
        if d.has_errors() {
            return Err(Error::Invalid(d));
        }
        Ok(script)
    }

    /// How many turns `agent` has, if the script has any for it.
    pub fn turns(&self, agent: &str) -> Option<usize> {
        self.turns_of(agent).map(<[Turn]>::len)
    }

    /// The answer to turn `turn` (from 1) of `agent`'s step.
    pub fn reply(&self, agent: &str, turn: u32) -> Result<ScriptedReply, Error> {
        let turns = self.turns_of(agent).ok_or_else(|| Error::NoScript {
            file: self.file.clone(),
            agent: agent.to_string(),
        })?;
        let entry = (turn as usize)
            .checked_sub(1)
            .and_then(|i| turns.get(i))
            .ok_or_else(|| Error::Exhausted {
                file: self.file.clone(),
                agent: agent.to_string(),
                turn,
                turns: turns.len(),
            })?;
        Ok(ScriptedReply {
            message: message(&entry.answer, turn),
            usage: entry.usage,
        })
    }

    fn turns_of(&self, agent: &str) -> Option<&[Turn]> {
        self.by_agent
            .get(agent)
            .or(self.shared.as_ref())
            .map(Vec::as_slice)
    }
}

/// The OpenAI assistant message for one scripted answer.
fn message(answer: &Answer, turn: u32) -> Value {
    match answer {
        Answer::Final(output) => json!({"role": "assistant", "content": output.to_string()}),
        Answer::ToolCalls(calls) => {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (name, arguments))| {
                    json!({
                        "id": format!("call_{turn}_{}", i + 1),
                        "type": "function",
                        "function": {"name": name, "arguments": arguments.to_string()},
                    })
                })
                .collect();
            json!({"role": "assistant", "content": null, "tool_calls": calls})
        }
    }
}

fn decode_agents(n: &yaml::Node, out: &mut BTreeMap<String, Vec<Turn>>, d: &mut Diagnostics) {
    let Some(entries) = n.as_map() else {
        d.error(
            &n.span,
            "agents",
            format!("expected a mapping of agent names, found {}", n.type_name()),
        );
        return;
    };
    for (k, v) in entries {
        let Some(name) = k.scalar_text() else {
            continue;
        };
        let path = format!("agents.{name}");
        let Some(o) = Obj::new(v, &path, &["turns"], &[], d) else {
            continue;
        };
        let Some(turns) = o.get("turns") else {
            o.missing(d, "turns");
            continue;
        };
        if let Some(turns) = decode_turns(turns, &o.path_of("turns"), d) {
            out.insert(name, turns);
        }
    }
}

fn decode_turns(n: &yaml::Node, path: &str, d: &mut Diagnostics) -> Option<Vec<Turn>> {
    let Some(items) = n.as_seq() else {
        d.error(
            &n.span,
            path,
            format!("expected a list of turns, found {}", n.type_name()),
        );
        return None;
    };
    if items.is_empty() {
        d.error(&n.span, path, "the list of turns is empty");
        return None;
    }
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(t) = decode_turn(item, &format!("{path}[{i}]"), d) {
            out.push(t);
        }
    }
    Some(out)
}

fn decode_turn(n: &yaml::Node, path: &str, d: &mut Diagnostics) -> Option<Turn> {
    let o = Obj::new(n, path, &["tool_calls", "final", "usage"], &[], d)?;
    let usage = decode_usage(&o, d);
    let answer = match (o.get("tool_calls"), o.get("final")) {
        (Some(calls), None) => Answer::ToolCalls(decode_calls(calls, &o.path_of("tool_calls"), d)?),
        (None, Some(f)) => {
            let value = f.to_json();
            if let Err(e) = StepOutput::from_json(&value) {
                d.error_hint(
                    &f.span,
                    &o.path_of("final"),
                    format!("not a valid step output: {}", e.0),
                    "a final answer is a step output, e.g. `{confidence: 0.9, summary: \"...\"}`",
                );
                return None;
            }
            Answer::Final(value)
        }
        (Some(_), Some(_)) => {
            d.error_hint(
                o.span(),
                path,
                "a turn has both `tool_calls` and `final`",
                "a turn either calls tools or answers; split it into two turns",
            );
            return None;
        }
        (None, None) => {
            d.error_hint(
                o.span(),
                path,
                "a turn needs `tool_calls` or `final`",
                "e.g. `{final: {confidence: 1.0, summary: \"done\"}}`",
            );
            return None;
        }
    };
    Some(Turn { answer, usage })
}

fn decode_calls(n: &yaml::Node, path: &str, d: &mut Diagnostics) -> Option<Vec<(String, Value)>> {
    let Some(items) = n.as_seq().filter(|i| !i.is_empty()) else {
        d.error(
            &n.span,
            path,
            "expected a non-empty list of `{name, arguments}`",
        );
        return None;
    };
    let mut out = Vec::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let path = format!("{path}[{i}]");
        let Some(o) = Obj::new(item, &path, &["name", "arguments"], &[], d) else {
            ok = false;
            continue;
        };
        let Some(name) = o.req_str(d, "name") else {
            ok = false;
            continue;
        };
        let arguments = match o.get("arguments") {
            None => json!({}),
            Some(a) if a.as_map().is_some() => a.to_json(),
            Some(a) => {
                d.error(
                    &a.span,
                    &o.path_of("arguments"),
                    format!("expected a mapping, found {}", a.type_name()),
                );
                ok = false;
                continue;
            }
        };
        out.push((name, arguments));
    }
    ok.then_some(out)
}

fn decode_usage(o: &Obj<'_>, d: &mut Diagnostics) -> TokenUsage {
    let Some(n) = o.get("usage") else {
        return TokenUsage::default();
    };
    let Some(u) = Obj::new(
        n,
        &o.path_of("usage"),
        &["input_tokens", "output_tokens"],
        &[],
        d,
    ) else {
        return TokenUsage::default();
    };
    TokenUsage {
        input_tokens: u.u64(d, "input_tokens").unwrap_or(0),
        output_tokens: u.u64(d, "output_tokens").unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Script, Error> {
        Script::parse(Path::new("script.yaml"), text)
    }

    fn invalid(text: &str) -> String {
        match parse(text) {
            Err(Error::Invalid(d)) => d.to_string(),
            other => panic!("expected an invalid script, got {other:?}"),
        }
    }

    const SCRIPT: &str = "\
turns:
  - tool_calls:
      - {name: pods_list, arguments: {namespace: prod}}
      - {name: pods_log, arguments: {pod: api-1}}
    usage: {input_tokens: 100, output_tokens: 20}
  - final: {confidence: 0.9, summary: shared}
agents:
  log-analyst:
    turns:
      - final: {confidence: 0.5, summary: own}
        usage: {input_tokens: 7, output_tokens: 3}
";

    #[test]
    fn turns_answer_in_order_with_openai_shaped_calls() {
        let s = parse(SCRIPT).unwrap();
        let r = s.reply("sre-investigator", 1).unwrap();
        assert_eq!(
            r.message,
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1_1", "type": "function",
                 "function": {"name": "pods_list", "arguments": "{\"namespace\":\"prod\"}"}},
                {"id": "call_1_2", "type": "function",
                 "function": {"name": "pods_log", "arguments": "{\"pod\":\"api-1\"}"}},
            ]})
        );
        assert_eq!(
            r.usage,
            TokenUsage {
                input_tokens: 100,
                output_tokens: 20
            }
        );
        let parsed = r.parsed(1).unwrap();
        assert_eq!(parsed.tool_calls.len(), 2);
        assert_eq!(parsed.tool_calls[1].arguments, json!({"pod": "api-1"}));
        assert_eq!(r.completion()["usage"]["prompt_tokens"], json!(100));

        let last = s.reply("sre-investigator", 2).unwrap();
        let parsed = last.parsed(2).unwrap();
        assert!(parsed.is_final());
        let out = crate::executor::agent::parse_reply(parsed.content.as_deref().unwrap()).unwrap();
        assert_eq!(out.summary, "shared");
        assert_eq!(last.usage, TokenUsage::default());
        // The same question gets the same answer (a resumed step).
        assert_eq!(s.reply("sre-investigator", 2).unwrap(), last);
    }

    #[test]
    fn an_agent_of_its_own_uses_its_own_turns() {
        let s = parse(SCRIPT).unwrap();
        assert_eq!(s.turns("log-analyst"), Some(1));
        assert_eq!(s.turns("anyone"), Some(2));
        let r = s.reply("log-analyst", 1).unwrap();
        assert!(r.message["content"].as_str().unwrap().contains("own"));
    }

    #[test]
    fn a_turn_beyond_the_script_is_a_clear_error() {
        let s = parse(SCRIPT).unwrap();
        let e = s.reply("log-analyst", 2).unwrap_err().to_string();
        assert_eq!(
            e,
            "the script script.yaml has 1 turn(s) for agent `log-analyst`; turn 2 was asked for"
        );
        assert!(matches!(
            s.reply("x", 0),
            Err(Error::Exhausted { turn: 0, .. })
        ));
        let only_agents =
            parse("agents: {a: {turns: [{final: {confidence: 1, summary: s}}]}}").unwrap();
        let e = only_agents.reply("b", 1).unwrap_err().to_string();
        assert!(e.contains("no turns for agent `b`"), "{e}");
    }

    #[test]
    fn load_errors_name_the_line() {
        let cases = [
            (
                "turns:\n  - final: {summary: no confidence}\n",
                "script.yaml:2:12: error: turns[0].final: not a valid step output",
            ),
            (
                "turns:\n  - {final: {confidence: 1, summary: s}}\n  - tool_calls: [{arguments: {}}]\n",
                "script.yaml:3:18: error: turns[1].tool_calls[0]: missing required field `name`",
            ),
            (
                "turns:\n  - tool_calls: [{name: a, arguments: [1]}]\n",
                "script.yaml:2:39: error: turns[0].tool_calls[0].arguments: expected a mapping",
            ),
            (
                "turns:\n  - {final: {confidence: 1, summary: s}, tool_calls: [{name: a}]}\n",
                "script.yaml:2:5: error: turns[0]: a turn has both `tool_calls` and `final`",
            ),
            (
                "turns:\n  - usage: {input_tokens: 1}\n",
                "script.yaml:2:5: error: turns[0]: a turn needs `tool_calls` or `final`",
            ),
            (
                "turns:\n  - {final: {confidence: 1, summary: s}, usage: {input_tokns: 1}}\n",
                "did you mean `input_tokens`?",
            ),
            ("turn: []\n", "unknown key `turn`"),
            ("agents: {a: {}}\n", "agents.a: missing required field `turns`"),
            ("turns: []\n", "script.yaml:1:8: error: turns: the list of turns is empty"),
        ];
        for (text, want) in cases {
            let got = invalid(text);
            assert!(got.contains(want), "{text}\n got: {got}\nwant: {want}");
        }
    }

    #[test]
    fn the_demo_script_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("samples/agents/demo-script.yaml");
        let s = Script::load(&path).unwrap();
        let first = s.reply("sre-investigator", 1).unwrap().parsed(1).unwrap();
        assert_eq!(
            first.tool_calls.len(),
            2,
            "two read calls in the first turn"
        );
        let second = s.reply("sre-investigator", 2).unwrap().parsed(2).unwrap();
        assert_eq!(second.tool_calls.len(), 1);
        assert_eq!(second.tool_calls[0].name, "restart_service");
        let third = s.reply("sre-investigator", 3).unwrap().parsed(3).unwrap();
        assert!(third.is_final());
        assert!(s.reply("sre-investigator", 4).is_err());
    }
}
