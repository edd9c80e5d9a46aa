//! `notify`: sends the rendered `prompt_template` to a channel.

use super::{Choice, FieldSpec, Fields};
use crate::diag::Diagnostics;

pub const FIELDS: &[FieldSpec] = &[
    FieldSpec {
        name: "channel",
        ty: "log | webhook | telegram",
        default: "log",
        doc: "Where the message goes.",
    },
    FieldSpec {
        name: "url",
        ty: "string",
        default: "required for the webhook channel",
        doc: "Where the webhook channel POSTs the message.",
    },
    FieldSpec {
        name: "method",
        ty: "string",
        default: "POST",
        doc: "Accepted for the webhook channel; the message is always POSTed.",
    },
    FieldSpec {
        name: "headers",
        ty: "map string -> string",
        default: "{}",
        doc: "Accepted for the webhook channel; not sent yet.",
    },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Log,
    Webhook,
    Telegram,
}

impl Choice for Channel {
    const ALL: &'static [(&'static str, Channel)] = &[
        ("log", Channel::Log),
        ("webhook", Channel::Webhook),
        ("telegram", Channel::Telegram),
    ];
    const WHAT: &'static str = "notify channel";
    const PLURAL: &'static str = "channels";
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        super::choice_name(self)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NotifyConfig {
    pub channel: Channel,
    /// The webhook channel's address, as written (not a template).
    pub url: Option<String>,
}

pub(super) fn decode(f: &mut Fields<'_>, d: &mut Diagnostics) -> Option<NotifyConfig> {
    let written = f.get("channel").is_some();
    let channel = f.choice::<Channel>(d, "channel");
    let url = f.string(d, "url", "a URL string");
    let url_written = f.get("url").is_some();
    // Read so they are known keys; the webhook channel does not use them yet.
    f.get("method");
    f.get("headers");
    if written && channel.is_none() {
        return None;
    }
    let channel = channel.unwrap_or(Channel::Log);
    if channel == Channel::Webhook && !url_written {
        d.error(
            f.span(),
            f.path(),
            "the webhook channel needs `executor_config.url`",
        );
        return None;
    }
    Some(NotifyConfig { channel, url })
}
