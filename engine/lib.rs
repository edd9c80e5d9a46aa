//! vectorstep: durable, YAML-defined ops-automation pipelines.

pub mod clock;
pub mod config;
pub mod decode;
pub mod diag;
pub mod executor;
pub mod http;
pub mod intake;
pub mod pipeline;
pub mod run;
pub mod runner;
pub mod store;
pub mod telegram;
pub mod telemetry;
pub mod view;
pub mod yaml;
