//! One model call of the agent loop: the conversation and the tools offered go out,
//! a chat completion comes back (from an OpenAI-compatible provider over HTTP, or
//! from a `scripted` provider's file), read into the reply and its usage.

use reqwest::header::{HeaderValue, AUTHORIZATION};
use serde_json::Value;

use crate::agent::openai::{self, AssistantReply, ToolSpec};
use crate::agent::scripted::Script;
use crate::config::{Agent, Config, Provider, ProviderKind};
use crate::executor::{agent as single, http};
use crate::run::Usage;

/// The model's answer to one turn.
pub(super) struct Answer {
    pub reply: AssistantReply,
    pub usage: Usage,
}

/// Why a turn got no answer. `Retriable` failures leave the turn `started`; the
/// step's retry asks again (billed again, and counted so).
pub(super) enum ModelError {
    Retriable(String),
    /// The provider or the script cannot answer as configured.
    Config(String),
}

pub(super) struct Model<'a> {
    pub config: &'a Config,
    pub client: &'a reqwest::Client,
    pub agent_name: &'a str,
    pub agent: &'a Agent,
    pub provider: &'a Provider,
    /// Loaded once per step for a scripted provider.
    pub script: Option<Script>,
}

impl<'a> Model<'a> {
    pub fn new(
        config: &'a Config,
        client: &'a reqwest::Client,
        agent_name: &'a str,
    ) -> Result<Model<'a>, ModelError> {
        let agent = config.agents.get(agent_name).ok_or_else(|| {
            ModelError::Config(format!(
                "agent `{agent_name}` is not defined in config.yaml"
            ))
        })?;
        let provider = config.providers.get(&agent.provider).ok_or_else(|| {
            ModelError::Config(format!(
                "agent `{agent_name}` uses provider `{}`, which is not defined in config.yaml",
                agent.provider
            ))
        })?;
        let script = match &provider.kind {
            ProviderKind::Scripted { script } => {
                Some(Script::load(script).map_err(|e| ModelError::Config(e.to_string()))?)
            }
            ProviderKind::OpenAi => None,
        };
        Ok(Model {
            config,
            client,
            agent_name,
            agent,
            provider,
            script,
        })
    }

    /// Asks turn `turn` (from 1) of the conversation, offering `tools`.
    pub async fn ask(
        &self,
        turn: u32,
        messages: &[Value],
        tools: &[ToolSpec],
        key: &str,
    ) -> Result<Answer, ModelError> {
        let envelope = match &self.script {
            Some(script) => script
                .reply(self.agent_name, turn)
                .map_err(|e| ModelError::Config(e.to_string()))?
                .completion(),
            None => self.post(messages, tools, key).await?,
        };
        let reply = openai::parse_completion(&envelope, turn)
            .map_err(|e| ModelError::Retriable(format!("agent `{}`: {e}", self.agent_name)))?;
        let usage = single::usage(&envelope, self.config.pricing.get(&self.agent.model))
            .map_err(|e| ModelError::Retriable(format!("agent `{}`: {e}", self.agent_name)))?;
        Ok(Answer { reply, usage })
    }

    async fn post(
        &self,
        messages: &[Value],
        tools: &[ToolSpec],
        key: &str,
    ) -> Result<Value, ModelError> {
        let url = single::endpoint(self.provider);
        let body = openai::request_bytes(self.agent, messages, tools);
        let mut req = self
            .client
            .post(&url)
            .headers(http::effect_headers(key, 1))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(k) = &self.provider.api_key {
            let value = HeaderValue::from_str(&format!("Bearer {k}")).map_err(|_| {
                ModelError::Config(format!(
                    "the api_key of provider `{}` is not a valid header value",
                    self.agent.provider
                ))
            })?;
            req = req.header(AUTHORIZATION, value);
        }
        if let Some(t) = http::seconds(Some(self.provider.timeout_seconds)) {
            req = req.timeout(t);
        }
        let what = format!("agent `{}` request", self.agent_name);
        let reply = http::send(req, &what, &url)
            .await
            .map_err(|e| ModelError::Retriable(e.to_string()))?;
        if !reply.is_success() {
            return Err(ModelError::Retriable(format!(
                "agent `{}`: provider `{}` returned HTTP {}: {}",
                self.agent_name,
                self.agent.provider,
                reply.status.as_u16(),
                reply.excerpt()
            )));
        }
        serde_json::from_str(&reply.body).map_err(|_| {
            ModelError::Retriable(format!(
                "agent `{}`: provider `{}` answered with something that is not a chat completion: {}",
                self.agent_name,
                self.agent.provider,
                reply.excerpt()
            ))
        })
    }
}
