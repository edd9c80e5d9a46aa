//! The schema of a pipeline file: its top-level keys, from the key lists of
//! `pipeline::validate`; the step list entries are built in [`super::units`].

use serde_json::{json, Map, Value};

use super::units::{config_definition, entry, executor_config, executor_rules, kinds};
use super::{
    choice, default, document, integer, mapping, object, str_list, str_map, string, typed, with,
};
use crate::pipeline::validate::*;

/// The schema of a pipeline file.
pub fn pipeline() -> Value {
    let root = object(
        "A vectorstep pipeline: a trigger and the steps a matching event runs.",
        PIPELINE_KEYS,
        PIPELINE_IGNORED_KEYS,
        &["name", "trigger", "steps"],
        true,
        top_key,
    );
    let mut definitions = Map::new();
    for kind in kinds() {
        definitions.insert(config_definition(kind), executor_config(kind));
    }
    definitions.insert("executor_rules".into(), executor_rules());
    document("vectorstep pipeline", root, definitions)
}

fn top_key(key: &str) -> Option<Value> {
    Some(match key {
        "name" => with(
            string("The pipeline's unique name, used for routing, runs and metrics."),
            "pattern",
            json!(r"\S"),
        ),
        "description" => string("What the pipeline is for."),
        "tags" => str_list("Informational tags."),
        "version" => default(
            integer(0, "An informational version number."),
            DEFAULT_VERSION,
        ),
        "stage" => default(
            choice(STAGES, "`production` runs on matching alerts; `testing` only when asked for, with notifications logged."),
            STAGES[0],
        ),
        "trigger" => trigger(),
        "vars" => str_map("Values spread into the template context."),
        "context_template" => object(
            "Which parts of the event reach templates.",
            CONTEXT_TEMPLATE_KEYS,
            &[],
            &[],
            true,
            |k| (k == "include").then(|| str_list("Event paths copied into the template context, e.g. `labels.service`.")),
        ),
        "steps" => json!({
            "type": "array",
            "description": "The step list, run in order: plain steps, `parallel:` groups and `fan_out:` entries.",
            "items": entry(),
        }),
        "notifications" => notifications(),
        "schedule" => object(
            "A cron trigger that starts the pipeline with a synthetic event.",
            SCHEDULE_KEYS,
            &[],
            &["cron"],
            true,
            |k| {
                Some(match k {
                    "cron" => string("Five fields (minute hour day-of-month month day-of-week), or six with seconds first."),
                    "summary" => string("The summary of the scheduled event."),
                    "severity" => default(string("The severity of the scheduled event."), DEFAULT_SCHEDULE_SEVERITY),
                    "labels" => str_map("The labels of the scheduled event."),
                    "team" => string("The team the scheduled run belongs to."),
                    _ => return None,
                })
            },
        ),
        "budget" => budget(),
        "durable" => json!({
            "description": "Whether a run survives a restart: `true`, or a mapping with the policy for the step in flight.",
            "anyOf": [
                {"type": "boolean"},
                object("The resume policy of a durable pipeline.", DURABLE_KEYS, &[], &[], true, |k| {
                    Some(match k {
                        "on_interrupted" => default(choice(ON_INTERRUPTED, "What happens to the step in flight at a restart: run it again, or escalate."), ON_INTERRUPTED[0]),
                        "max_resume_age_seconds" => integer(0, "A run older than this is interrupted instead of resumed (default: durability.max_resume_age_seconds of config.yaml)."),
                        _ => return None,
                    })
                }),
            ],
        }),
        _ => return None,
    })
}

fn trigger() -> Value {
    let number = json!({"anyOf": [{"type": "number"}, {"type": "string", "pattern": r"^\s*[-+]?[0-9.]+([eE][-+]?[0-9]+)?\s*$"}]});
    let mut ops = Map::new();
    for op in MATCH_OPS {
        let operand = match *op {
            "regex" => json!({"type": "string"}),
            "in" | "not_in" => json!({"type": ["array", "string"]}),
            "gt" | "gte" | "lt" | "lte" => number.clone(),
            _ => json!({}),
        };
        ops.insert((*op).to_string(), operand);
    }
    let condition = json!({
        "description": "A value to equal, or a mapping with exactly one operator such as `{in: [critical, warning]}`.",
        "anyOf": [
            {"not": {"type": "object"}},
            {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 1,
                "properties": ops,
                "additionalProperties": false,
            },
        ],
    });
    object(
        "Which events start the pipeline; `trigger: {}` matches every event.",
        TRIGGER_KEYS,
        &[],
        &[],
        true,
        move |k| {
            Some(match k {
                "match" => json!({
                    "type": "object",
                    "description": "Conditions on event fields and labels; all must hold.",
                    "additionalProperties": condition.clone(),
                }),
                "dedup" => object(
                    "Per-pipeline overrides of the service's webhook dedup.",
                    TRIGGER_DEDUP_KEYS,
                    &[],
                    &[],
                    true,
                    |k| {
                        Some(match k {
                            "enabled" => typed(
                                "boolean",
                                "Whether repeated events within the window start no new run.",
                            ),
                            "window_seconds" => {
                                integer(0, "How long an event's fingerprint suppresses repeats.")
                            }
                            _ => return None,
                        })
                    },
                ),
                _ => return None,
            })
        },
    )
}

fn notifications() -> Value {
    let one = object(
        "One notification: a channel and the message template.",
        NOTIFICATION_KEYS,
        &[],
        &["channel", "template"],
        true,
        |k| {
            Some(match k {
                "channel" => choice(NOTIFICATION_CHANNELS, "Where the message goes."),
                "template" => string("The message, a Jinja template."),
                "config" => mapping("Channel settings; the webhook channel needs `url`."),
                _ => return None,
            })
        },
    );
    let one = with(
        one,
        "if",
        json!({"properties": {"channel": {"const": "webhook"}}, "required": ["channel"]}),
    );
    let one = with(
        one,
        "then",
        json!({"required": ["config"], "properties": {"config": {"type": "object", "required": ["url"]}}}),
    );
    json!({
        "type": "object",
        "description": "Notifications per action (`notify`, or any name an `on_abort` uses): one or a list.",
        "additionalProperties": {"anyOf": [one.clone(), {"type": "array", "items": one}]},
    })
}

fn budget() -> Value {
    let b = object(
        "Token and cost limits per run; at least one limit is required.",
        BUDGET_KEYS,
        &[],
        &[],
        true,
        |k| {
            Some(match k {
                "max_tokens" => integer(1, "The most tokens a run may use."),
                "max_usd" => {
                    json!({"type": "number", "exclusiveMinimum": 0, "description": "The most a run may cost, in USD."})
                }
                "max_cost" => {
                    json!({"type": "number", "exclusiveMinimum": 0, "description": "A synonym of `max_usd`."})
                }
                "include_approx_cost" => default(
                    typed(
                        "boolean",
                        "Whether approximate costs (models without pricing) count too.",
                    ),
                    false,
                ),
                _ => return None,
            })
        },
    );
    with(
        b,
        "anyOf",
        json!([{"required": ["max_tokens"]}, {"required": ["max_usd"]}, {"required": ["max_cost"]}]),
    )
}
