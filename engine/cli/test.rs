//! `vectorstep test NAME|FILE [--fixtures DIR]`: runs a pipeline once per fixture
//! case with every executor scripted (`executor::scripted`), in a store in a temp
//! folder that is removed afterwards, and compares each run with the case's
//! expectations (`fixture::compare`). Nothing is sent: no network, no shell, no
//! model, no notification, no approval message. Exit 0 when every case passes,
//! 1 otherwise (a failed case, or fixtures that cannot be read).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use super::validate::find_pipeline;
use super::Cli;
use vectorstep::clock::{rfc3339, Clock, SystemClock};
use vectorstep::domain::{ApprovalStatus, RunStatus};
use vectorstep::executor::scripted::Scripted;
use vectorstep::executor::Executors;
use vectorstep::fixture::{self, Case, Observed};
use vectorstep::pipeline::{Pipeline, PipelineSet};
use vectorstep::runner::{Created, Decider, DriveMode, Engine, RunEnd};

/// Who decides a case's approvals, in the run log.
const DECIDER: &str = "vectorstep-test";

pub fn test(cli: &Cli, pipeline: &str, fixtures: Option<&PathBuf>) -> anyhow::Result<i32> {
    let config = super::load_config(&cli.config)?;
    super::init_logging(&config, "error");
    let (set, name) = find_pipeline(&config, pipeline)?;
    let p = set
        .get(&name)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("pipeline `{name}` vanished"))?;
    let dir = fixtures.cloned().unwrap_or_else(|| default_fixtures(&p));
    let cases = match fixture::load_dir(&dir) {
        Ok(c) => c,
        Err(d) => {
            eprint!("{d}");
            anyhow::bail!(
                "{} error(s) in the fixtures of `{name}`; no case was run",
                d.error_count()
            );
        }
    };
    let total = cases.len();
    println!("{name}: {total} case(s) from {}", dir.display());
    let rt = tokio::runtime::Runtime::new()?;
    let mut failed = 0;
    for case in cases {
        let case = Arc::new(case);
        let started = Instant::now();
        let result = rt.block_on(run_case(&config, &set, &p, case.clone()));
        let took = started.elapsed().as_secs_f64();
        match result {
            Ok((status, diff)) if diff.is_empty() => {
                println!(
                    "  ok    {} ({status} in {took:.2} s){}",
                    case.name(),
                    about(&case)
                );
            }
            Ok((status, diff)) => {
                failed += 1;
                println!(
                    "  FAIL  {} ({status} in {took:.2} s){}",
                    case.name(),
                    about(&case)
                );
                for line in diff {
                    println!("          {line}");
                }
            }
            Err(e) => {
                failed += 1;
                println!("  FAIL  {}{}", case.name(), about(&case));
                println!("          {e:#}");
            }
        }
    }
    println!(
        "{total} case(s): {} passed, {failed} failed",
        total.saturating_sub(failed)
    );
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(if failed == 0 { 0 } else { 1 })
}

fn about(case: &Case) -> String {
    case.description
        .as_deref()
        .map(|d| format!(": {d}"))
        .unwrap_or_default()
}

/// `fixtures/<name>/` in the folder of the pipeline's file.
fn default_fixtures(p: &Pipeline) -> PathBuf {
    p.file
        .parent()
        .unwrap_or(Path::new("."))
        .join("fixtures")
        .join(&p.name)
}

/// One case in a store of its own: the run's final status and what differs
/// from the expectations.
async fn run_case(
    config: &vectorstep::config::Config,
    set: &PipelineSet,
    p: &Arc<Pipeline>,
    case: Arc<Case>,
) -> anyhow::Result<(RunStatus, Vec<String>)> {
    let scratch = Scratch::new()?;
    let mut config = config.clone();
    config.database_path = scratch.0.join("test.db");
    config.database_url = None;
    let config = Arc::new(config);
    let store = config
        .open_store()
        .with_context(|| format!("cannot open a scratch store in {}", scratch.0.display()))?;
    let scripted = Arc::new(Scripted::new(case.clone()));
    let engine = Engine::new(
        config.clone(),
        set.clone(),
        store.clone(),
        Executors::scripted(scripted.clone()),
        Arc::new(SystemClock),
    );
    let (trigger, payload) = trigger_of(&case, &p.name)?;
    let run_id = match engine.create_run(p, &trigger, &payload, None, None).await? {
        Created::Inserted(id) => id,
        Created::Duplicate { run_id, .. } => {
            anyhow::bail!("the scratch store already ran {run_id}")
        }
    };
    let mut decider = tokio::spawn(decide_approvals(engine.clone(), case.clone()));
    let limit = Duration::from_secs_f64(case.timeout_seconds.max(0.1));
    let drive = tokio::time::timeout(limit, engine.drive(&run_id, DriveMode::New));
    tokio::pin!(drive);
    let mut diff = Vec::new();
    let end = tokio::select! {
        end = &mut drive => Some(end),
        asked = &mut decider => {
            if let Ok(Some(step)) = asked {
                diff.push(format!(
                    "step `{step}` asks a human and the case has no decision; add `answers: {{{step}: {{decision: approve}}}}`"
                ));
            }
            None
        }
    };
    decider.abort();
    match end {
        Some(Ok(Ok(RunEnd::Finished(_)))) => {}
        Some(Ok(Ok(other))) => diff.push(format!("the run did not finish: {other:?}")),
        Some(Ok(Err(e))) => diff.push(format!("the run could not be driven: {e}")),
        Some(Err(_)) => {
            diff.push(format!(
                "the run did not finish within {} s (timeout_seconds)",
                case.timeout_seconds
            ));
            engine.cancel(&run_id);
        }
        None => {
            // Stopped at its human step: cancelled, so the store says how it ended.
            engine.cancel(&run_id);
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut drive).await;
        }
    }
    let run = store
        .run(&run_id)?
        .ok_or_else(|| anyhow::anyhow!("run {run_id} vanished from the scratch store"))?;
    let seen = Observed::from_rows(
        run.status,
        &store.steps(&run_id)?,
        &store.approvals_of_run(&run_id)?,
        &store.notifications_of_run(&run_id)?,
        scripted.prompts(),
    );
    diff.extend(fixture::compare(&case.expect, &seen));
    engine.begin_shutdown();
    Ok((run.status, diff))
}

/// The case's trigger, normalised as `vectorstep run` does with its payload.
fn trigger_of(
    case: &Case,
    pipeline: &str,
) -> anyhow::Result<(vectorstep::run::context::Normalised, Value)> {
    let mut payload = case.payload.clone();
    if case.source == "generic" {
        if let Value::Object(m) = &mut payload {
            m.entry("pipeline").or_insert_with(|| Value::from(pipeline));
        }
    }
    let received_at = rfc3339(SystemClock.now_ms());
    let mut trigger = vectorstep::intake::normalise(&case.source, None, &payload, &received_at)
        .map_err(|e| anyhow::anyhow!("{}: invalid payload: {e}", case.file.display()))?;
    trigger.pipeline = Some(pipeline.to_string());
    for (k, v) in &case.labels {
        trigger.labels.insert(k.clone(), v.clone());
    }
    Ok((trigger, payload))
}

/// Decides every pending approval of the scratch store with the case's
/// decision for its step. Ends with the step that asked and has none.
async fn decide_approvals(engine: Arc<Engine>, case: Arc<Case>) -> Option<String> {
    let decider = Decider {
        by: DECIDER.to_string(),
        via: Some("test"),
        client: None,
    };
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let Ok(pending) = engine.store.approvals_with_status(ApprovalStatus::Pending) else {
            continue;
        };
        for a in pending {
            match case.answer(&a.step_path).and_then(|x| x.decision) {
                Some(approve) => {
                    let _ = engine.decide_approval_by(&a.token, approve, &decider).await;
                }
                None => return Some(a.step_path),
            }
        }
    }
}

/// A folder of its own under the system's temp folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("vectorstep-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
