//! `mock`: a configurable fake for offline demos and pipeline tests.

use serde_json::Value as Json;

use super::{number, FieldSpec, Fields};
use crate::decode::join;
use crate::diag::Diagnostics;
use crate::yaml::Value;

pub const FIELDS: &[FieldSpec] = &[
    FieldSpec {
        name: "output",
        ty: "mapping",
        default: "{confidence: 1.0, summary: \"mock step <path> done\"}",
        doc: "The step output; string values containing `{{` or `{%` are templates.",
    },
    FieldSpec {
        name: "delay_ms",
        ty: "integer >= 0",
        default: "0",
        doc: "How long to sleep before answering.",
    },
    FieldSpec {
        name: "usage",
        ty: "{input_tokens, output_tokens, cost_usd}",
        default: "no usage",
        doc: "Token usage to report, counted against the budget like an agent's.",
    },
    FieldSpec {
        name: "fail",
        ty: "boolean | string",
        default: "false",
        doc: "`true` fails every attempt with \"mock failure\", a string with that message.",
    },
];

/// The keys of `usage` (others are not read).
pub const USAGE_KEYS: [&str; 3] = ["input_tokens", "output_tokens", "cost_usd"];

#[derive(Debug, Clone, PartialEq)]
pub struct MockConfig {
    /// As written; string templates are rendered at pointers `output/...`.
    pub output: Option<Json>,
    pub delay_ms: Option<u64>,
    pub usage: Option<MockUsage>,
    pub fail: Option<MockFail>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MockUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum MockFail {
    /// `fail: true`.
    Default,
    Message(String),
}

pub(super) fn decode(f: &mut Fields<'_>, d: &mut Diagnostics) -> Option<MockConfig> {
    let output = match f.get("output") {
        Some(n) if n.as_map().is_some() => {
            f.string_templates(n, "output", &f.path_of("output"));
            Some(n.to_json())
        }
        Some(n) => {
            f.wrong_type(d, n, &f.path_of("output"), "a mapping");
            None
        }
        None => None,
    };
    let delay_ms = match f.get("delay_ms") {
        Some(n) => match n.value {
            Value::Int(i) if i >= 0 => Some(i as u64),
            _ => {
                f.wrong_type(d, n, &f.path_of("delay_ms"), "an integer >= 0");
                None
            }
        },
        None => None,
    };
    let usage = match f.get("usage") {
        Some(n) if n.as_map().is_some() => {
            let path = f.path_of("usage");
            let count = |key: &str, d: &mut Diagnostics| match n.get(key).filter(|v| !v.is_null()) {
                None => 0,
                Some(v) => match v.value {
                    Value::Int(i) if i >= 0 => i as u64,
                    _ => {
                        f.wrong_type(d, v, &join(&path, key), "an integer >= 0");
                        0
                    }
                },
            };
            let [input, output, cost] = USAGE_KEYS;
            let input_tokens = count(input, d);
            let output_tokens = count(output, d);
            let cost_usd = match n.get(cost).filter(|v| !v.is_null()) {
                None => None,
                Some(v) => number(v).or_else(|| {
                    f.wrong_type(d, v, &join(&path, cost), "a number");
                    None
                }),
            };
            Some(MockUsage {
                input_tokens,
                output_tokens,
                cost_usd,
            })
        }
        Some(n) => {
            f.wrong_type(d, n, &f.path_of("usage"), "a mapping");
            None
        }
        None => None,
    };
    let fail = match f.get("fail") {
        Some(n) => match &n.value {
            Value::Bool(true) => Some(MockFail::Default),
            Value::Bool(false) => None,
            Value::Str(s) => Some(MockFail::Message(s.clone())),
            _ => {
                f.wrong_type(d, n, &f.path_of("fail"), "a boolean or a message");
                None
            }
        },
        None => None,
    };
    Some(MockConfig {
        output,
        delay_ms,
        usage,
        fail,
    })
}
