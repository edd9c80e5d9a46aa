//! `scripted`: the executor `vectorstep test` puts in place of every kind. Each
//! step answers from its fixture ([`crate::fixture::Case`]), and the rendered
//! prompt of every call is kept for the case's `prompts_contain`. A `mock` step
//! without an answer runs as written (it has no effects); any other step without
//! one fails with what to add to the fixture, so nothing reaches a network, a
//! shell or a model.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{BoxFuture, Call, Error, Executor, Outcome};
use crate::fixture::Case;
use crate::pipeline::ExecutorKind;
use crate::run::StepOutput;

pub struct Scripted {
    case: Arc<Case>,
    prompts: Mutex<BTreeMap<String, String>>,
}

impl Scripted {
    pub fn new(case: Arc<Case>) -> Scripted {
        Scripted {
            case,
            prompts: Mutex::new(BTreeMap::new()),
        }
    }

    /// The rendered prompt of every step called so far, by step path.
    pub fn prompts(&self) -> BTreeMap<String, String> {
        match self.prompts.lock() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl Executor for Scripted {
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(async move {
            if let Ok(mut p) = self.prompts.lock() {
                p.insert(call.step_path.to_string(), call.prompt.clone());
            }
            let Some(answer) = self.case.answer(call.step_path) else {
                if call.action.executor == ExecutorKind::Mock {
                    return super::mock::Mock.execute(call).await;
                }
                return Err(Error::Config(format!(
                    "{} has no answer for step `{}` ({} executor); add `answers: {{{}: {{output: {{confidence: 0.9, summary: \"...\"}}}}}}`",
                    self.case.name(),
                    call.step_path,
                    call.action.executor_name,
                    call.step_path
                )));
            };
            if let Some(ms) = answer.delay_ms {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if let Some(msg) = &answer.fail {
                return Err(Error::Failed(msg.clone()));
            }
            let output = match &answer.output {
                Some(v) => StepOutput::from_json(v).map_err(|e| Error::BadOutput(e.to_string()))?,
                None => StepOutput::new(1.0, format!("scripted step {} done", call.step_path)),
            };
            Ok(Outcome {
                output,
                usage: answer.usage.unwrap_or_default(),
            })
        })
    }
}
