//! The Bot API calls vectorstep makes, with teloxide's types kept inside this file:
//! callers see chat ids, message ids and [`Press`]es, never a teloxide type.

use std::future::IntoFuture;
use std::time::Duration;

use teloxide_core::payloads::setters::*;
use teloxide_core::requests::Requester;
use teloxide_core::types::{
    AllowedUpdate, CallbackQueryId, ChatId, InlineKeyboardButton, InlineKeyboardMarkup, MessageId,
    ParseMode, Recipient, UpdateKind,
};
use teloxide_core::{ApiError, Bot, RequestError};

/// How long one send, edit or answer may take. A hung Bot API must not hold a
/// delivery forever: the caller backs off and tries again.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Telegram rejects texts over 4096 characters; longer prompts are cut (the full
/// message stays on the approvals page).
const MAX_TEXT_CHARS: usize = 3900;

/// Why a Bot API call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("notifications.telegram.api_url `{0}` is not a usable base URL")]
    BadApiUrl(String),
    #[error("cannot build the HTTP client for Telegram: {0}")]
    Client(String),
    /// Telegram answered and refused; sending the same request again will not help
    /// unless something changes (the bot is added to the chat, the text is fixed).
    #[error("Telegram refused the request: {0}")]
    Refused(String),
    /// The request did not get an answer we could read; worth retrying as it is.
    #[error("Telegram request failed: {0}")]
    Transport(String),
    #[error("Telegram did not answer within {0:?}")]
    Timeout(Duration),
}

/// Where an approval message landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub chat_id: i64,
    pub message_id: i32,
}

/// A press on an inline button, as the poller needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Press {
    pub callback_id: String,
    pub user_id: u64,
    /// `@username`, or the first name when the user has no username.
    pub user_name: String,
    /// The chat and message holding the button; `None` for inline-mode messages.
    pub chat_id: Option<i64>,
    pub message_id: Option<i32>,
    pub data: Option<String>,
}

/// One update: its id (for the offset) and the press it carries, if any.
pub type Update = (u32, Option<Press>);

/// A Bot API client for one bot token.
#[derive(Clone)]
pub struct Client {
    bot: Bot,
}

impl Client {
    /// `http` should have no overall timeout: every call here sets its own, and a
    /// long poll needs longer than a send.
    pub fn new(cfg: &crate::config::Telegram, http: reqwest::Client) -> Result<Client, Error> {
        let mut bot = Bot::with_client(cfg.bot_token.clone(), http);
        if let Some(raw) = cfg.api_url.as_deref() {
            let url = reqwest::Url::parse(raw.trim_end_matches('/'))
                .map_err(|_| Error::BadApiUrl(raw.to_string()))?;
            // teloxide appends path segments to the base and panics on a URL that
            // cannot have a path (`mailto:`), so refuse those here.
            if url.cannot_be_a_base() || !matches!(url.scheme(), "http" | "https") {
                return Err(Error::BadApiUrl(raw.to_string()));
            }
            bot = bot.set_api_url(url);
        }
        Ok(Client { bot })
    }

    /// A client with its own HTTP connection pool (for the poller).
    pub fn standalone(cfg: &crate::config::Telegram) -> Result<Client, Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Error::Client(e.to_string()))?;
        Client::new(cfg, http)
    }

    /// Sends `text` (HTML; plain text when Telegram cannot parse it as HTML) with
    /// one row of two buttons whose callback data carries the token.
    pub async fn send_approval(&self, chat: &str, text: &str, token: &str) -> Result<Sent, Error> {
        let text = truncate(text);
        let markup = InlineKeyboardMarkup::new([[
            InlineKeyboardButton::callback("✅ Approve", format!("approve:{token}")),
            InlineKeyboardButton::callback("❌ Reject", format!("reject:{token}")),
        ]]);
        let html = self
            .bot
            .send_message(recipient(chat), text.clone())
            .parse_mode(ParseMode::Html)
            .reply_markup(markup.clone());
        let msg = match timed(html.into_future()).await {
            Err(Error::Refused(why)) if is_markup_problem(&why) => {
                let plain = self
                    .bot
                    .send_message(recipient(chat), text)
                    .reply_markup(markup);
                timed(plain.into_future()).await?
            }
            other => other?,
        };
        Ok(Sent {
            chat_id: msg.chat.id.0,
            message_id: msg.id.0,
        })
    }

    /// Replaces a message's text (and removes its buttons). `html` is tried first;
    /// `plain` is used when Telegram cannot parse the HTML.
    pub async fn edit_text(
        &self,
        chat_id: i64,
        message_id: i32,
        html: &str,
        plain: &str,
    ) -> Result<(), Error> {
        let req = self
            .bot
            .edit_message_text(ChatId(chat_id), MessageId(message_id), truncate(html))
            .parse_mode(ParseMode::Html);
        match timed(req.into_future()).await {
            Err(Error::Refused(why)) if is_markup_problem(&why) => {
                let req = self.bot.edit_message_text(
                    ChatId(chat_id),
                    MessageId(message_id),
                    truncate(plain),
                );
                timed(req.into_future()).await.map(|_| ())
            }
            other => other.map(|_| ()),
        }
    }

    /// Answers a button press, so the user's client stops its spinner and shows `text`.
    pub async fn answer(&self, callback_id: &str, text: &str) -> Result<(), Error> {
        let req = self
            .bot
            .answer_callback_query(CallbackQueryId(callback_id.to_string()))
            .text(text);
        timed(req.into_future()).await.map(|_| ())
    }

    /// One long poll for button presses from `offset` on, waiting up to
    /// `wait_seconds` for one to arrive.
    pub async fn updates(
        &self,
        offset: Option<i32>,
        wait_seconds: u32,
    ) -> Result<Vec<Update>, Error> {
        let mut req = self
            .bot
            .get_updates()
            .timeout(wait_seconds)
            .allowed_updates([AllowedUpdate::CallbackQuery]);
        if let Some(o) = offset {
            req = req.offset(o);
        }
        let limit = Duration::from_secs(u64::from(wait_seconds)) + CALL_TIMEOUT;
        let list = match tokio::time::timeout(limit, req.into_future()).await {
            Ok(r) => r.map_err(classify)?,
            Err(_) => return Err(Error::Timeout(limit)),
        };
        Ok(list
            .into_iter()
            .map(|u| {
                let press = match u.kind {
                    UpdateKind::CallbackQuery(q) => Some(Press {
                        callback_id: q.id.0,
                        user_id: q.from.id.0,
                        user_name: q
                            .from
                            .username
                            .as_ref()
                            .map(|n| format!("@{n}"))
                            .unwrap_or_else(|| q.from.first_name.clone()),
                        chat_id: q.message.as_ref().map(|m| m.chat().id.0),
                        message_id: q.message.as_ref().map(|m| m.id().0),
                        data: q.data,
                    }),
                    _ => None,
                };
                (u.id.0, press)
            })
            .collect())
    }
}

/// A numeric chat id, or a `@channel` username.
fn recipient(chat: &str) -> Recipient {
    match chat.trim().parse::<i64>() {
        Ok(id) => Recipient::Id(ChatId(id)),
        Err(_) => Recipient::ChannelUsername(chat.trim().to_string()),
    }
}

fn truncate(text: &str) -> String {
    match text.char_indices().nth(MAX_TEXT_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// Prompts are written as Telegram HTML, but a rendered value such as `<none>` makes
/// the whole text unparsable; such a message is better sent plain than not at all.
fn is_markup_problem(why: &str) -> bool {
    let why = why.to_ascii_lowercase();
    why.contains("parse entities")
        || why.contains("can't parse")
        || why.contains("unsupported start tag")
}

async fn timed<T>(
    fut: impl std::future::Future<Output = Result<T, RequestError>>,
) -> Result<T, Error> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(r) => r.map_err(classify),
        Err(_) => Err(Error::Timeout(CALL_TIMEOUT)),
    }
}

fn classify(e: RequestError) -> Error {
    match e {
        RequestError::Api(ApiError::Unknown(why)) => Error::Refused(why),
        RequestError::Api(api) => Error::Refused(api.to_string()),
        RequestError::MigrateToChatId(id) => Error::Refused(format!(
            "the group moved to supergroup {id}; update chat_id"
        )),
        other => Error::Transport(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_texts_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_TEXT_CHARS + 10);
        let cut = truncate(&long);
        assert_eq!(cut.chars().count(), MAX_TEXT_CHARS + 1);
        assert_eq!(truncate("short"), "short");
    }

    #[test]
    fn api_urls_that_cannot_hold_a_path_are_refused() {
        let cfg = |u: &str| crate::config::Telegram {
            bot_token: "1:x".into(),
            chat_id: "1".into(),
            api_url: Some(u.into()),
        };
        for bad in ["mailto:ops@example.com", "not a url", "ftp://host"] {
            assert!(
                matches!(
                    Client::new(&cfg(bad), reqwest::Client::new()),
                    Err(Error::BadApiUrl(_))
                ),
                "{bad}"
            );
        }
        assert!(Client::new(&cfg("http://127.0.0.1:9/tg/"), reqwest::Client::new()).is_ok());
    }

    #[test]
    fn chat_ids_and_channel_names() {
        assert_eq!(recipient("-100123"), Recipient::Id(ChatId(-100123)));
        assert_eq!(recipient("@ops"), Recipient::ChannelUsername("@ops".into()));
    }
}
