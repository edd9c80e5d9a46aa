//! JSON Schemas (draft-07) of pipeline files and of `config.yaml`, for editors
//! (yaml-language-server) and CI: `vectorstep schema [pipeline|config]`.
//!
//! Built from the key lists the decoders validate with (`pipeline::steps`,
//! `pipeline::validate`, `executor_config::*::FIELDS`, `config::decode`, ...), so a
//! key added to a decoder shows up here; the tests below fail until it is
//! described. Pure: returns a `serde_json::Value`, reads and writes nothing.
//!
//! What the schemas follow from the decoders: an explicit `null` counts as absent,
//! so every optional key also accepts `null`; mappings whose unknown keys are
//! errors are `additionalProperties: false`, while `executor_config` (unknown keys
//! are warnings) stays open; VectorStep keys this engine ignores with a warning
//! are listed as properties that take anything.

mod config;
mod config_named;
mod pipeline;
mod units;

use serde_json::{json, Map, Value};

pub use self::config::config;
pub use self::pipeline::pipeline;

/// The draft both schemas declare (the one yaml-language-server supports best).
pub const DRAFT: &str = "http://json-schema.org/draft-07/schema#";

/// Which schema `vectorstep schema` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Pipeline,
    Config,
}

/// The schema of `which`.
pub fn schema(which: Which) -> Value {
    match which {
        Which::Pipeline => pipeline(),
        Which::Config => config(),
    }
}

/// A schema of `ty` with a description.
pub(crate) fn typed(ty: &str, description: &str) -> Value {
    json!({"type": ty, "description": description})
}

/// A string (templates are strings too).
pub(crate) fn string(description: &str) -> Value {
    typed("string", description)
}

/// What `Obj::text` accepts: any scalar, read as its text.
pub(crate) fn text(description: &str) -> Value {
    json!({"type": ["string", "number", "boolean"], "description": description})
}

/// One of `words` (`Obj::choice`).
pub(crate) fn choice(words: &[&str], description: &str) -> Value {
    json!({"type": "string", "enum": words, "description": description})
}

/// A whole number >= `min` (`Obj::u64`, `Obj::at_least_one`).
pub(crate) fn integer(min: u64, description: &str) -> Value {
    json!({"type": "integer", "minimum": min, "description": description})
}

/// A number of seconds >= 0 (`Obj::seconds`).
pub(crate) fn seconds(description: &str) -> Value {
    json!({"type": "number", "minimum": 0, "description": description})
}

/// A number within 0..=1 (`Obj::fraction`).
pub(crate) fn fraction(description: &str) -> Value {
    json!({"type": "number", "minimum": 0, "maximum": 1, "description": description})
}

/// A list of scalars, each read as text (`Obj::str_list`).
pub(crate) fn str_list(description: &str) -> Value {
    json!({
        "type": "array",
        "items": {"type": ["string", "number", "boolean"]},
        "description": description,
    })
}

/// A mapping of names to scalars; a `null` value is the empty string (`Obj::str_map`).
pub(crate) fn str_map(description: &str) -> Value {
    json!({
        "type": "object",
        "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
        "description": description,
    })
}

/// A free-form mapping (`Obj::json_map`).
pub(crate) fn mapping(description: &str) -> Value {
    typed("object", description)
}

/// `schema` with a `default`.
pub(crate) fn default(mut schema: Value, value: impl Into<Value>) -> Value {
    if let Some(m) = schema.as_object_mut() {
        m.insert("default".into(), value.into());
    }
    schema
}

/// `schema`, also accepting `null` (an optional key written without a value).
pub(crate) fn nullable(mut schema: Value) -> Value {
    let Some(m) = schema.as_object_mut() else {
        return schema;
    };
    let mut typed = false;
    match m.get_mut("type") {
        Some(Value::String(t)) => {
            let t = std::mem::take(t);
            m.insert("type".into(), json!([t, "null"]));
            typed = true;
        }
        Some(Value::Array(ts)) => {
            if !ts.contains(&json!("null")) {
                ts.push(json!("null"));
            }
            typed = true;
        }
        _ => {}
    }
    if let Some(Value::Array(words)) = m.get_mut("enum") {
        words.push(Value::Null);
    }
    if !typed {
        if let Some(Value::Array(alternatives)) = m.get_mut("anyOf") {
            alternatives.push(json!({"type": "null"}));
        }
    }
    schema
}

/// A keyword for the VectorStep keys this engine ignores: anything goes.
pub(crate) fn ignored() -> Value {
    json!({"description": "A VectorStep feature this engine does not implement: accepted with a warning and ignored."})
}

/// An object with one property per key of `keys` (described by `describe`, in
/// the decoder's order) plus the `ignored` keys. Keys not in `required` also take
/// `null`. `closed`: unknown keys are errors (`additionalProperties: false`).
/// A key `describe` does not know gets an empty schema, which the tests reject.
pub(crate) fn object(
    description: &str,
    keys: &[&str],
    ignored_keys: &[&str],
    required: &[&str],
    closed: bool,
    describe: impl Fn(&str) -> Option<Value>,
) -> Value {
    let mut properties = Map::new();
    for key in keys {
        let schema = describe(key).unwrap_or_else(|| json!({}));
        let schema = if required.contains(key) {
            schema
        } else {
            nullable(schema)
        };
        properties.insert((*key).to_string(), schema);
    }
    for key in ignored_keys {
        properties.insert((*key).to_string(), ignored());
    }
    let mut o = Map::new();
    o.insert("type".into(), json!("object"));
    o.insert("description".into(), json!(description));
    o.insert("properties".into(), Value::Object(properties));
    if !required.is_empty() {
        o.insert("required".into(), json!(required));
    }
    if closed {
        o.insert("additionalProperties".into(), json!(false));
    }
    Value::Object(o)
}

/// Adds `key: value` to the object schema `schema`.
pub(crate) fn with(mut schema: Value, key: &str, value: Value) -> Value {
    if let Some(m) = schema.as_object_mut() {
        m.insert(key.to_string(), value);
    }
    schema
}

/// A document schema: `$schema`, `$id`-less, with `title` and `definitions`.
pub(crate) fn document(title: &str, mut root: Value, definitions: Map<String, Value>) -> Value {
    let Some(m) = root.as_object_mut() else {
        return root;
    };
    let mut out = Map::new();
    out.insert("$schema".into(), json!(DRAFT));
    out.insert("title".into(), json!(title));
    out.append(m);
    if !definitions.is_empty() {
        out.insert("definitions".into(), Value::Object(definitions));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests;
