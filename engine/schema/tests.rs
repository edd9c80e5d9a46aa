//! No drift between the schemas and the decoders: every object the schemas
//! describe is listed here with the decoder's key constants, and its `properties`
//! must be exactly those keys, both ways; every described object is in the list.

use std::collections::BTreeSet;

use serde_json::Value;

use super::units::{config_definition, field, kinds};
use super::*;
use crate::config::decode::*;
use crate::config::{mcp, tools};
use crate::decode::IGNORED_VECTORSTEP_KEYS;
use crate::pipeline::executor_config::{mock, Channel, Choice, ExecutorKind};
use crate::pipeline::library::USE_KEY;
use crate::pipeline::steps::*;
use crate::pipeline::validate::*;

const USE: &[&str] = &[USE_KEY];
const ENTRY: &str = "/properties/steps/items";
const PARALLEL: &str = "/properties/steps/items/then/properties/parallel";
const FAN_OUT: &str = "/properties/steps/items/else/then/properties/fan_out";
const STEP: &str = "/properties/steps/items/else/else";

/// (JSON pointer, the key lists whose union is its `properties`, closed).
type Row = (String, Vec<&'static [&'static str]>, bool);

fn row(pointer: &str, keys: &[&'static [&'static str]], closed: bool) -> Row {
    (pointer.to_string(), keys.to_vec(), closed)
}

fn pipeline_rows() -> Vec<Row> {
    let notification = "/properties/notifications/additionalProperties/anyOf";
    let mut rows = vec![
        row("", &[PIPELINE_KEYS, PIPELINE_IGNORED_KEYS], true),
        row("/properties/trigger", &[TRIGGER_KEYS], true),
        row(
            "/properties/trigger/properties/dedup",
            &[TRIGGER_DEDUP_KEYS],
            true,
        ),
        row(
            "/properties/context_template",
            &[CONTEXT_TEMPLATE_KEYS],
            true,
        ),
        row("/properties/schedule", &[SCHEDULE_KEYS], true),
        row("/properties/budget", &[BUDGET_KEYS], true),
        row("/properties/durable/anyOf/1", &[DURABLE_KEYS], true),
        row(&format!("{notification}/0"), &[NOTIFICATION_KEYS], true),
        row(
            &format!("{notification}/1/items"),
            &[NOTIFICATION_KEYS],
            true,
        ),
        row(&format!("{ENTRY}/then"), &[PARALLEL_ENTRY_KEYS], true),
        row(PARALLEL, &[PARALLEL_KEYS, PARALLEL_IGNORED_KEYS], true),
        row(
            &format!("{PARALLEL}/properties/steps/items"),
            &[BRANCH_KEYS, USE, BRANCH_IGNORED_KEYS],
            true,
        ),
        row(&format!("{ENTRY}/else/then"), &[FANOUT_ENTRY_KEYS], true),
        row(FAN_OUT, &[FANOUT_KEYS, USE, FANOUT_IGNORED_KEYS], true),
        row(STEP, &[STEP_KEYS, USE, IGNORED_VECTORSTEP_KEYS], true),
        row(&format!("{STEP}/properties/retry"), &[RETRY_KEYS], true),
        row(
            &format!("{STEP}/properties/loop_until"),
            &[LOOP_UNTIL_KEYS],
            true,
        ),
        row(
            &format!("{STEP}/properties/on_failure/anyOf/1"),
            &[ON_FAILURE_KEYS],
            true,
        ),
        row(
            &format!("{STEP}/properties/on_failure/anyOf/1/properties/webhook"),
            &[FAILURE_WEBHOOK_KEYS],
            true,
        ),
        row(
            "/definitions/mock_executor_config/properties/usage",
            &[&mock::USAGE_KEYS],
            false,
        ),
    ];
    for kind in kinds() {
        let names: Vec<&'static str> = kind.fields().iter().map(|f| f.name).collect();
        let names: &'static [&'static str] = Box::leak(names.into_boxed_slice());
        rows.push(row(
            &format!("/definitions/{}", config_definition(kind)),
            &[names],
            false,
        ));
    }
    rows
}

fn config_rows() -> Vec<Row> {
    let tool = "/properties/tools/additionalProperties";
    let mut rows = vec![
        row("", &[TOP_KEYS], true),
        row("/properties/server", &[SERVER_KEYS], true),
        row("/properties/database", &[DATABASE_KEYS], true),
        row("/properties/durability", &[DURABILITY_KEYS], true),
        row("/properties/dedup", &[DEDUP_KEYS], true),
        row("/properties/concurrency", &[CONCURRENCY_KEYS], true),
        row("/properties/auth", &[AUTH_KEYS], true),
        row(
            "/properties/providers/additionalProperties",
            &[PROVIDER_KEYS],
            true,
        ),
        row(
            "/properties/agents/additionalProperties",
            &[AGENT_KEYS],
            true,
        ),
        row(
            "/properties/agents/additionalProperties/properties/tools/items/anyOf/1",
            &[tools::AGENT_MCP_TOOL_KEYS],
            true,
        ),
        row(tool, &[tools::TOOL_KEYS], true),
        row(
            &format!("{tool}/properties/webhook"),
            &[tools::WEBHOOK_TOOL_KEYS],
            true,
        ),
        row(
            &format!("{tool}/properties/shell"),
            &[tools::SHELL_TOOL_KEYS],
            true,
        ),
        row(
            "/properties/pricing/additionalProperties",
            &[PRICE_KEYS],
            true,
        ),
        row("/properties/notifications", &[NOTIFICATIONS_KEYS], true),
        row(
            "/properties/notifications/properties/telegram",
            &[TELEGRAM_KEYS],
            true,
        ),
        row("/properties/human_approval", &[HUMAN_APPROVAL_KEYS], true),
        row(
            "/properties/human_approval/properties/default",
            &[ROUTE_KEYS],
            true,
        ),
        row(
            "/properties/human_approval/properties/teams/additionalProperties",
            &[ROUTE_KEYS],
            true,
        ),
        row("/properties/logging", &[LOGGING_KEYS], true),
        row("/properties/retention", &[RETENTION_KEYS], true),
        row(
            "/properties/mcp_servers/additionalProperties",
            &[mcp::KEYS],
            true,
        ),
        row("/properties/replica", &[REPLICA_KEYS], true),
    ];
    for list in AUTH_TOKEN_LISTS {
        rows.push(row(
            &format!("/properties/auth/properties/{list}/items"),
            &[TOKEN_KEYS],
            true,
        ));
    }
    rows
}

/// The pointers of every subschema that describes an object (has `properties`
/// and a `description`; `if` conditions have no description).
fn described_objects(v: &Value, pointer: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            if m.contains_key("properties") && m.contains_key("description") {
                out.insert(pointer.to_string());
            }
            for (k, x) in m {
                let k = k.replace('~', "~0").replace('/', "~1");
                described_objects(x, &format!("{pointer}/{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                described_objects(x, &format!("{pointer}/{i}"), out);
            }
        }
        _ => {}
    }
}

fn check(name: &str, schema: &Value, rows: &[Row]) {
    let mut problems = Vec::new();
    let mut described = BTreeSet::new();
    described_objects(schema, "", &mut described);
    let listed: BTreeSet<String> = rows.iter().map(|r| r.0.clone()).collect();
    for p in described.difference(&listed) {
        problems.push(format!("{p}: an object the drift table does not list"));
    }
    for (pointer, lists, closed) in rows {
        let Some(o) = schema.pointer(pointer) else {
            problems.push(format!("{pointer}: not in the schema"));
            continue;
        };
        let want: BTreeSet<&str> = lists.iter().flat_map(|l| l.iter().copied()).collect();
        let have: BTreeSet<&str> = o["properties"]
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        for k in want.difference(&have) {
            problems.push(format!(
                "{pointer}: the decoder's `{k}` is not in the schema"
            ));
        }
        for k in have.difference(&want) {
            problems.push(format!("{pointer}: `{k}` is not a key of the decoder"));
        }
        if (o.get("additionalProperties") == Some(&Value::Bool(false))) != *closed {
            problems.push(format!(
                "{pointer}: additionalProperties should be closed={closed}"
            ));
        }
        for (k, p) in o["properties"].as_object().into_iter().flatten() {
            let typed = ["type", "enum", "anyOf", "oneOf"]
                .iter()
                .any(|t| p.get(t).is_some());
            let ignored = p == &ignored();
            if !p["description"].is_string() || !(typed || ignored) {
                problems.push(format!(
                    "{pointer}/properties/{k}: needs a type and a description"
                ));
            }
            if let Some(d) = p.get("default") {
                let ok = jsonschema::validator_for(p).is_ok_and(|v| v.is_valid(d));
                if !ok {
                    problems.push(format!(
                        "{pointer}/properties/{k}: default {d} is not valid"
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{name} schema drifted:\n{}",
        problems.join("\n")
    );
}

#[test]
fn pipeline_schema_has_exactly_the_decoders_keys() {
    check("pipeline", &schema(Which::Pipeline), &pipeline_rows());
}

#[test]
fn config_schema_has_exactly_the_decoders_keys() {
    check("config", &config(), &config_rows());
}

#[test]
fn both_schemas_compile_as_draft_07() {
    for s in [schema(Which::Pipeline), schema(Which::Config)] {
        assert_eq!(s["$schema"], DRAFT);
        assert!(jsonschema::validator_for(&s).is_ok());
    }
}

#[test]
fn every_executor_kind_and_name_is_in_the_schema() {
    let s = schema(Which::Pipeline);
    let rules = s["definitions"]["executor_rules"]["allOf"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let in_rules: Vec<&str> = rules
        .iter()
        .flat_map(|r| {
            r["if"]["properties"]["executor"]["enum"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter_map(Value::as_str)
        .collect();
    let mut sorted = in_rules.clone();
    sorted.sort_unstable();
    let mut names = ExecutorKind::NAMES.to_vec();
    names.sort_unstable();
    assert_eq!(sorted, names, "every executor name has exactly one rule");
    for kind in kinds() {
        let def = config_definition(kind);
        assert!(s["definitions"][&def].is_object(), "{def}");
        for f in kind.fields() {
            assert!(
                field(f).is_some(),
                "{kind:?}.{}: type `{}` has no schema",
                f.name,
                f.ty
            );
        }
    }
    let branch = format!("{PARALLEL}/properties/steps/items");
    for unit in [STEP, FAN_OUT, branch.as_str()] {
        let p = format!("{unit}/properties/executor/enum");
        let words = s
            .pointer(&p)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for n in ExecutorKind::NAMES {
            assert!(words.contains(&Value::from(*n)), "{p}: {n}");
        }
    }
}

#[test]
fn enums_are_the_decoders_words() {
    let step = format!("{STEP}/properties");
    let channels: Vec<&str> = Channel::names().collect();
    let p = schema(Which::Pipeline);
    let c = config();
    let rows: Vec<(&Value, String, &[&str])> = vec![
        (&p, "/properties/stage".into(), STAGES),
        (
            &p,
            "/properties/durable/anyOf/1/properties/on_interrupted".into(),
            ON_INTERRUPTED,
        ),
        (
            &p,
            "/properties/notifications/additionalProperties/anyOf/0/properties/channel".into(),
            NOTIFICATION_CHANNELS,
        ),
        (&p, format!("{step}/executor"), ExecutorKind::NAMES),
        (&p, format!("{step}/on_low_confidence"), LOW_CONFIDENCE),
        (&p, format!("{step}/retry/properties/backoff"), BACKOFFS),
        (&p, format!("{step}/on_failure/anyOf/0"), FAILURE_POLICIES),
        (
            &p,
            format!("{step}/on_failure/anyOf/1/properties/webhook/properties/method"),
            FAILURE_WEBHOOK_METHODS,
        ),
        (&p, format!("{PARALLEL}/properties/join"), JOINS),
        (&p, format!("{FAN_OUT}/properties/on_empty"), ON_EMPTY),
        (
            &p,
            "/definitions/notify_executor_config/properties/channel".into(),
            &channels,
        ),
        (
            &c,
            "/properties/logging/properties/level/anyOf/0".into(),
            LOG_LEVELS,
        ),
        (
            &c,
            "/properties/logging/properties/format/anyOf/0".into(),
            LOG_FORMATS,
        ),
        (
            &c,
            "/properties/providers/additionalProperties/properties/kind/anyOf/0".into(),
            PROVIDER_KINDS,
        ),
        (
            &c,
            "/properties/human_approval/properties/default/properties/channel/anyOf/0".into(),
            ROUTE_CHANNELS,
        ),
        (
            &c,
            "/properties/tools/additionalProperties/properties/effect/anyOf/0".into(),
            tools::TOOL_EFFECTS,
        ),
        (
            &c,
            "/properties/tools/additionalProperties/properties/approval/anyOf/0".into(),
            tools::TOOL_APPROVALS,
        ),
    ];
    for (schema, pointer, words) in rows {
        let got: Vec<&str> = schema
            .pointer(&format!("{pointer}/enum"))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert_eq!(got, words, "{pointer}");
    }
}
