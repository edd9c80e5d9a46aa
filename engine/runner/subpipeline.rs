//! `executor: pipeline`: a child run, awaited. The child's final status decides
//! the step (not an earlier child step's confidence). After a restart the parent
//! finds the child it already started, by (parent run, step path), and waits for
//! it instead of starting a second one. A step timeout cancels the child (it ends
//! `cancelled` at its next step boundary) rather than abandoning it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::unit::{CallFailure, ChildRuns};
use super::{Created, Error, ParentLink, RunEnd, Services};
use crate::domain::RunStatus;
use crate::executor::{Call, Outcome};
use crate::pipeline::ExecutorConfig;
use crate::run::context::Normalised;
use crate::run::{StepOutput, Usage};

/// What a sub-pipeline step works with: its unit's services and the child runs.
pub(super) struct Parent<'a> {
    pub services: &'a Arc<Services>,
    pub children: &'a Arc<dyn ChildRuns>,
    /// The parent run's trigger, which the child's starts from.
    pub trigger: &'a Normalised,
}

fn fail(msg: impl Into<String>) -> CallFailure {
    CallFailure::Error(msg.into())
}

/// A store failure seen by the step: left for the next start when shutdown cut the
/// wait short (the run stays `running` and is resumed), else the step's error.
fn store_failure(engine: &Services, e: impl std::fmt::Display) -> CallFailure {
    if engine.is_shutting_down() {
        CallFailure::Drained
    } else {
        fail(e.to_string())
    }
}

/// Creates the child run, waiting out a store that cannot write (as the driver's
/// own commits do): the failed batch wrote nothing, so trying again is safe.
async fn create_child(
    engine: &Parent<'_>,
    call: &Call<'_>,
    child: &crate::pipeline::Pipeline,
    trigger: &Normalised,
    link: ParentLink,
) -> Result<Created, CallFailure> {
    let mut delay = Duration::from_millis(100);
    loop {
        match engine.children.create(child, trigger, link.clone()).await {
            Ok(created) => return Ok(created),
            Err(Error::Store(e)) if e.is_retriable() && !engine.services.is_shutting_down() => {
                tracing::warn!(run_id = call.run_id, step = call.step_path, error = %e,
                    "The store cannot take the sub-pipeline's run; the step waits and tries again.");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(store_failure(engine.services, e)),
        }
    }
}

pub(super) async fn run(parent: Parent<'_>, call: &Call<'_>) -> Result<Outcome, CallFailure> {
    let engine = parent.services;
    let ExecutorConfig::Pipeline(cfg) = &call.action.config else {
        return Err(fail("executor_config.pipeline is missing"));
    };
    let name = cfg.pipeline.as_str();
    let child = parent
        .children
        .pipeline(name)
        .ok_or_else(|| fail(format!("Sub-pipeline '{name}' is not loaded")))?;
    let existing = super::persist::read(engine, call.run_id, || {
        engine.store.child_run(call.run_id, call.step_path)
    })
    .await
    .map_err(|e| store_failure(engine, e))?;
    let child_id = match existing {
        // Started before a restart: the sweep resumes (or interrupts) it on its own.
        Some(r) if r.status == RunStatus::Running => {
            bounded(call, &r.id, &parent, wait_for(engine, &r.id)).await?
        }
        Some(r) => r.id,
        None => {
            let mut trigger: Normalised = parent.trigger.clone();
            apply_context(&mut trigger, call);
            trigger.pipeline = Some(name.to_string());
            trigger.source = "sub-pipeline".into();
            trigger.fingerprint = None;
            let link = ParentLink {
                run_id: call.run_id.to_string(),
                step_path: call.step_path.to_string(),
            };
            let created = create_child(&parent, call, &child, &trigger, link).await?;
            let id = match created {
                Created::Inserted(id) | Created::Duplicate { run_id: id, .. } => id,
            };
            let handle = parent.children.clone().drive(id.clone());
            let driven = async {
                match handle.await {
                    Ok(Ok(RunEnd::Finished(_))) => Ok(id.clone()),
                    // A child never parks (its parent awaits this task); if it did, the
                    // parent would be left to the next start like a drained one.
                    Ok(Ok(RunEnd::Drained | RunEnd::Parked)) => Err(CallFailure::Drained),
                    Ok(Err(e)) => Err(fail(e.to_string())),
                    Err(e) => Err(fail(format!("sub-pipeline task ended abnormally: {e}"))),
                }
            };
            bounded(call, &id, &parent, driven).await?
        }
    };
    let run = super::persist::read(engine, call.run_id, || engine.store.run(&child_id))
        .await
        .map_err(|e| store_failure(engine, e))?
        .ok_or_else(|| fail("child run vanished"))?;
    let usage = Usage::default();
    match run.status {
        status if status.is_success() => {
            let mut output = run
                .final_output_json
                .as_deref()
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
                .and_then(|v| StepOutput::from_json(&v).ok())
                .unwrap_or_else(|| {
                    StepOutput::new(1.0, format!("Sub-pipeline '{name}' {}", run.status))
                });
            output
                .extra
                .insert("sub_run_id".into(), Value::from(child_id.clone()));
            output
                .extra
                .insert("sub_pipeline_status".into(), Value::from(run.status));
            Ok(Outcome { output, usage })
        }
        status => Err(fail(format!(
            "Sub-pipeline '{name}' (run {child_id}) ended {status}: {}",
            run.reason.unwrap_or_default()
        ))),
    }
}

/// Waits for `fut` within the step's timeout; on timeout the child is cancelled.
async fn bounded(
    call: &Call<'_>,
    child_id: &str,
    parent: &Parent<'_>,
    fut: impl std::future::Future<Output = Result<String, CallFailure>>,
) -> Result<String, CallFailure> {
    let Some(t) = call.timeout else {
        return fut.await;
    };
    match tokio::time::timeout(t, fut).await {
        Ok(r) => r,
        Err(_) => {
            parent.children.clone().cancel(child_id);
            Err(fail(format!(
                "Step timed out after {}s; sub-pipeline run {child_id} was cancelled",
                t.as_secs_f64()
            )))
        }
    }
}

/// Polls a child run driven elsewhere until it leaves `running`.
async fn wait_for(engine: &Arc<Services>, id: &str) -> Result<String, CallFailure> {
    loop {
        if engine.is_shutting_down() {
            return Err(CallFailure::Drained);
        }
        match engine.store.run(id) {
            Ok(Some(r)) if r.status != RunStatus::Running => return Ok(r.id),
            Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(None) => return Err(fail(format!("child run {id} vanished"))),
            // A store that cannot be read for a while is waited out, like the driver does.
            Err(e) if e.is_retriable() => tokio::time::sleep(Duration::from_millis(500)).await,
            Err(e) => return Err(fail(e.to_string())),
        }
    }
}

/// Applies `executor_config.context` to the child's trigger: `labels` and `metadata`
/// merge over the parent's, `summary`, `severity` and `team` replace, anything else
/// lands in `metadata`. String values were rendered against the parent step's context.
fn apply_context(trigger: &mut Normalised, call: &Call<'_>) {
    let ExecutorConfig::Pipeline(cfg) = &call.action.config else {
        return;
    };
    let ctx = &cfg.context;
    let text = |pointer: String, raw: &Value| -> Value {
        match call.rendered.get(&pointer) {
            Some(s) => Value::from(s.clone()),
            None => raw.clone(),
        }
    };
    for (key, raw) in ctx {
        match (key.as_str(), raw) {
            ("labels", Value::Object(m)) => {
                for (k, v) in m {
                    let v = text(format!("context/labels/{k}"), v);
                    let s = v
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string());
                    trigger.labels.insert(k.clone(), s);
                }
            }
            ("metadata", Value::Object(m)) => {
                for (k, v) in m {
                    trigger
                        .metadata
                        .insert(k.clone(), text(format!("context/metadata/{k}"), v));
                }
            }
            ("summary" | "severity" | "team", v) => {
                let v = text(format!("context/{key}"), v);
                let s = v.as_str().map(str::to_string);
                match key.as_str() {
                    "summary" => trigger.summary = s,
                    "severity" => trigger.severity = s,
                    _ => trigger.team = s,
                }
            }
            (_, v) => {
                trigger
                    .metadata
                    .insert(key.clone(), text(format!("context/{key}"), v));
            }
        }
    }
}
