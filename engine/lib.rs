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

/// mimalloc instead of glibc malloc for every binary built on this library (the
/// service, its benchmarks and tests). Under load the service allocates and frees
/// from many threads at once; glibc keeps freed memory in per-thread arenas and
/// returns little of it, so 10,000 runs parked after a burst held ~40% more resident
/// memory than they use, and malloc/free were ~12% of the CPU of webhook intake.
/// See docs/performance.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
