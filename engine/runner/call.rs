//! One executor call: render the action's templates, dispatch by executor kind
//! (the runner's own kinds, `pipeline`, `human` and `notify`, or an executor of the
//! registry), bounded by the step's timeout. Used by plain steps and by branches.

use std::collections::BTreeMap;
use std::time::Duration;

use super::unit::{CallFailure, CallSpec};
use crate::executor::{Call, Outcome};
use crate::pipeline::{ExecutorKind, OnInterrupted};

/// Renders the action's templates and calls its executor once, within its timeout.
pub(super) async fn call_once(spec: CallSpec<'_>) -> Result<Outcome, CallFailure> {
    let templates = &spec.pipeline.templates;
    let ctx = spec.ctx;
    let prompt = templates
        .render(&spec.action.prompt, &ctx)
        .map_err(|e| CallFailure::Config(format!("template error: {e}")))?;
    let mut rendered = BTreeMap::new();
    for (pointer, t) in &spec.action.config_templates {
        let text = templates
            .render(t, &ctx)
            .map_err(|e| CallFailure::Config(format!("template error: {e}")))?;
        rendered.insert(pointer.clone(), text);
    }
    drop(ctx);
    let timeout = spec.action.timeout_seconds.map(Duration::from_secs_f64);
    let call = Call {
        run_id: spec.run_id,
        pipeline: &spec.pipeline.name,
        step_path: spec.path,
        idempotency_key: spec.key,
        attempt: spec.attempt,
        action: spec.action,
        prompt,
        rendered,
        timeout,
    };
    let fut = async {
        match spec.action.executor {
            // Boxed: inline, this rarely used future would size every running step
            // (and every run parked on a human approval) after itself.
            ExecutorKind::Pipeline => {
                let parent = super::subpipeline::Parent {
                    services: spec.services,
                    children: spec.children,
                    trigger: spec.facts.trigger,
                };
                Box::pin(super::subpipeline::run(parent, &call)).await
            }
            ExecutorKind::Human => {
                super::human::run(spec.services, &call, spec.human, spec.facts).await
            }
            // Tool-using agents run their loop here, journaled (see `agent`).
            ExecutorKind::Agent
                if !spec.services.executors.is_scripted()
                    && super::agent::runs_loop(&spec.services.config, &call) =>
            {
                let policy = spec
                    .pipeline
                    .durable
                    .as_ref()
                    .map_or(OnInterrupted::Rerun, |d| d.on_interrupted);
                Box::pin(super::agent::run(
                    spec.services,
                    &call,
                    spec.facts,
                    policy,
                    spec.human,
                ))
                .await
            }
            // Queued in the outbox, which delivers and retries it (see `outbox`).
            ExecutorKind::Notify => {
                super::outbox::queue_step(spec.services, &call, spec.pipeline.stage).await
            }
            kind => match spec.services.executors.get(kind) {
                Some(ex) => ex.execute(call.clone()).await.map_err(CallFailure::from),
                None => Err(CallFailure::Config(format!(
                    "executor `{}` is not available in this process",
                    spec.action.executor_name
                ))),
            },
        }
    };
    match timeout {
        // Human waits and sub-pipelines bound themselves (a deadline; a child run
        // that is cancelled on timeout); wrapping them would abandon them half-way.
        Some(t)
            if !matches!(
                spec.action.executor,
                ExecutorKind::Pipeline | ExecutorKind::Human
            ) =>
        {
            match tokio::time::timeout(t, fut).await {
                Ok(r) => r,
                Err(_) => Err(CallFailure::Error(format!(
                    "Step timed out after {}s",
                    t.as_secs_f64()
                ))),
            }
        }
        _ => fut.await,
    }
}
