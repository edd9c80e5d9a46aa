//! `vectorstep run`, `vectorstep runs list|show` and `vectorstep sweep --dry-run`.

use std::path::PathBuf;
use std::sync::Arc;

use std::io::IsTerminal;

use anyhow::Context;
use serde_json::Value;

use super::validate::{find_pipeline, load_pipelines};
use super::{load_config, Cli};
use vectorstep::clock::{rfc3339, Clock, SystemClock};
use vectorstep::config::Config;
use vectorstep::executor::Executors;
use vectorstep::runner::{sweep, Created, Engine, RunEnd};
use vectorstep::store::{RunFilter, Store};
use vectorstep::{intake, view};

pub struct RunArgs<'a> {
    pub pipeline: &'a str,
    pub payload: Option<&'a PathBuf>,
    pub source: &'a str,
    pub set: &'a [String],
    pub json: bool,
}

fn open_store(config: &Config) -> anyhow::Result<Store> {
    Store::open(&config.database_path).with_context(|| {
        format!(
            "cannot open the store at {}",
            config.database_path.display()
        )
    })
}

pub fn run(cli: &Cli, args: RunArgs<'_>) -> anyhow::Result<i32> {
    let config = Arc::new(super::load_acting_config(&cli.config)?);
    super::init_logging(&config, "warn");
    let (set, name) = find_pipeline(&config, args.pipeline)?;
    let mut payload: Value = match args.payload {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", p.display()))?
        }
        None => Value::Object(Default::default()),
    };
    if args.source == "generic" {
        if let Value::Object(m) = &mut payload {
            m.entry("pipeline")
                .or_insert_with(|| Value::from(name.clone()));
        }
    }
    let clock = SystemClock;
    let received_at = rfc3339(clock.now_ms());
    let mut trigger = intake::normalise(args.source, None, &payload, &received_at)
        .map_err(|e| anyhow::anyhow!("invalid payload: {e}"))?;
    trigger.pipeline = Some(name.clone());
    for kv in args.set {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--set expects key=value, got `{kv}`"))?;
        trigger.labels.insert(k.to_string(), v.to_string());
    }
    let store = open_store(&config)?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let pipeline = set.get(&name).cloned().ok_or_else(|| anyhow::anyhow!("pipeline `{name}` vanished"))?;
        let engine = Engine::new(config.clone(), set, store.clone(), Executors::standard(&config), Arc::new(SystemClock));
        let run_id = match engine.create_run(&pipeline, &trigger, &payload, None, None).await? {
            Created::Inserted(id) => id,
            Created::Duplicate { run_id: existing, .. } => {
                eprintln!("deduplicated: run {existing} of `{name}` with the same idempotency key is still running");
                return Ok(2);
            }
        };
        // On a terminal, a human step of this run is answered right here.
        let prompter = std::io::stdin()
            .is_terminal()
            .then(|| tokio::spawn(answer_on_terminal(engine.clone(), run_id.clone())));
        let end = engine.drive(&run_id, false).await?;
        if let Some(p) = prompter {
            p.abort();
        }
        let status = match end {
            RunEnd::Finished(s) => s,
            // `run` never enables parking, so Parked cannot come back here.
            RunEnd::Drained | RunEnd::Parked => "running".into(),
        };
        let run = store.run(&run_id)?.ok_or_else(|| anyhow::anyhow!("run {run_id} vanished"))?;
        let steps = store.steps(&run_id)?;
        if args.json {
            let events = store.events(&run_id)?;
            println!("{}", serde_json::to_string_pretty(&view::run_detail(&run, &steps, &events))?);
        } else {
            print!("{}", view::step_table(&steps));
            println!();
            println!("run {run_id} ({}) finished: {status}", run.pipeline_name);
            if let Some(reason) = run.reason.as_deref().filter(|_| status != "completed") {
                println!("reason: {reason}");
            }
            println!("tokens: {}  cost: ${:.4}", run.tokens_used, run.cost_usd);
        }
        Ok(if status == "completed" || status == "stopped" { 0 } else { 2 })
    })
}

pub fn list(
    cli: &Cli,
    status: Option<String>,
    pipeline: Option<String>,
    limit: u32,
    json: bool,
) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let store = open_store(&config)?;
    let runs = store.runs(&RunFilter {
        status,
        pipeline,
        limit,
        offset: 0,
    })?;
    if json {
        let list: Vec<Value> = runs.iter().map(view::run_summary).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"runs": list}))?
        );
        return Ok(0);
    }
    println!(
        "{:<36}  {:<28}  {:<11}  {:<24}  RESUMED",
        "RUN", "PIPELINE", "STATUS", "TRIGGERED"
    );
    for r in runs {
        println!(
            "{:<36}  {:<28}  {:<11}  {:<24}  {}",
            r.id,
            r.pipeline_name,
            r.status,
            rfc3339(r.triggered_at),
            r.resume_count
        );
    }
    Ok(0)
}

pub fn show(cli: &Cli, run_id: &str, json: bool) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let store = open_store(&config)?;
    let run = store
        .run(run_id)?
        .ok_or_else(|| anyhow::anyhow!("no run with id {run_id}"))?;
    let steps = store.steps(run_id)?;
    let events = store.events(run_id)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&view::run_detail(&run, &steps, &events))?
        );
        return Ok(0);
    }
    println!(
        "run {}  pipeline {}  status {}",
        run.id, run.pipeline_name, run.status
    );
    println!(
        "triggered {}  resumed {} time(s)  fingerprint {}",
        rfc3339(run.triggered_at),
        run.resume_count,
        run.config_fingerprint
    );
    if let Some(r) = &run.reason {
        println!("reason: {r}");
    }
    println!();
    print!("{}", view::step_table(&steps));
    println!();
    for e in events {
        println!(
            "{}  {:<5}  {:<28}  {}",
            rfc3339(e.ts),
            e.level,
            e.event,
            e.msg
        );
    }
    Ok(0)
}

pub fn sweep_dry_run(cli: &Cli) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let set = load_pipelines(&config, &[])?;
    let store = open_store(&config)?;
    let now = SystemClock.now_ms();
    let runs = store.runs_with_status("running")?;
    if runs.is_empty() {
        println!("no running runs");
    }
    for run in runs {
        match sweep::decide(&run, &set, &config, now) {
            sweep::Decision::Resume => {
                let Some(p) = set.get(&run.pipeline_name) else {
                    continue;
                };
                let plan = vectorstep::run::plan::plan(p, &store.steps(&run.id)?);
                println!(
                    "{}  {}  resume: {} step(s) and {} branch(es) kept; in flight: {}; on_interrupted={}",
                    run.id,
                    run.pipeline_name,
                    plan.steps_skipped,
                    plan.branches_skipped,
                    if plan.in_flight.is_empty() { "none".to_string() } else { plan.in_flight.join(", ") },
                    plan.on_interrupted.as_str(),
                );
            }
            sweep::Decision::Interrupt { event, message, .. } => {
                println!(
                    "{}  {}  interrupt ({event}): {message}",
                    run.id, run.pipeline_name
                );
            }
        }
    }
    Ok(0)
}

/// Asks on the terminal for every approval this run requests, until it ends.
async fn answer_on_terminal(engine: Arc<Engine>, run_id: String) {
    let mut asked = std::collections::HashSet::new();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let Ok(list) = engine.store.approvals_of_run(&run_id) else {
            continue;
        };
        for a in list.into_iter().filter(|a| a.status == "pending") {
            if !asked.insert(a.token.clone()) {
                continue;
            }
            eprintln!(
                "\napproval needed for {} ({}):\n{}\napprove? [y/N] ",
                a.step_path,
                a.pipeline_name,
                a.message.trim_end()
            );
            let line = tokio::task::spawn_blocking(|| {
                let mut s = String::new();
                std::io::stdin().read_line(&mut s).map(|_| s)
            })
            .await;
            let approve = matches!(line, Ok(Ok(ref s)) if matches!(s.trim(), "y" | "Y" | "yes"));
            let by = std::env::var("USER").unwrap_or_else(|_| "terminal".into());
            if let Err(e) = engine.decide_approval(&a.token, approve, &by).await {
                eprintln!("could not record the decision: {e}");
            }
        }
    }
}
