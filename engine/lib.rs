//! vectorstep: durable, YAML-defined ops-automation pipelines.
//!
//! The modules in reading order, from the words of the model up to the edges that
//! speak to the world (`docs/architecture.md` has the longer map and the invariants):
//!
//! - [`domain`]: the words of the run model (statuses, kinds, channels, ids, times),
//!   each listed once; imports nothing from the crate.
//! - [`events`]: the run-log event catalogue, the only way an event reaches the
//!   store; decides nothing.
//! - [`diag`]: diagnostics with file, line, column, field path and hint; knows no
//!   pipeline.
//! - [`yaml`]: YAML parsed into nodes that keep their position; interprets no key.
//! - [`decode`]: typed reading of a mapping node, every problem reported; reads no
//!   file.
//! - [`config`]: `config.yaml`, its `${VAR}` expansion and validation; starts
//!   nothing.
//! - [`pipeline`]: the authored YAML validated into a `Pipeline`, in layers
//!   (`loader` > `validate` > `steps` > `action` > `context`); only its `loader`
//!   reads files; runs nothing.
//! - [`run`]: pure run logic (output contract, flow decisions, template context,
//!   resume planner); no store calls, no clock, no network.
//! - [`agent`]: the edges of tool-using agents: tool argument schemas, declared
//!   webhook and shell tools, OpenAI `tools`/`tool_calls` shapes, the scripted
//!   provider; imports neither `runner` nor `store`.
//! - [`executor`]: one file per executor kind behind the `Executor` trait; touches no
//!   store, decides no run status.
//! - [`fixture`]: the cases of `vectorstep test` (trigger, scripted answers,
//!   expectations) and the pure comparison of a run with them; runs nothing.
//! - [`runner`]: the driver that performs what `run` decides (steps, groups,
//!   approvals, ends, resumes); parses no YAML, speaks no HTTP, never imports
//!   `telegram`. Its units use `runner::Services`, never the `Engine`.
//! - [`store`]: SQLite (migrations, the writer thread, one file per table, lock
//!   files); the only module that imports rusqlite; knows no pipeline.
//! - [`intake`]: alert normalisers, `trigger.match` and the resolver; touches no
//!   store.
//! - [`http`]: the axum router and its access policy; the only module that imports
//!   axum; runs no step itself.
//! - [`telegram`]: the Bot API client, approval messages and the update poller; the
//!   only module that imports teloxide; decides approvals only through the
//!   runner's `ApprovalDesk`.
//! - [`mcp`]: the MCP client edge (stdio children, streamable HTTP through
//!   `rmcp`), one shared session per configured server; `run` never imports it.
//! - [`schema`]: JSON Schemas of pipeline files and config.yaml, built from the
//!   decoders' key lists; does no I/O.
//! - [`view`]: the run JSON of `GET /runs/{id}` and the terminal table.
//! - [`telemetry`]: every metric name and the helpers that update them.
//! - [`clock`]: injected time, so tests can move it.
//!
//! The `vectorstep` binary (`engine/main.rs`, `engine/cli/`) parses arguments and
//! maps errors to exit codes with `anyhow`; it holds no logic the library lacks.

pub mod agent;
pub mod clock;
pub mod config;
pub mod decode;
pub mod diag;
pub mod domain;
pub mod events;
pub mod executor;
pub mod fixture;
pub mod http;
pub mod intake;
pub mod mcp;
pub mod pipeline;
pub mod run;
pub mod runner;
pub mod schema;
pub mod store;
pub mod telegram;
pub mod telemetry;
pub mod ui;
pub mod view;
pub mod yaml;

/// mimalloc instead of glibc malloc for every binary built on this library (the
/// service, its benchmarks and tests). Under webhook load glibc's malloc and free
/// were about 12% of the CPU, and requests that never reach the store are answered
/// about 30% faster with mimalloc. See docs/performance.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
