//! Building an executor call by hand, for tests that run one executor directly.

use std::collections::BTreeMap;

use serde_json::Value;
use vectorstep::executor::Call;
use vectorstep::pipeline::template::Template;
use vectorstep::pipeline::{Action, ExecutorConfig, ExecutorKind};

/// An action as the pipeline loader would build it, without templates.
pub fn action(kind: ExecutorKind, name: &str, config: Value) -> Action {
    Action {
        executor_name: name.to_string(),
        executor: kind,
        config: ExecutorConfig::from_json(kind, &config).expect("a valid executor_config"),
        agent: None,
        prompt: Template::empty(),
        config_templates: Vec::new(),
        timeout_seconds: None,
    }
}

/// A first attempt of step `check` in run `run-1`.
pub fn call<'a>(action: &'a Action, prompt: &str) -> Call<'a> {
    Call {
        run_id: "run-1",
        pipeline: "test-pipeline",
        step_path: "check",
        idempotency_key: "run-1:check:1",
        attempt: 1,
        action,
        prompt: prompt.to_string(),
        rendered: BTreeMap::new(),
        timeout: None,
    }
}
