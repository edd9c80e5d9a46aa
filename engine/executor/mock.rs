//! `mock`: a configurable fake for offline demos and pipeline tests.
//!
//! Its `executor_config` keys are declared in
//! [`crate::pipeline::executor_config::mock::FIELDS`].

use std::time::Duration;

use serde_json::Value;

use super::{BoxFuture, Call, Error, Executor, Outcome};
use crate::pipeline::executor_config::MockFail;
use crate::pipeline::ExecutorConfig;
use crate::run::{StepOutput, Usage};

pub struct Mock;

/// Replaces the string at each rendered JSON pointer (`output/summary`) in `v`.
fn apply_rendered(v: &mut Value, call: &Call<'_>) {
    for (pointer, text) in &call.rendered {
        let Some(rest) = pointer.strip_prefix("output") else {
            continue;
        };
        if let Some(slot) = v.pointer_mut(rest) {
            *slot = Value::String(text.clone());
        }
    }
}

impl Executor for Mock {
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(async move {
            let ExecutorConfig::Mock(cfg) = &call.action.config else {
                return Err(super::wrong_config(&call, "mock"));
            };
            if let Some(ms) = cfg.delay_ms {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            match &cfg.fail {
                Some(MockFail::Default) => return Err(Error::Failed("mock failure".into())),
                Some(MockFail::Message(msg)) => return Err(Error::Failed(msg.clone())),
                None => {}
            }
            let output = match &cfg.output {
                Some(v) => {
                    let mut v = v.clone();
                    apply_rendered(&mut v, &call);
                    StepOutput::from_json(&v).map_err(|e| Error::BadOutput(e.to_string()))?
                }
                None => StepOutput::new(1.0, format!("mock step {} done", call.step_path)),
            };
            let usage = cfg.usage.as_ref().map(|u| Usage {
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
                cost_usd: u.cost_usd,
            });
            Ok(Outcome {
                output,
                usage: usage.unwrap_or_default(),
            })
        })
    }
}
