//! vectorstep: durable, YAML-defined ops-automation pipelines.

pub mod clock;
pub mod config;
pub mod decode;
pub mod diag;
/// The words of the run model (statuses, kinds, channels), each listed once.
pub mod domain;
/// The run-log event catalogue: every event's name, levels and fields.
pub mod events;
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

/// mimalloc instead of glibc malloc for every binary built on this library (the
/// service, its benchmarks and tests). Under webhook load glibc's malloc and free
/// were about 12% of the CPU, and requests that never reach the store are answered
/// about 30% faster with mimalloc. See docs/performance.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
