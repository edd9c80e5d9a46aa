//! Pipeline definitions: the authored YAML (as [`crate::yaml::Node`] trees), the
//! validation pass into the [`model`] types, templates compiled at load, the step
//! library and the config fingerprint. Pure apart from `loader`, which reads files.

mod action;
mod context;
pub mod executor_config;
pub mod fingerprint;
pub mod library;
pub mod loader;
pub mod model;
mod steps;
pub mod template;
mod validate;

pub use loader::{load, load_file, PipelineSet};
pub use model::*;
