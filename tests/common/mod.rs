//! Support shared by the integration tests, in one place:
//! - `peer`: the fake peer, a real HTTP server on 127.0.0.1 that counts and records
//!   every request and answers, holds or scripts its replies;
//! - `service`: the real `vectorstep serve` binary on a scratch folder, killed and
//!   restarted on the same store, with readers for the runs it reports;
//! - `engine`: the one scratch engine in the test process, for tests that drive runs
//!   directly;
//! - `telegram`: a fake Telegram Bot API server;
//! - `intake`, `approvals`: harnesses for the service and approval tests;
//! - `postgres`: a real, throwaway PostgreSQL server;
//! - `backend`: which store the tests run on (`VECTORSTEP_TEST_BACKEND`);
//! - `executors`: an executor call built by hand;
//! - `tool_agent`: an agent with one tool that needs approval, and its fake peer;
//! - `browser`: a real headless Chromium driven over the DevTools protocol, for the
//!   web pages' tests.
//!
//! The modules named after the folders they replace (`crash_support`, `support`,
//! ...) only re-export, so that test files keep their paths.

#![allow(dead_code)]

pub mod approvals;
pub mod backend;
pub mod browser;
pub mod engine;
pub mod executors;
pub mod intake;
pub mod peer;
pub mod postgres;
pub mod service;
pub mod telegram;
pub mod tool_agent;

/// The crash-test harness: the binary and the holding peer.
#[allow(unused_imports)]
pub mod crash_support {
    pub use super::peer::{Answer, HoldingPeer, Reply, Seen};
    pub use super::service::*;
}

/// The peers and call builders of the executor tests.
#[allow(unused_imports)]
pub mod support {
    pub use super::executors::{action, call};
    pub use super::peer::{completion, FakeLlm, FakeServer, Recorded, Reply};
}

#[allow(unused_imports)]
pub use {
    approvals as approvals_support, engine as engine_support, intake as service_support,
    telegram as telegram_fake,
};
