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

#[cfg(test)]
mod tests {
    /// The loop that calls these edges journals through the runner and the store;
    /// the edges themselves stay below both, so they can be tested without either.
    #[test]
    fn imports_neither_runner_nor_store() {
        let files = [
            ("declared.rs", include_str!("declared.rs")),
            ("openai.rs", include_str!("openai.rs")),
            ("schema.rs", include_str!("schema.rs")),
            ("scripted.rs", include_str!("scripted.rs")),
        ];
        let banned = ["crate::runner", "crate::store", "rusqlite", "super::super"];
        for (file, text) in files {
            for (i, line) in text.lines().enumerate() {
                for b in banned {
                    assert!(
                        !line.contains(b),
                        "engine/agent/{file}:{}: `{b}`: agent/ must not import the runner or the store",
                        i + 1
                    );
                }
            }
        }
    }
}
