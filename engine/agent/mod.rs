//! The edges of tool-using agents (SPEC 10) that the agent loop calls: checking a
//! model's tool arguments against the tool's schema (`schema`), running a declared
//! webhook or shell tool (`declared`), the OpenAI-compatible request and reply
//! shapes with `tools` / `tool_calls` (`openai`), and the scripted provider that
//! replays turns from a YAML file (`scripted`).
//!
//! Nothing here touches the store or imports the runner: the loop journals every
//! turn and call and decides what a result means; these functions only build,
//! parse and perform one call each.

pub mod declared;
pub mod openai;
pub mod schema;
pub mod scripted;
