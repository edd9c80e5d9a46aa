//! `mock`: a configurable fake for offline demos and pipeline tests.
//!
//! `executor_config`: `output` (the step output; string values may be templates),
//! `delay_ms`, `usage {input_tokens, output_tokens, cost_usd}`, `fail` (true or an
//! error message).

use std::time::Duration;

use serde_json::Value;

use super::{BoxFuture, Call, Error, Executor, Outcome};
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
            let cfg = &call.action.config;
            if let Some(ms) = cfg.get("delay_ms").and_then(Value::as_u64) {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            match cfg.get("fail") {
                Some(Value::Bool(true)) => return Err(Error::Failed("mock failure".into())),
                Some(Value::String(msg)) => return Err(Error::Failed(msg.clone())),
                _ => {}
            }
            let output = match cfg.get("output") {
                Some(v) => {
                    let mut v = v.clone();
                    apply_rendered(&mut v, &call);
                    StepOutput::from_json(&v).map_err(|e| Error::BadOutput(e.to_string()))?
                }
                None => StepOutput::new(1.0, format!("mock step {} done", call.step_path)),
            };
            let usage = cfg.get("usage").map(|u| Usage {
                input_tokens: u.get("input_tokens").and_then(Value::as_u64).unwrap_or(0),
                output_tokens: u.get("output_tokens").and_then(Value::as_u64).unwrap_or(0),
                cost_usd: u.get("cost_usd").and_then(Value::as_f64),
            });
            Ok(Outcome {
                output,
                usage: usage.unwrap_or_default(),
            })
        })
    }
}
