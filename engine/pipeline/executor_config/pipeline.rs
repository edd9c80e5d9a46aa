//! `pipeline`: runs another pipeline of the same folder as a child run.

use serde_json::{Map, Value as Json};

use super::{FieldSpec, Fields};
use crate::diag::Diagnostics;

pub const FIELDS: &[FieldSpec] = &[
    FieldSpec {
        name: "pipeline",
        ty: "string",
        default: "required",
        doc: "The child pipeline's name; it may not reach this pipeline again.",
    },
    FieldSpec {
        name: "context",
        ty: "mapping",
        default: "{}",
        doc: "Overrides for the child's event; string values are templates.",
    },
];

#[derive(Debug, Clone, PartialEq)]
pub struct PipelineConfig {
    pub pipeline: String,
    /// As written; string values are rendered at pointers `context/...`.
    pub context: Map<String, Json>,
}

pub(super) fn decode(f: &mut Fields<'_>, d: &mut Diagnostics) -> Option<PipelineConfig> {
    let name = f.get("pipeline");
    let context = match f.get("context") {
        Some(c) if c.as_map().is_some() => {
            f.string_templates(c, "context", &f.path_of("context"));
            match c.to_json() {
                Json::Object(m) => m,
                _ => Map::new(),
            }
        }
        Some(c) => {
            f.wrong_type(d, c, &f.path_of("context"), "a mapping");
            Map::new()
        }
        None => Map::new(),
    };
    let Some(n) = name else {
        d.error(
            f.span(),
            f.path(),
            "the pipeline executor needs `executor_config.pipeline`",
        );
        return None;
    };
    let Some(pipeline) = n.as_str() else {
        f.wrong_type(d, n, &f.path_of("pipeline"), "a pipeline name");
        return None;
    };
    Some(PipelineConfig {
        pipeline: pipeline.to_string(),
        context,
    })
}
