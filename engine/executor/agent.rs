//! `agent` (also `gateway`, `openclaw`): one OpenAI-compatible chat completion.
//!
//! `executor_config.agent` names an agent of `config.yaml`, which names its
//! provider. The model is asked for a JSON object; since models still wrap it in
//! code fences or prose, [`extract_json`] digs it out before the step output
//! contract is checked. Token usage is priced from `config.pricing`.

use std::sync::Arc;

use reqwest::header::{HeaderValue, AUTHORIZATION};
use serde_json::{json, Value};

use crate::pipeline::ExecutorConfig;

use super::http;
use super::{BoxFuture, Call, Error, Executor, Outcome};
use crate::config::{Agent as AgentConfig, Config, Price, Provider};
use crate::run::{StepOutput, Usage};

/// How much of a model reply an error message quotes.
const REPLY_EXCERPT_CHARS: usize = 300;

pub struct Agent {
    client: reqwest::Client,
    config: Arc<Config>,
}

impl Agent {
    pub fn new(client: reqwest::Client, config: Arc<Config>) -> Self {
        Agent { client, config }
    }
}

impl Executor for Agent {
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(self.run(call))
    }
}

impl Agent {
    async fn run(&self, call: Call<'_>) -> Result<Outcome, Error> {
        let name = agent_name(&call)?;
        let agent = self.config.agents.get(&name).ok_or_else(|| {
            Error::Config(format!("agent `{name}` is not defined in config.yaml"))
        })?;
        let provider = self.config.providers.get(&agent.provider).ok_or_else(|| {
            Error::Config(format!(
                "agent `{name}` uses provider `{}`, which is not defined in config.yaml",
                agent.provider
            ))
        })?;
        let url = endpoint(provider);
        let mut req = self
            .client
            .post(&url)
            .headers(http::call_headers(&call))
            .json(&request_body(agent, &call.prompt));
        if let Some(key) = &provider.api_key {
            let value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                Error::Config(format!(
                    "the api_key of provider `{}` is not a valid header value",
                    agent.provider
                ))
            })?;
            req = req.header(AUTHORIZATION, value);
        }
        if let Some(t) = http::shortest(http::seconds(Some(provider.timeout_seconds)), call.timeout)
        {
            req = req.timeout(t);
        }
        let what = format!("agent `{name}` request");
        let reply = http::send(req, &what, &url).await?;
        if !reply.is_success() {
            return Err(Error::Failed(format!(
                "agent `{name}`: provider `{}` returned HTTP {}: {}",
                agent.provider,
                reply.status.as_u16(),
                reply.excerpt()
            )));
        }
        let envelope: Value = serde_json::from_str(&reply.body).map_err(|_| {
            Error::Failed(format!(
                "agent `{name}`: provider `{}` answered with something that is not a chat completion: {}",
                agent.provider,
                reply.excerpt()
            ))
        })?;
        let content = envelope
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                Error::BadOutput(format!(
                    "agent `{name}`: the reply has no text in `choices[0].message.content`: {}",
                    reply.excerpt()
                ))
            })?;
        let mut output =
            parse_reply(content).map_err(|e| Error::BadOutput(format!("agent `{name}` {e}")))?;
        output
            .extra
            .entry("model")
            .or_insert_with(|| Value::from(agent.model.clone()));
        output
            .extra
            .entry("provider")
            .or_insert_with(|| Value::from(agent.provider.clone()));
        let usage = usage(&envelope, self.config.pricing.get(&agent.model)).map_err(|e| {
            Error::BadOutput(format!(
                "agent `{name}`: provider `{}` reported {e}; the attempt is failed rather than \
                 recorded with a count the run's usage cannot hold",
                agent.provider
            ))
        })?;
        Ok(Outcome { output, usage })
    }
}

/// The agent the step's config names.
fn agent_name(call: &Call<'_>) -> Result<String, Error> {
    match &call.action.config {
        ExecutorConfig::Agent(a) => Ok(a.agent.clone()),
        _ => Err(super::wrong_config(call, "agent")),
    }
}

/// The chat completion request for `agent` and the rendered prompt.
pub fn request_body(agent: &AgentConfig, prompt: &str) -> Value {
    let mut body = json!({
        "model": agent.model,
        "messages": [
            {"role": "system", "content": agent.system_prompt},
            {"role": "user", "content": prompt},
        ],
    });
    if let Some(obj) = body.as_object_mut() {
        if let Some(t) = agent.temperature {
            obj.insert("temperature".into(), Value::from(t));
        }
        if let Some(m) = agent.max_tokens {
            obj.insert("max_tokens".into(), Value::from(m));
        }
        obj.insert("response_format".into(), json!({"type": "json_object"}));
    }
    body
}

/// The step output inside a model reply. The error reads after "agent `x` ".
pub fn parse_reply(content: &str) -> Result<StepOutput, String> {
    let shown = http::excerpt(content, REPLY_EXCERPT_CHARS);
    let v = extract_json(content)
        .ok_or_else(|| format!("did not reply with JSON; the reply was: {shown}"))?;
    StepOutput::from_json(&v).map_err(|e| {
        format!(
            "returned an invalid step output: {}; the reply was: {shown}",
            e.0
        )
    })
}

/// Finds the JSON value in a model reply: the whole text; else the text without
/// its code-fence lines; else the span from the first `{` to the last `}`.
pub fn extract_json(text: &str) -> Option<Value> {
    let text = text.trim();
    if let Ok(v) = serde_json::from_str(text) {
        return Some(v);
    }
    let unfenced: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("```"))
        .collect();
    if let Ok(v) = serde_json::from_str(unfenced.join("\n").trim()) {
        return Some(v);
    }
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    if end <= start {
        return None;
    }
    serde_json::from_str(&text[start..=end]).ok()
}

/// The most tokens one completion may report per direction. Far above any model's
/// context window, far below what the run's totals (summed over many steps and kept
/// as signed 64-bit integers in the store) can hold.
pub const MAX_TOKENS_PER_CALL: u64 = 1_000_000_000;

/// Tokens from the completion's `usage`, priced per million tokens when the model
/// has a price. A missing or `null` count is 0; a count that is not a whole number
/// between 0 and [`MAX_TOKENS_PER_CALL`] is an error naming the field and the value.
pub fn usage(envelope: &Value, price: Option<&Price>) -> Result<Usage, String> {
    let count = |field: &str| -> Result<u64, String> {
        let value = match envelope.get("usage").and_then(|u| u.get(field)) {
            None | Some(Value::Null) => return Ok(0),
            Some(v) => v,
        };
        match value.as_u64() {
            Some(n) if n <= MAX_TOKENS_PER_CALL => Ok(n),
            _ => Err(format!(
                "`usage.{field}` = {}, which is not a token count (a whole number from 0 to {MAX_TOKENS_PER_CALL})",
                http::excerpt(&value.to_string(), 60)
            )),
        }
    };
    let input_tokens = count("prompt_tokens")?;
    let output_tokens = count("completion_tokens")?;
    Ok(Usage {
        input_tokens,
        output_tokens,
        cost_usd: price.map(|p| {
            (input_tokens as f64 * p.input_per_mtok + output_tokens as f64 * p.output_per_mtok)
                / 1_000_000.0
        }),
    })
}

/// `<base_url>/chat/completions`, whether or not the base URL ends in a slash.
pub fn endpoint(provider: &Provider) -> String {
    format!(
        "{}/chat/completions",
        provider.base_url.trim_end_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Option<Value>) {
        assert_eq!(extract_json(input), expected, "input: {input:?}");
    }

    #[test]
    fn extracts_json_from_model_replies() {
        let obj = json!({"confidence": 0.9, "summary": "ok"});
        let text = r#"{"confidence": 0.9, "summary": "ok"}"#;
        check(text, Some(obj.clone()));
        check(&format!("  \n{text}\n "), Some(obj.clone()));
        check(&format!("```json\n{text}\n```"), Some(obj.clone()));
        check(&format!("```\n{text}\n```"), Some(obj.clone()));
        check(
            &format!("Here is my analysis:\n```json\n{text}\n```\nLet me know."),
            Some(obj.clone()),
        );
        check(&format!("Sure! {text} Hope that helps."), Some(obj.clone()));
        check(
            "```json\n{\"summary\": \"use `{}` braces\", \"confidence\": 1}\n```",
            Some(json!({"summary": "use `{}` braces", "confidence": 1})),
        );
        check("42", Some(json!(42)));
        check("I could not determine the cause.", None);
        check("} backwards {", None);
        check("{not json at all}", None);
        check("", None);
    }

    #[test]
    fn reply_errors_say_what_was_wrong() {
        let cases = [
            ("no idea", "did not reply with JSON; the reply was: no idea"),
            (r#"{"summary": "s"}"#, "missing `confidence`"),
            (
                r#"{"confidence": 7, "summary": "s"}"#,
                "within 0..1, found 7",
            ),
            (
                r#"{"confidence": 0.5, "summary": "s", "reasoning": "because"}"#,
                "`reasoning` must be a mapping",
            ),
        ];
        for (input, want) in cases {
            let err = parse_reply(input).unwrap_err();
            assert!(err.contains(want), "{input}: got `{err}`, want `{want}`");
            assert!(err.contains("the reply was:"), "{err}");
        }
    }

    #[test]
    fn usage_is_priced_per_million_tokens() {
        let envelope = json!({"usage": {"prompt_tokens": 1000, "completion_tokens": 500}});
        let price = Price {
            input_per_mtok: 3.0,
            output_per_mtok: 15.0,
        };
        let u = usage(&envelope, Some(&price)).unwrap();
        assert_eq!((u.input_tokens, u.output_tokens), (1000, 500));
        let cost = u.cost_usd.unwrap();
        assert!((cost - 0.0105).abs() < 1e-12, "{cost}");
        assert_eq!(usage(&json!({}), None), Ok(Usage::default()));
        let nulls = json!({"usage": {"prompt_tokens": null, "completion_tokens": 3}});
        assert_eq!(usage(&nulls, None).unwrap().output_tokens, 3);
    }

    #[test]
    fn usage_outside_a_sane_range_is_an_error() {
        let cases = [
            (json!(u64::MAX), "18446744073709551615"),
            (json!(-1), "-1"),
            (json!(i64::MAX), "9223372036854775807"),
            (json!(MAX_TOKENS_PER_CALL + 1), "1000000001"),
            (json!(1.5), "1.5"),
            (json!("12"), "\"12\""),
            (json!(1e300), "1e+300"),
        ];
        for (value, shown) in cases {
            let envelope = json!({"usage": {"prompt_tokens": 10, "completion_tokens": value}});
            let err = usage(&envelope, None).unwrap_err();
            assert!(err.contains("`usage.completion_tokens`"), "{err}");
            assert!(err.contains(shown), "{err} should show {shown}");
        }
        let max = json!({"usage": {"prompt_tokens": MAX_TOKENS_PER_CALL}});
        assert_eq!(usage(&max, None).unwrap().input_tokens, MAX_TOKENS_PER_CALL);
    }

    #[test]
    fn request_asks_for_a_json_object() {
        let agent = AgentConfig {
            provider: "p".into(),
            model: "m".into(),
            system_prompt: "sys".into(),
            temperature: None,
            max_tokens: Some(100),
            tools: Vec::new(),
            delegates: Vec::new(),
            max_turns: 10,
            approval_timeout_seconds: 900,
        };
        let body = request_body(&agent, "hi");
        assert_eq!(body["response_format"], json!({"type": "json_object"}));
        assert_eq!(body["max_tokens"], json!(100));
        assert!(body.get("temperature").is_none());
        assert_eq!(
            body["messages"][1],
            json!({"role": "user", "content": "hi"})
        );
    }
}
