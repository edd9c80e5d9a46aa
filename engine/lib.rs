//! vectorstep: durable, YAML-defined ops-automation pipelines.

pub mod config;
pub mod decode;
pub mod diag;
pub mod executor;
pub mod pipeline;
pub mod run;
pub mod store;
pub mod yaml;
