//! The run state machine's pure parts: the output contract, flow decisions (gates,
//! joins, budgets, fan-out lists), the template context and the resume planner.
//! Nothing here does I/O; `runner` performs what these functions decide.

pub mod context;
pub mod flow;
pub mod output;
pub mod plan;

pub use output::{OutputError, StepOutput, Usage};
