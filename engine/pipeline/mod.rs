//! Pipeline definitions: the authored YAML (as [`crate::yaml::Node`] trees), the
//! validation pass into the [`model`] types, templates compiled at load, the step
//! library and the config fingerprint. Pure apart from `loader`, which reads files.
//!
//! The files form layers, each importing only those below it: `loader` (files, the
//! set of pipelines) > `validate` (one pipeline) > `steps` (its entries) > `action`
//! (one unit of work) > `context` (the shared validation context) > `library`,
//! `template`, `model`, `executor_config`. `tests/layers.rs` fails on a cycle.

mod action;
mod context;
pub mod executor_config;
pub mod fingerprint;
pub mod library;
pub mod loader;
pub mod model;
pub(crate) mod step_labels;
pub(crate) mod steps;
pub mod template;
pub(crate) mod validate;

pub use loader::{load, load_file, PipelineSet};
pub use model::*;
