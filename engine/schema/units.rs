//! The entries of a pipeline's step list (plain steps, `parallel:` groups and
//! their branches, `fan_out:`), from the key lists of `pipeline::steps` and
//! `pipeline::library`, and `executor_config` from the `FIELDS` of every kind.

use serde_json::{json, Value};

use super::{
    choice, default, fraction, integer, mapping, nullable, object, seconds, str_map, string, text,
    typed, with,
};
use crate::decode::IGNORED_VECTORSTEP_KEYS;
use crate::pipeline::executor_config::{mock, Channel, Choice, ExecutorKind, FieldSpec};
use crate::pipeline::library::USE_KEY;
use crate::pipeline::steps::*;

/// A unit name: not blank, no `/` (it separates a group from its branches).
const NAME_PATTERN: &str = r"^[^/]*[^/\s][^/]*$";

/// Every executor kind, in the order of [`ExecutorKind::NAMES`].
pub(crate) fn kinds() -> Vec<ExecutorKind> {
    let mut out: Vec<ExecutorKind> = Vec::new();
    for kind in ExecutorKind::NAMES
        .iter()
        .filter_map(|n| ExecutorKind::parse(n))
    {
        if !out.contains(&kind) {
            out.push(kind);
        }
    }
    out
}

/// The name under `definitions` of `kind`'s `executor_config` schema.
pub(crate) fn config_definition(kind: ExecutorKind) -> String {
    format!("{}_executor_config", kind.as_str())
}

/// One entry of `steps:`: a `parallel:` group, a `fan_out:` or a plain step,
/// told apart by their keys as the decoder does (so errors name the real shape).
pub(super) fn entry() -> Value {
    let wrap = |keys: &[&str], inner: Value, description: &str| {
        object(description, keys, &[], keys, true, |_| Some(inner.clone()))
    };
    let has = |key: &str| json!({"type": "object", "required": [key]});
    json!({
        "if": has(PARALLEL_ENTRY_KEYS[0]),
        "then": wrap(PARALLEL_ENTRY_KEYS, parallel(), "A parallel group; no other key may sit beside `parallel`."),
        "else": {
            "if": has(FANOUT_ENTRY_KEYS[0]),
            "then": wrap(FANOUT_ENTRY_KEYS, fan_out(), "A fan-out; no other key may sit beside `fan_out`."),
            "else": step(),
        },
    })
}

/// A unit (step, branch, fan-out): `keys` and `use`, the executor rules, and
/// `needs` (keys required unless `use:` brings them from the library).
fn unit(
    description: &str,
    keys: &[&str],
    ignored: &[&str],
    required: &[&str],
    needs: &[&str],
) -> Value {
    let mut all: Vec<&str> = keys.to_vec();
    all.push(USE_KEY);
    let o = object(description, &all, ignored, required, true, step_key);
    let o = with(
        o,
        "allOf",
        json!([{"$ref": "#/definitions/executor_rules"}]),
    );
    let o = with(o, "if", json!({"required": [USE_KEY]}));
    with(o, "else", json!({"required": needs}))
}

fn step() -> Value {
    unit(
        "A plain step: one executor call, with its gate, retries and failure policy.",
        STEP_KEYS,
        IGNORED_VECTORSTEP_KEYS,
        &[],
        &["name", "executor"],
    )
}

fn fan_out() -> Value {
    unit(
        "Runs one executor call per item of a rendered list.",
        FANOUT_KEYS,
        FANOUT_IGNORED_KEYS,
        &["name", "over"],
        &["executor"],
    )
}

fn parallel() -> Value {
    object(
        "Branches that run at once and are joined into one result.",
        PARALLEL_KEYS,
        PARALLEL_IGNORED_KEYS,
        &["name", "steps"],
        true,
        |k| match k {
            "steps" => Some(json!({
                "type": "array",
                "minItems": 1,
                "description": "The branches: each a name, an executor and its config.",
                "items": unit("One branch of a parallel group.", BRANCH_KEYS, BRANCH_IGNORED_KEYS, &[], &["name", "executor"]),
            })),
            _ => step_key(k),
        },
    )
}

/// The keys of steps, branches, fan-outs and groups.
fn step_key(key: &str) -> Option<Value> {
    Some(match key {
        "name" => with(string("A unique name; later templates read this unit's output as `steps.<name>`."), "pattern", json!(NAME_PATTERN)),
        k if k == USE_KEY => string("A step of the step library to start from; local keys replace its keys, `executor_config` merges one level deep."),
        "executor" => choice(ExecutorKind::NAMES, "What runs the unit; `executor_config` holds its settings."),
        "executor_config" => mapping("The executor's settings; which keys apply depends on `executor` (unknown keys are warnings)."),
        "prompt_template" => string("What the executor sends (LLM prompt, webhook body, approval or notification message), a Jinja template."),
        "timeout_seconds" => seconds("How long one attempt may take; 0 or absent means no timeout."),
        "confidence_threshold" => default(fraction("A confidence strictly below this triggers `on_low_confidence`."), DEFAULT_CONFIDENCE_THRESHOLD),
        "on_low_confidence" => default(choice(LOW_CONFIDENCE, "What a confidence below the threshold does."), LOW_CONFIDENCE[0]),
        "on_abort" => default(string("The `notifications:` action sent when this unit aborts the run."), DEFAULT_ON_ABORT),
        "when" => text("A Jinja expression (braces optional); the unit runs only when it is true."),
        "join" => default(choice(JOINS, "How the results are joined into one."), JOINS[0]),
        "weight" => default(json!({"type": "number", "minimum": 0, "description": "The branch's weight under `join: weighted_average`."}), DEFAULT_BRANCH_WEIGHT),
        "over" => with(string("A template rendering the item list (a JSON list), e.g. `{{ steps.triage.services | tojson }}`."), "pattern", json!(r"\S")),
        "as" => default(string("The name of the item variable in templates."), DEFAULT_ITEM_VAR),
        "as_var" => default(string("A synonym of `as`."), DEFAULT_ITEM_VAR),
        "max_items" => default(integer(1, "A list longer than this fails the fan-out."), DEFAULT_MAX_ITEMS),
        "on_empty" => default(choice(ON_EMPTY, "What an empty list does."), ON_EMPTY[0]),
        "include_approx_cost" => typed("boolean", "Per-step override of the budget's `include_approx_cost`."),
        "retry" => object("Retries of a failed attempt.", RETRY_KEYS, &[], &[], true, |k| {
            Some(match k {
                "attempts" => default(integer(1, "How many attempts in all (at most 1000)."), DEFAULT_RETRY_ATTEMPTS),
                "backoff" => default(choice(BACKOFFS, "How the delay grows between attempts."), BACKOFFS[BACKOFFS.len() - 1]),
                "delay_seconds" => default(seconds("The delay before the second attempt."), DEFAULT_RETRY_DELAY_SECONDS),
                _ => return None,
            })
        }),
        "loop_until" => object("Runs the step again until its confidence is high enough.", LOOP_UNTIL_KEYS, &[], &["confidence"], true, |k| {
            Some(match k {
                "confidence" => fraction("The confidence that ends the loop."),
                "max_iterations" => default(integer(1, "The most iterations (at most 1000)."), DEFAULT_MAX_ITERATIONS),
                _ => return None,
            })
        }),
        "on_failure" => default(on_failure(), FAILURE_POLICIES[0]),
        _ => return None,
    })
}

fn on_failure() -> Value {
    let webhook = object(
        "A request sent when the step fails.",
        FAILURE_WEBHOOK_KEYS,
        &[],
        &["url"],
        true,
        |k| {
            Some(match k {
                "url" => string("Where the request goes."),
                "method" => default(
                    choice(FAILURE_WEBHOOK_METHODS, "The HTTP method."),
                    FAILURE_WEBHOOK_METHODS[0],
                ),
                "headers" => str_map("Request headers."),
                "payload" => mapping("The JSON body; string values are templates."),
                "timeout_seconds" => default(
                    seconds("How long the request may take."),
                    DEFAULT_FAILURE_WEBHOOK_TIMEOUT_SECONDS,
                ),
                _ => return None,
            })
        },
    );
    json!({
        "description": "What a failed step does to the run: `abort` it, `continue`, or the block form with a webhook.",
        "anyOf": [
            {"type": "string", "enum": FAILURE_POLICIES},
            object("The block form of `on_failure`.", ON_FAILURE_KEYS, &[], &[], true, move |k| {
                Some(match k {
                    "policy" => default(choice(FAILURE_POLICIES, "Whether the run aborts or continues."), FAILURE_POLICIES[0]),
                    "webhook" => webhook.clone(),
                    _ => return None,
                })
            }),
        ],
    })
}

/// Per executor kind: the `executor_config` schema, and (without `use:`, which
/// may bring them) the keys the decoder requires.
pub(super) fn executor_rules() -> Value {
    let mut rules = Vec::new();
    for kind in kinds() {
        let names: Vec<&str> = ExecutorKind::NAMES
            .iter()
            .copied()
            .filter(|n| ExecutorKind::parse(n) == Some(kind))
            .collect();
        let required: Vec<&str> = kind
            .fields()
            .iter()
            .filter(|f| f.default == "required")
            .map(|f| f.name)
            .collect();
        // What the decoder requires of the config itself: `required` keys, and
        // keys "required for the X channel" (notify's `url`).
        let mut own = Vec::new();
        if !required.is_empty() {
            own.push(json!({"type": "object", "required": required}));
        }
        for f in kind.fields() {
            let word = f.default.strip_prefix("required for the ");
            if let Some(word) = word.and_then(|w| w.strip_suffix(" channel")) {
                own.push(json!({
                    "if": {"properties": {"channel": {"const": word}}, "required": ["channel"]},
                    "then": {"required": [f.name]},
                }));
            }
        }
        let mut then = json!({"properties": {"executor_config": {"$ref": format!("#/definitions/{}", config_definition(kind))}}});
        if !own.is_empty() {
            let mut otherwise = json!({"properties": {"executor_config": {"allOf": own}}});
            if !required.is_empty() {
                otherwise = with(otherwise, "required", json!(["executor_config"]));
            }
            then = with(then, "if", json!({"required": [USE_KEY]}));
            then = with(then, "else", otherwise);
        }
        rules.push(json!({
            "if": {"properties": {"executor": {"enum": names}}, "required": ["executor"]},
            "then": then,
        }));
    }
    json!({"allOf": rules})
}

/// `kind`'s `executor_config`: its `FIELDS`, open to unknown keys (warnings).
pub(super) fn executor_config(kind: ExecutorKind) -> Value {
    let fields = kind.fields();
    let keys: Vec<&str> = fields.iter().map(|f| f.name).collect();
    let o = object(
        &format!("The settings of the {} executor.", kind.as_str()),
        &keys,
        &[],
        &[],
        false,
        |k| fields.iter().find(|f| f.name == k).and_then(field),
    );
    nullable(o)
}

/// One `FieldSpec` as a schema: its type (from the docs' type words), doc and default.
pub(crate) fn field(f: &FieldSpec) -> Option<Value> {
    let scalar = json!(["string", "number", "boolean"]);
    let mut s = match f.ty {
        "string" | "template" => json!({"type": "string"}),
        "mapping" => json!({"type": "object"}),
        "number" => json!({"type": "number"}),
        "integer >= 0" => json!({"type": "integer", "minimum": 0}),
        "boolean | string" => json!({"type": ["boolean", "string"]}),
        "map string -> string" => {
            json!({"type": "object", "additionalProperties": {"type": scalar}})
        }
        "list of templates" => json!({"type": "array", "minItems": 1, "items": {"type": scalar}}),
        ty if ty == channel_words().join(" | ") => {
            json!({"type": "string", "enum": channel_words()})
        }
        ty if ty == format!("{{{}}}", mock::USAGE_KEYS.join(", ")) => usage(),
        _ => return None,
    };
    s = with(s, "description", json!(f.doc));
    if !f.default.starts_with("required") {
        let parsed = serde_json::from_str::<Value>(f.default).ok();
        let word = (!f.default.contains(' ')).then(|| json!(f.default));
        if let Some(d) = parsed.or(word) {
            s = default(s, d);
        }
    }
    Some(s)
}

fn channel_words() -> Vec<&'static str> {
    Channel::names().collect()
}

fn usage() -> Value {
    object(
        "Token usage to report.",
        &mock::USAGE_KEYS,
        &[],
        &[],
        false,
        |k| {
            Some(match k {
                "input_tokens" => integer(0, "Input tokens."),
                "output_tokens" => integer(0, "Output tokens."),
                "cost_usd" => typed("number", "The cost in USD."),
                _ => return None,
            })
        },
    )
}
