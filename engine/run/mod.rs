//! The run state machine's pure parts: the output contract, flow decisions (gates,
//! joins, budgets, fan-out lists), how a unit settles the run and what a boundary
//! does (`settle`), what follows an attempt (`attempt`), how a group joins
//! (`join`), what an agent's model reply leads to (`turns`), the template context,
//! the resume planner (`plan`), what a replay copies and whether it may
//! (`replay`), the agent step journal's resume decisions (`journal`) and who
//! drives a run among several replicas (`lease`).
//! Nothing here does I/O, and nothing is `async`: `runner` performs what these
//! functions decide (`tests::nothing_here_is_async` checks it).

pub mod attempt;
pub mod context;
pub mod flow;
pub mod join;
pub mod journal;
pub mod lease;
pub mod output;
pub mod plan;
pub mod replay;
pub mod settle;
pub mod turns;

pub use output::{OutputError, StepOutput, Usage};

#[cfg(test)]
mod tests {
    /// The machine stays pure: no `async fn`, no tokio, no store handle, no clock.
    #[test]
    fn nothing_here_is_async() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/run");
        // Store rows are data and welcome; the store itself is not.
        let banned = ["async fn", "tokio", ".await", "store::Store", "clock::"];
        let mut found = Vec::new();
        let entries = std::fs::read_dir(&dir).expect("engine/run is readable");
        for entry in entries.flatten() {
            let path = entry.path();
            if path.file_name().is_some_and(|n| n == "mod.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a source file is readable");
            for (n, line) in text.lines().enumerate() {
                for word in banned {
                    if line.contains(word) {
                        found.push(format!("{}:{}: {word}", path.display(), n + 1));
                    }
                }
            }
        }
        assert!(found.is_empty(), "run/ must stay pure: {found:#?}");
    }
}

/// What the table tests of `plan` and `replay` share.
#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Arc;

    use crate::config::Config;
    use crate::pipeline::model::Pipeline;
    use crate::pipeline::{self, PipelineSet};

    /// Loads one pipeline from YAML (mock and human steps only, so no config is
    /// needed).
    pub fn pipeline(yaml: &str) -> Arc<Pipeline> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.yaml");
        std::fs::write(&file, yaml).unwrap();
        let config = Config {
            step_library_dir: dir.path().join("no-library"),
            ..Config::default()
        };
        let (set, d): (Option<PipelineSet>, _) = pipeline::load(&[file], &config);
        set.unwrap_or_else(|| panic!("{d}")).pipelines[0].clone()
    }
}
