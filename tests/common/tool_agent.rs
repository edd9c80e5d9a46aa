//! One tool-using agent and the fake peer that plays both its model and its tool:
//! `POST /v1/chat/completions` answers like a model that calls `restart_service`
//! once and then answers from the tool's result; `POST /restart` is the tool. The
//! model answers from the conversation it is sent, so a resumed step is answered
//! exactly as a fresh one would be, and the peer's counts say what was asked twice.

use serde_json::{json, Value};

use super::peer::{Answer, HoldingPeer, Reply};

pub const MODEL: &str = "/v1/chat/completions";
pub const TOOL: &str = "/restart";

/// The model's answer to `body`: a call of the tool while the conversation holds
/// fewer than `calls` tool results, then a final step output.
pub fn model_reply(body: &Value, calls: usize) -> Reply {
    model_reply_with(body, calls, "{\"service\": \"api<b>&\"}")
}

/// [`model_reply`] calling the tool with `arguments` (JSON text).
pub fn model_reply_with(body: &Value, calls: usize, arguments: &str) -> Reply {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let results = messages.iter().filter(|m| m["role"] == "tool").count();
    let message = if results < calls {
        json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_a", "type": "function",
            "function": {"name": "restart_service", "arguments": arguments}}]})
    } else {
        let answer =
            json!({"confidence": 0.9, "summary": "restarted api", "next_step_context": ""});
        json!({"role": "assistant", "content": answer.to_string()})
    };
    Reply::json(
        200,
        json!({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 100, "completion_tokens": 10}}),
    )
}

/// A peer answering every model and tool request at once.
pub async fn peer() -> HoldingPeer {
    HoldingPeer::start(|r| match r.path.as_str() {
        MODEL => Answer::Reply(model_reply(&r.json(), 1)),
        _ => Answer::Reply(Reply::text(200, "deployment api restarted")),
    })
    .await
}

/// Config lines for the agent `investigator`, its provider and its tool
/// `restart_service` on `url`, which needs a human's approval.
pub fn config(url: &str) -> String {
    format!(
        "providers:\n  fake: {{base_url: \"{url}/v1\"}}\n\
         agents:\n  investigator: {{provider: fake, model: m, system_prompt: \"You investigate.\", \
         tools: [restart_service], approval_timeout_seconds: 600}}\n\
         tools:\n  restart_service:\n    description: Restart one deployment\n    \
         parameters: {{type: object, properties: {{service: {{type: string}}}}, required: [service]}}\n    \
         webhook: {{url: \"{url}{TOOL}\"}}\n    approval: required\n"
    )
}

/// A pipeline `name` whose one step `triage` runs the agent.
pub fn pipeline(name: &str) -> String {
    format!(
        "name: {name}\nstage: production\ndurable: true\ntrigger: {{match: {{source: generic}}}}\nsteps:\n  \
         - name: triage\n    executor: agent\n    executor_config: {{agent: investigator}}\n    \
         prompt_template: \"Investigate the alert.\"\n"
    )
}
