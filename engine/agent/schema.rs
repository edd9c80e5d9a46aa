//! Tool arguments checked against the tool's `parameters` JSON Schema.
//!
//! A model's arguments are outside data: they are checked before anything runs,
//! and what is wrong is said in words a model can act on ("argument `service`:
//! expected string, got number"), since the message goes back to it as the
//! tool's result. The `jsonschema` crate does the checking; it is built without
//! its default features, so a `$ref` to a remote URL is an error and never a
//! network request. This file imports nothing else of the crate: `config` uses it
//! to check a declared tool's `parameters` when the file loads.

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::paths::LocationSegment;
use jsonschema::ValidationError;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use serde_json::Value;

/// At most this many problems are listed in one message; the model fixes them and
/// tries again.
const MAX_PROBLEMS: usize = 5;

/// Checks a declared tool's `parameters` when the config loads: a valid JSON
/// Schema whose top level describes an object (the function parameters of the
/// OpenAI tools format are always an object).
pub fn check_parameters(schema: &Value) -> Result<(), String> {
    let Some(obj) = schema.as_object() else {
        return Err(format!(
            "expected a JSON Schema object, found {}",
            json_type(schema)
        ));
    };
    match obj.get("type") {
        Some(Value::String(t)) if t == "object" => {}
        Some(other) => {
            return Err(format!(
                "the top-level `type` must be \"object\", found {other}"
            ))
        }
        None => return Err("the top-level schema needs `type: object`".into()),
    }
    jsonschema::validator_for(schema)
        .map(|_| ())
        .map_err(|e| format!("not a valid JSON Schema: {}", describe(&e)))
}

/// Checks `arguments` against `schema`. `Err` holds the message for the model,
/// every problem (up to a few) on its own line.
pub fn validate(schema: &Value, arguments: &Value) -> Result<(), String> {
    let validator = compiled(schema)?;
    let mut problems: Vec<String> = validator
        .iter_errors(arguments)
        .map(|e| describe(&e))
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    let more = problems.len().saturating_sub(MAX_PROBLEMS);
    problems.truncate(MAX_PROBLEMS);
    if more > 0 {
        problems.push(format!("({more} more problems)"));
    }
    Err(problems.join("\n"))
}

/// How many compiled schemas are kept; past it the cache starts over (tools come
/// from the config and the MCP servers' lists, so a few dozen is the usual count).
const MAX_COMPILED: usize = 256;

/// `schema` compiled, from a cache keyed by its JSON text: compiling a schema costs
/// far more than checking a call's arguments against it, and every tool call of
/// every turn is checked.
fn compiled(schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
    static CACHE: LazyLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> =
        LazyLock::new(Default::default);
    let key = schema.to_string();
    let cache = || CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(v) = cache().get(&key) {
        return Ok(v.clone());
    }
    let v = Arc::new(
        jsonschema::validator_for(schema)
            .map_err(|e| format!("the tool's parameter schema is invalid: {}", describe(&e)))?,
    );
    let mut c = cache();
    if c.len() >= MAX_COMPILED {
        c.clear();
    }
    c.insert(key, v.clone());
    Ok(v)
}

/// One problem in words: where (`argument `a.b[0]``, or `arguments` for the whole
/// object) and what.
fn describe(e: &ValidationError<'_>) -> String {
    let segments: Vec<LocationSegment<'_>> = e.instance_path().iter().collect();
    let mut place = String::new();
    for s in &segments {
        match s {
            LocationSegment::Property(p) => {
                if !place.is_empty() {
                    place.push('.');
                }
                place.push_str(p);
            }
            LocationSegment::Index(i) => place.push_str(&format!("[{i}]")),
        }
    }
    let what = what(e);
    if place.is_empty() {
        format!("arguments: {what}")
    } else {
        format!("argument `{place}`: {what}")
    }
}

fn what(e: &ValidationError<'_>) -> String {
    let got = json_type(e.instance());
    match e.kind() {
        ValidationErrorKind::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => t.to_string(),
                TypeKind::Multiple(set) => set
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            format!("expected {expected}, got {got}")
        }
        ValidationErrorKind::Required { property } => match property.as_str() {
            Some(p) => format!("missing required argument `{p}`"),
            None => format!("missing required argument {property}"),
        },
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let names: Vec<String> = unexpected.iter().map(|u| format!("`{u}`")).collect();
            format!("unknown argument {}", names.join(", "))
        }
        ValidationErrorKind::Enum { options } => {
            format!("{} is not one of {options}", shown(e.instance()))
        }
        ValidationErrorKind::Minimum { limit } => {
            format!("{} is less than the minimum {limit}", shown(e.instance()))
        }
        ValidationErrorKind::Maximum { limit } => {
            format!("{} is more than the maximum {limit}", shown(e.instance()))
        }
        ValidationErrorKind::MinLength { limit } => {
            format!("must be at least {limit} characters long")
        }
        ValidationErrorKind::MaxLength { limit } => {
            format!("must be at most {limit} characters long")
        }
        // The crate's own wording for the rest ("... does not match ...").
        _ => e.to_string(),
    }
}

/// The value as the model wrote it, cut short.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// JSON Schema's name for the type of `v` (`integer` for whole numbers).
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn compiled_schemas_are_kept_apart_by_their_text() {
        let of =
            |ty: &str| serde_json::json!({"type": "object", "properties": {"n": {"type": ty}}});
        let args = serde_json::json!({"n": 3});
        for _ in 0..2 {
            assert_eq!(super::validate(&of("integer"), &args), Ok(()));
            let e = super::validate(&of("string"), &args).expect_err("not a string");
            assert!(e.contains("argument `n`"), "{e}");
        }
    }

    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "service": {"type": "string", "minLength": 2, "maxLength": 10},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 5},
                "mode": {"enum": ["soft", "hard"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "target": {
                    "type": "object",
                    "properties": {"ns": {"type": "string"}},
                    "required": ["ns"],
                    "additionalProperties": false
                }
            },
            "required": ["service"],
            "additionalProperties": false
        })
    }

    fn check(arguments: Value, expected: Result<(), &str>) {
        let got = validate(&schema(), &arguments);
        assert_eq!(
            got.as_ref().map(|_| ()).map_err(String::as_str),
            expected,
            "arguments: {arguments}"
        );
    }

    #[test]
    fn arguments_against_the_subset_models_use() {
        check(json!({"service": "api"}), Ok(()));
        check(
            json!({"service": "api", "replicas": 3, "mode": "soft", "tags": ["a"], "target": {"ns": "x"}}),
            Ok(()),
        );
        check(
            json!({"service": 7}),
            Err("argument `service`: expected string, got integer"),
        );
        check(
            json!({"service": 1.5}),
            Err("argument `service`: expected string, got number"),
        );
        check(
            json!({}),
            Err("arguments: missing required argument `service`"),
        );
        check(
            json!("restart api"),
            Err("arguments: expected object, got string"),
        );
        check(
            json!({"service": "api", "force": true}),
            Err("arguments: unknown argument `force`"),
        );
        check(
            json!({"service": "api", "mode": "gentle"}),
            Err("argument `mode`: \"gentle\" is not one of [\"soft\",\"hard\"]"),
        );
        check(
            json!({"service": "api", "replicas": 0}),
            Err("argument `replicas`: 0 is less than the minimum 1"),
        );
        check(
            json!({"service": "api", "replicas": 9}),
            Err("argument `replicas`: 9 is more than the maximum 5"),
        );
        check(
            json!({"service": "a"}),
            Err("argument `service`: must be at least 2 characters long"),
        );
        check(
            json!({"service": "a-very-long-name"}),
            Err("argument `service`: must be at most 10 characters long"),
        );
        check(
            json!({"service": "api", "tags": ["ok", 3]}),
            Err("argument `tags[1]`: expected string, got integer"),
        );
        check(
            json!({"service": "api", "target": {}}),
            Err("argument `target`: missing required argument `ns`"),
        );
        check(
            json!({"service": "api", "target": {"ns": 1}}),
            Err("argument `target.ns`: expected string, got integer"),
        );
    }

    #[test]
    fn several_problems_are_listed_together() {
        let err = validate(&schema(), &json!({"replicas": "two", "extra": 1})).unwrap_err();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 3, "{err}");
        assert!(err.contains("missing required argument `service`"), "{err}");
        assert!(
            err.contains("argument `replicas`: expected integer, got string"),
            "{err}"
        );
        assert!(err.contains("unknown argument `extra`"), "{err}");
    }

    #[test]
    fn a_union_type_names_every_choice() {
        let s = json!({"type": "object", "properties": {"n": {"type": ["string", "integer"]}}});
        let err = validate(&s, &json!({"n": true})).unwrap_err();
        assert_eq!(err, "argument `n`: expected integer or string, got boolean");
    }

    #[test]
    fn parameter_schemas_are_checked_at_load() {
        let cases: [(Value, Result<(), &str>); 6] = [
            (json!({"type": "object"}), Ok(())),
            (schema(), Ok(())),
            (json!([]), Err("expected a JSON Schema object, found array")),
            (
                json!({"properties": {}}),
                Err("the top-level schema needs `type: object`"),
            ),
            (
                json!({"type": "string"}),
                Err("the top-level `type` must be \"object\", found \"string\""),
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "strin"}}}),
                Err("not a valid JSON Schema"),
            ),
        ];
        for (schema, want) in cases {
            let got = check_parameters(&schema);
            match (&got, want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(w)) => assert!(e.starts_with(w), "{schema}: got `{e}`, want `{w}`"),
                _ => panic!("{schema}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_remote_reference_is_refused_without_a_request() {
        let s =
            json!({"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/x.json"}}});
        let err = check_parameters(&s).unwrap_err();
        assert!(err.starts_with("not a valid JSON Schema"), "{err}");
    }
}
