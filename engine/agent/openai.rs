//! The OpenAI-compatible chat completion shapes of a tool-using turn: the request
//! with `tools`, the assistant reply with `tool_calls`, and the messages that
//! carry tool results back. Pure: no I/O, no config beyond the agent's settings.
//!
//! A tool-less agent keeps the single-turn request of `executor::agent`
//! (`response_format: json_object`), so [`request_body`] with no tools is exactly
//! [`crate::executor::agent::request_body`]. With tools the JSON response format is
//! left out: several OpenAI-compatible servers refuse it together with `tools`, and
//! the final answer is still parsed with `executor::agent::parse_reply`.
//!
//! A reply is outside data. A tool call whose `arguments` is not valid JSON becomes
//! a call that carries the problem ([`ToolCall::arguments_error`]), so the loop
//! answers the model with the message instead of failing the step or panicking.

use serde_json::{json, Map, Value};

use crate::config::{Agent, DeclaredTool};

/// One tool as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// A JSON Schema object.
    pub parameters: Value,
}

impl ToolSpec {
    /// The OpenAI `tools` entry: `{"type": "function", "function": {...}}`.
    pub fn to_openai(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }
}

impl From<&DeclaredTool> for ToolSpec {
    fn from(t: &DeclaredTool) -> ToolSpec {
        ToolSpec {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters: t.parameters.clone(),
        }
    }
}

/// The built-in `delegate` tool of an agent with `delegates` (SPEC 10): ask one of
/// them a question, with optional context. Its schema limits `agent` to the
/// delegates, so a model naming another agent is answered by the argument check.
pub fn delegate_tool(delegates: &[String]) -> ToolSpec {
    ToolSpec {
        name: crate::config::DELEGATE_TOOL.to_string(),
        description: format!(
            "Ask another agent a question and get its answer. Agents: {}.",
            delegates.join(", ")
        ),
        parameters: json!({
            "type": "object",
            "properties": {
                "agent": {"type": "string", "enum": delegates, "description": "who to ask"},
                "question": {"type": "string", "minLength": 1},
                "context": {"type": "string", "description": "what the agent should know"},
            },
            "required": ["agent", "question"],
            "additionalProperties": false,
        }),
    }
}

/// The opening messages of an agent step: its system prompt and the rendered prompt.
pub fn first_messages(agent: &Agent, prompt: &str) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": agent.system_prompt}),
        json!({"role": "user", "content": prompt}),
    ]
}

/// The chat completion request for one turn. With no `tools` (a tool-less agent, or
/// the last turn asked for a final answer) the model is asked for a JSON object.
pub fn request_body(agent: &Agent, messages: &[Value], tools: &[ToolSpec]) -> Value {
    serde_json::to_value(Request::new(agent, messages, tools)).unwrap_or(Value::Null)
}

/// [`request_body`] as the bytes sent. The conversation is serialized where it
/// lies: it grows with every turn, and copying it into a new value each turn cost
/// more than sending it.
pub fn request_bytes(agent: &Agent, messages: &[Value], tools: &[ToolSpec]) -> Vec<u8> {
    // Serializing borrowed JSON values and plain fields cannot fail.
    serde_json::to_vec(&Request::new(agent, messages, tools)).unwrap_or_default()
}

/// One chat completions request, borrowing the conversation.
#[derive(serde::Serialize)]
struct Request<'a> {
    model: &'a str,
    messages: &'a [Value],
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<Value>>,
}

impl<'a> Request<'a> {
    fn new(agent: &'a Agent, messages: &'a [Value], tools: &[ToolSpec]) -> Request<'a> {
        let (response_format, tools) = if tools.is_empty() {
            (Some(json!({"type": "json_object"})), None)
        } else {
            (None, Some(tools.iter().map(ToolSpec::to_openai).collect()))
        };
        Request {
            model: &agent.model,
            messages,
            temperature: agent.temperature,
            max_tokens: agent.max_tokens,
            response_format,
            tools,
        }
    }
}

/// The assistant's answer of one turn.
#[derive(Debug, Clone, PartialEq)]
pub struct AssistantReply {
    /// The text, when there is any (the final answer, or prose beside tool calls).
    pub content: Option<String>,
    /// The calls to run, in the order given; empty for a final answer.
    pub tool_calls: Vec<ToolCall>,
}

impl AssistantReply {
    /// A reply without tool calls ends the loop: its content is the step output.
    pub fn is_final(&self) -> bool {
        self.tool_calls.is_empty()
    }

    /// The assistant message to append to the conversation, in the shape the API
    /// expects back (arguments as a JSON string).
    pub fn to_message(&self) -> Value {
        let mut m = Map::new();
        m.insert("role".into(), Value::from("assistant"));
        m.insert(
            "content".into(),
            self.content.clone().map_or(Value::Null, Value::from),
        );
        if !self.tool_calls.is_empty() {
            let calls = self
                .tool_calls
                .iter()
                .map(|c| {
                    json!({
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.raw_arguments()},
                    })
                })
                .collect();
            m.insert("tool_calls".into(), Value::Array(calls));
        }
        Value::Object(m)
    }
}

/// One call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The model's id for the call, or `call_<turn>_<index>` when it gave none.
    pub id: String,
    pub name: String,
    /// The parsed arguments. When they were not valid JSON, the text as sent.
    pub arguments: Value,
    /// Why the arguments could not be read, if they could not: the message for
    /// the model, instead of running the tool.
    pub arguments_error: Option<String>,
}

impl ToolCall {
    /// The arguments as the API carries them: a JSON string.
    pub fn raw_arguments(&self) -> String {
        match (&self.arguments_error, &self.arguments) {
            (Some(_), Value::String(raw)) => raw.clone(),
            _ => self.arguments.to_string(),
        }
    }
}

/// The message carrying a tool's result back to the model.
pub fn tool_result_message(call_id: &str, text: &str) -> Value {
    json!({"role": "tool", "tool_call_id": call_id, "content": text})
}

/// `choices[0].message` of a chat completion. `turn` (from 1) names calls the
/// model gave no id.
pub fn parse_completion(envelope: &Value, turn: u32) -> Result<AssistantReply, String> {
    let message = envelope
        .pointer("/choices/0/message")
        .ok_or("the reply has no `choices[0].message`")?;
    parse_message(message, turn)
}

/// An assistant message: its text and its tool calls, parallel ones included.
/// A malformed call (no function name, not an object) fails the whole reply: the
/// model's intent cannot be known, so nothing of it runs.
pub fn parse_message(message: &Value, turn: u32) -> Result<AssistantReply, String> {
    if !message.is_object() {
        return Err("`choices[0].message` is not an object".into());
    }
    let content = match message.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        // Some servers send content parts: keep their text, in order.
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
        ),
        Some(other) => return Err(format!("`content` is {}, not text", type_word(other))),
    };
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(calls)) => calls.as_slice(),
        Some(other) => return Err(format!("`tool_calls` is {}, not a list", type_word(other))),
    };
    let mut tool_calls = Vec::with_capacity(calls.len());
    for (i, call) in calls.iter().enumerate() {
        tool_calls.push(parse_call(call, turn, i + 1)?);
    }
    Ok(AssistantReply {
        // Blank text beside tool calls is no content; a blank final answer is kept
        // so that the loop reports it as the bad output it is.
        content: content.filter(|c| !c.trim().is_empty() || tool_calls.is_empty()),
        tool_calls,
    })
}

fn parse_call(call: &Value, turn: u32, index: usize) -> Result<ToolCall, String> {
    let at = format!("`tool_calls[{}]`", index - 1);
    let function = call
        .get("function")
        .filter(|f| f.is_object())
        .ok_or_else(|| format!("{at} has no `function` object"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("{at} has no function name"))?;
    let id = call
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map_or_else(|| format!("call_{turn}_{index}"), str::to_string);
    let (arguments, arguments_error) = match function.get("arguments") {
        None | Some(Value::Null) => (json!({}), None),
        Some(Value::String(raw)) if raw.trim().is_empty() => (json!({}), None),
        Some(Value::String(raw)) => match serde_json::from_str::<Value>(raw) {
            Ok(v) => (v, None),
            Err(e) => (
                Value::String(raw.clone()),
                Some(format!(
                    "the arguments of `{name}` are not valid JSON ({e}); send them as one JSON object"
                )),
            ),
        },
        // Ollama and others send the object itself.
        Some(v) => (v.clone(), None),
    };
    Ok(ToolCall {
        id,
        name: name.to_string(),
        arguments,
        arguments_error,
    })
}

fn type_word(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> Agent {
        Agent {
            provider: "p".into(),
            model: "m".into(),
            system_prompt: "sys".into(),
            temperature: Some(0.2),
            max_tokens: Some(100),
            tools: Vec::new(),
            delegates: Vec::new(),
            max_turns: 10,
            approval_timeout_seconds: 900,
        }
    }

    fn restart() -> ToolSpec {
        ToolSpec {
            name: "restart_service".into(),
            description: "Restart one deployment".into(),
            parameters: json!({"type": "object", "properties": {"service": {"type": "string"}}}),
        }
    }

    #[test]
    fn the_delegate_tool_names_its_agents() {
        let t = delegate_tool(&["log-analyst".into(), "metrics-analyst".into()]);
        assert_eq!(t.name, "delegate");
        crate::agent::schema::check_parameters(&t.parameters).unwrap();
        let ok = json!({"agent": "log-analyst", "question": "why 500s?"});
        assert_eq!(crate::agent::schema::validate(&t.parameters, &ok), Ok(()));
        let err = crate::agent::schema::validate(
            &t.parameters,
            &json!({"agent": "sre-investigator", "question": "x"}),
        )
        .unwrap_err();
        assert!(
            err.starts_with("argument `agent`: \"sre-investigator\" is not one of"),
            "{err}"
        );
    }

    #[test]
    fn a_tool_less_request_is_the_single_turn_request() {
        let a = agent();
        let body = request_body(&a, &first_messages(&a, "hi"), &[]);
        assert_eq!(body, crate::executor::agent::request_body(&a, "hi"));
    }

    #[test]
    fn tools_are_sent_in_the_function_format() {
        let a = agent();
        let body = request_body(&a, &first_messages(&a, "hi"), &[restart()]);
        assert_eq!(
            body["tools"],
            json!([{
                "type": "function",
                "function": {
                    "name": "restart_service",
                    "description": "Restart one deployment",
                    "parameters": {"type": "object", "properties": {"service": {"type": "string"}}},
                }
            }])
        );
        assert!(body.get("response_format").is_none(), "{body}");
        assert_eq!(body["temperature"], json!(0.2));
    }

    fn check(message: Value, expected: Result<AssistantReply, &str>) {
        let got = parse_message(&message, 3);
        match (&got, &expected) {
            (Ok(g), Ok(w)) => assert_eq!(g, w, "{message}"),
            (Err(g), Err(w)) => assert!(g.contains(w), "{message}: `{g}` lacks `{w}`"),
            _ => panic!("{message}: got {got:?}, want {expected:?}"),
        }
    }

    fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments,
            arguments_error: None,
        }
    }

    fn fcall(id: Option<&str>, name: &str, arguments: Value) -> Value {
        let mut c = json!({"type": "function", "function": {"name": name, "arguments": arguments}});
        if let Some(id) = id {
            c["id"] = json!(id);
        }
        c
    }

    #[test]
    fn replies_are_read_into_content_and_calls() {
        // A final answer.
        check(
            json!({"role": "assistant", "content": "{\"confidence\": 1, \"summary\": \"ok\"}"}),
            Ok(AssistantReply {
                content: Some("{\"confidence\": 1, \"summary\": \"ok\"}".into()),
                tool_calls: vec![],
            }),
        );
        // Parallel calls, arguments as JSON strings (what OpenAI sends).
        check(
            json!({"role": "assistant", "content": null, "tool_calls": [
                fcall(Some("call_a"), "pods_list", json!("{\"namespace\": \"prod\"}")),
                fcall(Some("call_b"), "pods_log", json!("{\"pod\": \"api-1\", \"lines\": 50}")),
            ]}),
            Ok(AssistantReply {
                content: None,
                tool_calls: vec![
                    call("call_a", "pods_list", json!({"namespace": "prod"})),
                    call("call_b", "pods_log", json!({"pod": "api-1", "lines": 50})),
                ],
            }),
        );
        // Arguments as an object, empty arguments, no ids: ids from turn and index.
        check(
            json!({"content": "", "tool_calls": [
                fcall(None, "a", json!({"x": 1})),
                fcall(None, "b", json!("")),
                fcall(None, "c", Value::Null),
            ]}),
            Ok(AssistantReply {
                content: None,
                tool_calls: vec![
                    call("call_3_1", "a", json!({"x": 1})),
                    call("call_3_2", "b", json!({})),
                    call("call_3_3", "c", json!({})),
                ],
            }),
        );
        // Content parts.
        check(
            json!({"content": [{"type": "text", "text": "{\"a\":"}, {"type": "text", "text": "1}"}]}),
            Ok(AssistantReply {
                content: Some("{\"a\":1}".into()),
                tool_calls: vec![],
            }),
        );
        check(
            json!({"tool_calls": [{"id": "x", "function": {"arguments": "{}"}}]}),
            Err("`tool_calls[0]` has no function name"),
        );
        check(
            json!({"tool_calls": [42]}),
            Err("`tool_calls[0]` has no `function` object"),
        );
        check(
            json!({"tool_calls": {"a": 1}}),
            Err("`tool_calls` is an object, not a list"),
        );
        check(
            json!({"content": 5}),
            Err("`content` is a number, not text"),
        );
        check(json!("text"), Err("is not an object"));
    }

    #[test]
    fn invalid_json_arguments_become_a_call_that_says_so() {
        let reply = parse_message(
            &json!({"tool_calls": [
                fcall(Some("c1"), "restart_service", json!("{\"service\": \"api\"")),
                fcall(Some("c2"), "pods_list", json!("{}")),
            ]}),
            1,
        )
        .unwrap();
        let bad = &reply.tool_calls[0];
        assert_eq!(bad.arguments, json!("{\"service\": \"api\""));
        let why = bad.arguments_error.as_deref().unwrap();
        assert!(
            why.starts_with("the arguments of `restart_service` are not valid JSON"),
            "{why}"
        );
        assert_eq!(bad.raw_arguments(), "{\"service\": \"api\"");
        // The other call of the same turn is unaffected.
        assert_eq!(reply.tool_calls[1].arguments_error, None);
        // Validation of the raw text fails with a message too, never a panic.
        let err =
            crate::agent::schema::validate(&restart().parameters, &bad.arguments).unwrap_err();
        assert_eq!(err, "arguments: expected object, got string");
    }

    #[test]
    fn a_reply_goes_back_into_the_conversation_as_sent() {
        let reply = parse_completion(
            &json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
                fcall(Some("call_1"), "restart_service", json!("{\"service\":\"api\"}")),
            ]}}]}),
            1,
        )
        .unwrap();
        assert!(!reply.is_final());
        assert_eq!(
            reply.to_message(),
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "restart_service", "arguments": "{\"service\":\"api\"}"},
            }]})
        );
        assert_eq!(
            tool_result_message("call_1", "restarted"),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "restarted"})
        );
        assert_eq!(
            parse_completion(&json!({"choices": []}), 1).unwrap_err(),
            "the reply has no `choices[0].message`"
        );
    }
}
