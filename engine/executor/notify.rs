//! `notify`: sends the rendered `prompt_template` somewhere people will see it.
//!
//! `executor_config.channel`: `log` (default; a structured log line), `webhook`
//! (`url`; POSTs `{"text", "run_id", "step"}`), `telegram` (the bot and chat of
//! `notifications.telegram` in config.yaml).
//!
//! Inside a run the runner does not call this executor: it turns the step into a
//! [`Message`] with [`prepare`] and commits it to the notification outbox, which
//! delivers and retries it (`runner::outbox`). Called directly, the executor sends
//! the message itself, once.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::http;
use super::{BoxFuture, Call, Error, Executor, Outcome};
use crate::config::Config;
use crate::pipeline::executor_config::Channel;
use crate::pipeline::ExecutorConfig;
use crate::run::{StepOutput, Usage};

/// Used when the step sets no timeout: notifications are small, so a peer that
/// takes longer is treated as down.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Telegram rejects longer messages, so they are cut rather than lost.
const TELEGRAM_MAX_CHARS: usize = 4096;
const TELEGRAM_API: &str = "https://api.telegram.org";

/// One notify step's message, checked and rendered, ready to be sent or queued.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// `log`, `webhook` or `telegram`.
    pub channel: String,
    /// The text people read (cut to Telegram's limit on that channel).
    pub text: String,
    /// Where a webhook message is POSTed.
    pub url: Option<String>,
    /// The JSON body a webhook or Telegram receives.
    pub body: Option<Value>,
}

/// Builds the step's message; a step that cannot work (no url, Telegram not
/// configured) is a [`Error::Config`]. The loader already checked the channel.
pub fn prepare(config: &Config, call: &Call<'_>) -> Result<Message, Error> {
    let ExecutorConfig::Notify(cfg) = &call.action.config else {
        return Err(super::wrong_config(call, "notify"));
    };
    let channel = cfg.channel.as_str();
    match cfg.channel {
        Channel::Log => Ok(Message {
            channel: channel.into(),
            text: call.prompt.clone(),
            url: None,
            body: None,
        }),
        Channel::Webhook => {
            let url = http::target_url(call, cfg.url.as_deref(), "the webhook channel")?;
            let body = json!({"text": call.prompt, "run_id": call.run_id, "step": call.step_path});
            Ok(Message {
                channel: channel.into(),
                text: call.prompt.clone(),
                url: Some(url),
                body: Some(body),
            })
        }
        Channel::Telegram => {
            let Some(tg) = &config.telegram else {
                return Err(Error::Config(
                    "the telegram channel needs `notifications.telegram` (bot_token, chat_id) in config.yaml"
                        .into(),
                ));
            };
            let text: String = call.prompt.chars().take(TELEGRAM_MAX_CHARS).collect();
            let body = json!({"chat_id": tg.chat_id, "text": text});
            Ok(Message {
                channel: channel.into(),
                text,
                url: Some(telegram_url(config)),
                body: Some(body),
            })
        }
    }
}

/// The `sendMessage` address of the configured bot (empty without one).
pub fn telegram_url(config: &Config) -> String {
    match &config.telegram {
        Some(tg) => format!(
            "{}/bot{}/sendMessage",
            tg.api_url
                .as_deref()
                .unwrap_or(TELEGRAM_API)
                .trim_end_matches('/'),
            tg.bot_token
        ),
        None => String::new(),
    }
}

pub struct Notify {
    client: reqwest::Client,
    config: Arc<Config>,
}

impl Notify {
    pub fn new(client: reqwest::Client, config: Arc<Config>) -> Self {
        Notify { client, config }
    }
}

impl Executor for Notify {
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(self.run(call))
    }
}

impl Notify {
    async fn run(&self, call: Call<'_>) -> Result<Outcome, Error> {
        let m = prepare(&self.config, &call)?;
        match (m.channel.as_str(), &m.url, &m.body) {
            ("webhook", Some(url), Some(body)) => {
                self.post(&call, url, body, "notify webhook").await?
            }
            ("telegram", Some(url), Some(body)) => {
                self.post(&call, url, body, "telegram sendMessage").await?
            }
            _ => {
                tracing::info!(
                    target: "vectorstep::notify",
                    run_id = %call.run_id,
                    step = %call.step_path,
                    message = %call.prompt,
                    "Notification."
                );
            }
        }
        Ok(Outcome {
            output: StepOutput::new(1.0, format!("Notification sent via {}", m.channel)),
            usage: Usage::default(),
        })
    }

    /// POSTs `body`; only a 2xx answer counts as delivered.
    async fn post(
        &self,
        call: &Call<'_>,
        url: &str,
        body: &Value,
        what: &str,
    ) -> Result<(), Error> {
        let timeout = call.timeout.unwrap_or(DEFAULT_TIMEOUT);
        let req = self
            .client
            .post(url)
            .headers(http::call_headers(call))
            .json(body)
            .timeout(timeout);
        let reply = http::send(req, what, url).await?;
        if !reply.is_success() {
            return Err(Error::Failed(format!(
                "{what} returned HTTP {}: {}",
                reply.status.as_u16(),
                reply.excerpt()
            )));
        }
        Ok(())
    }
}
