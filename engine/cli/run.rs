//! `vectorstep run`, `vectorstep runs list|show` and `vectorstep sweep --dry-run`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use std::io::IsTerminal;

use anyhow::Context;
use serde_json::Value;

use super::validate::{find_pipeline, load_pipelines};
use super::{load_config, Cli};
use vectorstep::clock::{rfc3339, Clock, SystemClock};

use vectorstep::domain::{ApprovalStatus, RunStatus, StepStatus};
use vectorstep::events::Event;
use vectorstep::executor::Executors;
use vectorstep::runner::{sweep, Created, Engine, RunEnd};
use vectorstep::store::lock::OwnerLock;
use vectorstep::store::{RunFilter, Write};
use vectorstep::{intake, view};

pub struct RunArgs<'a> {
    pub pipeline: &'a str,
    pub payload: Option<&'a PathBuf>,
    pub source: &'a str,
    pub set: &'a [String],
    pub json: bool,
}

pub fn run(cli: &Cli, args: RunArgs<'_>) -> anyhow::Result<i32> {
    let config = Arc::new(super::load_acting_config(&cli.config)?);
    super::init_logging(&config, "warn");
    let (set, name) = find_pipeline(&config, args.pipeline)?;
    let mut payload: Value = match args.payload {
        Some(p) if p.as_os_str() == "-" => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .context("cannot read the payload from standard input")?;
            serde_json::from_str(&text)
                .context("the payload on standard input is not valid JSON")?
        }
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
        // The parser checked the shape (`cli::key_value`).
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--set expects key=value, got `{kv}`"))?;
        trigger.labels.insert(k.to_string(), v.to_string());
    }
    // On SQLite: taken before the run exists, so `serve` never sees it without a
    // live owner; held until this process has finished with it (see `store::lock`).
    // On PostgreSQL this process is a short-lived replica instead, and leases its
    // run like any other (docs/replicas.md).
    let owner_lock = match &config.database_url {
        None => Some(
            OwnerLock::acquire(&config.database_path)
                .context("cannot take the lock that marks this process as the owner of its run")?,
        ),
        Some(_) => None,
    };
    let rt = tokio::runtime::Runtime::new()?;
    if let Some(p) = set.get(&name) {
        rt.block_on(someone_can_answer(cli, p))?;
    }
    let store = super::open_store(&config)?;
    let owner = owner_lock.as_ref().map(|l| l.owner().to_string());
    let result = rt.block_on(async move {
        let pipeline = set.get(&name).cloned().ok_or_else(|| anyhow::anyhow!("pipeline `{name}` vanished"))?;
        let engine = Engine::new(config.clone(), set, store.clone(), Executors::standard(&config), Arc::new(SystemClock));
        if let Some(owner) = &owner {
            engine.set_owner(owner);
        }
        let heartbeat = if engine.store.is_shared() { Some(register_replica(&engine).await?) } else { None };
        // Human steps send through Telegram and its messages show decisions.
        vectorstep::telegram::attach(&engine);
        // Installed before the run starts: from here on SIGINT and SIGTERM cancel it.
        let signals = Signals::install()?;
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
        let grace = Duration::from_secs(config.durability.shutdown_grace_seconds);
        let cancels = tokio::spawn(watch_cancel_requests(engine.clone(), run_id.clone()));
        let end = drive_until_signal(&engine, &run_id, signals, grace).await?;
        cancels.abort();
        if let Some(p) = prompter {
            p.abort();
        }
        engine.mcp.shutdown().await;
        if let Some(h) = heartbeat {
            // Its heartbeat ends with shutdown and records that this replica stopped.
            engine.begin_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
        }
        let status = match end {
            RunEnd::Finished(s) => s,
            // `run` never enables parking, so Parked cannot come back here.
            RunEnd::Drained | RunEnd::Parked => RunStatus::Running,
        };
        let run = store.run(&run_id)?.ok_or_else(|| anyhow::anyhow!("run {run_id} vanished"))?;
        let steps = store.steps(&run_id)?;
        if args.json {
            let events = store.events(&run_id)?;
            let journals = store.journals_of_run(&run_id)?;
            println!("{}", serde_json::to_string_pretty(&view::run_detail(&run, &steps, &events, &journals))?);
        } else {
            print!("{}", view::step_table(&steps));
            // Agent steps: what each turn asked for and how it went.
            let journals = store.journals_of_run(&run_id)?;
            if !journals.is_empty() {
                let detail = view::run_detail(&run, &steps, &[], &journals);
                print!("{}", view::agent_turn_tables(&detail));
            }
            println!();
            println!("run {run_id} ({}) finished: {status}", run.pipeline_name);
            if let Some(reason) = run.reason.as_deref().filter(|_| status != RunStatus::Completed) {
                println!("reason: {reason}");
            }
            println!("tokens: {}  cost: ${:.4}", run.tokens_used, run.cost_usd);
        }
        Ok(if status.is_success() { 0 } else { 2 })
    });
    // Tasks an abandoned run left behind stop here, and the store's writer drains;
    // a terminal prompt still reading stdin does not hold the exit back.
    rt.shutdown_timeout(Duration::from_secs(1));
    // Only now: a run still `running` at this point (its driver failed) is left to
    // `serve`, which adopts runs whose owner's lock is free.
    drop(owner_lock);
    result
}

/// Makes this process a replica of the shared store for its run: an id of its
/// own, leases for the runs it creates, its liveness lock, registration and
/// heartbeat. If it dies, `serve` replicas take its run over.
async fn register_replica(engine: &Arc<Engine>) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use vectorstep::runner::replica;
    use vectorstep::store::ReplicaKind;
    let id = replica::new_id();
    let lease_ms = engine.config.replica.lease_seconds.saturating_mul(1000);
    engine.lease_runs_as(Arc::new(vectorstep::runner::leases::LeaseBook::new(
        &id, lease_ms,
    )));
    let liveness = replica::register(engine, &id, ReplicaKind::Run).await?;
    anyhow::ensure!(
        liveness.is_held(),
        "cannot take this process's liveness lock on {}: a `vectorstep store copy` may be using the database; wait for it to finish",
        engine.store.name()
    );
    Ok(tokio::spawn(replica::heartbeat(
        engine.clone(),
        id,
        ReplicaKind::Run,
        liveness,
        engine.shutdown_signal(),
    )))
}

/// SIGINT (Ctrl-C) and SIGTERM.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            terminate: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
        })
    }

    /// The name of the next signal received.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

/// `POST /runs/{id}/cancel` on a running `serve` cannot reach this process's
/// memory, so `serve` stores the request (`runner::cancel_request_key`); this task
/// reads it every second for the run and its sub-pipeline runs and cancels them
/// here, at their next step boundary.
async fn watch_cancel_requests(engine: Arc<Engine>, run_id: String) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let mut ids = vec![run_id.clone()];
        if let (Ok(owned), Some(me)) = (engine.store.owned_running_runs(), engine.owner()) {
            ids.extend(
                owned
                    .into_iter()
                    .filter(|(_, o)| *o == me)
                    .map(|(id, _)| id),
            );
        }
        ids.dedup();
        for id in ids {
            if engine.is_cancelled(&id) {
                continue;
            }
            if let Ok(Some(by)) = engine
                .store
                .kv(&vectorstep::runner::cancel_request_key(&id))
            {
                let by = Some(by).filter(|b| !b.is_empty());
                eprintln!("cancel requested through the server for run {id}: stopping at the next step boundary");
                engine.cancel_by(&id, by.as_deref());
            }
        }
    }
}

/// Drives the run; a signal cancels it. The first signal asks the run (and the
/// sub-pipeline runs it started) to stop at the next step boundary, letting the step
/// in flight finish for up to `grace`; when that runs out, or on a second signal, the
/// driver is abandoned and the runs are recorded `cancelled` as they stand. Either
/// way the run ends `cancelled` with `run_cancelled`, so no later `serve` resumes it.
async fn drive_until_signal(
    engine: &Arc<Engine>,
    run_id: &str,
    mut signals: Signals,
    grace: Duration,
) -> anyhow::Result<RunEnd> {
    let drive = engine.drive(run_id, vectorstep::runner::DriveMode::New);
    tokio::pin!(drive);
    let first = tokio::select! {
        end = &mut drive => return Ok(end?),
        sig = signals.next() => sig,
    };
    eprintln!(
        "{first}: cancelling run {run_id} at the next step boundary; a step in flight has up to {}s to finish (send the signal again to stop at once)",
        grace.as_secs()
    );
    let owned = owned_running(engine)?;
    for id in &owned {
        engine.cancel(id);
    }
    let forced = tokio::select! {
        end = &mut drive => return Ok(end?),
        _ = tokio::time::sleep(grace) => format!("grace of {}s over", grace.as_secs()),
        sig = signals.next() => format!("second {sig}"),
    };
    eprintln!("{forced}: stopping now; the steps in flight are recorded failed");
    let now = engine.now_ms();
    let mut writes = Vec::new();
    // Every run of this process still running: the run and its sub-pipeline runs.
    for id in owned_running(engine)? {
        writes.extend(cancel_as_it_stands(engine, &id, first, now)?);
    }
    engine.store.commit(writes).await?;
    let status = engine
        .store
        .run(run_id)?
        .map(|r| r.status)
        .unwrap_or(RunStatus::Cancelled);
    Ok(RunEnd::Finished(status))
}

/// The running runs this process owns.
fn owned_running(engine: &Engine) -> anyhow::Result<Vec<String>> {
    let owner = engine.owner().unwrap_or_default();
    Ok(engine
        .store
        .owned_running_runs()?
        .into_iter()
        .filter(|(_, o)| o == owner)
        .map(|(id, _)| id)
        .collect())
}

/// The writes that end a run whose driver was abandoned: every step still
/// `running` is recorded `failed` (its effect is unknown), then `run_cancelled`,
/// `run_finished` and the `cancelled` status, as the driver's own cancellation does.
fn cancel_as_it_stands(
    engine: &Engine,
    run_id: &str,
    signal: &str,
    now: i64,
) -> anyhow::Result<Vec<Write>> {
    let mut writes = Vec::new();
    let mut in_flight = Vec::new();
    for mut step in engine.store.steps(run_id)? {
        if step.status != StepStatus::Running {
            continue;
        }
        in_flight.push(step.step_path.clone());
        step.status = StepStatus::Failed;
        step.finished_at = Some(now);
        step.duration_ms = u64::try_from(now - step.started_at).ok();
        step.error = Some(format!(
            "the process was stopped by {signal} while this step was in flight; its effect is unknown"
        ));
        writes.push(Write::UpsertStep(step));
    }
    let reason = format!("cancelled by {signal}");
    writes.push(
        Event::RunCancelledBySignal {
            signal: signal.to_string(),
            in_flight: in_flight.clone(),
        }
        .write(
            run_id,
            now,
            format!("Run cancelled by {signal}; in flight: {in_flight:?}"),
        ),
    );
    writes.push(
        Event::RunFinished {
            status: RunStatus::Cancelled,
            terminal_step: in_flight.first().cloned(),
            reason: Some(reason.clone()),
        }
        .write(
            run_id,
            now,
            format!("Pipeline finished: {}", RunStatus::Cancelled),
        ),
    );
    writes.push(Write::FinishRun {
        run_id: run_id.to_string(),
        status: RunStatus::Cancelled,
        completed_at: now,
        terminal_step: in_flight.first().cloned(),
        reason: Some(reason),
        final_output_json: None,
    });
    writes.push(Write::CloseApprovalsOfRun {
        run_id: run_id.to_string(),
        at: now,
    });
    Ok(writes)
}

pub fn list(
    cli: &Cli,
    status: Option<String>,
    pipeline: Option<String>,
    limit: u32,
    json: bool,
) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let store = super::open_store(&config)?;
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

/// A run whose pipeline asks a human needs someone to answer: this terminal, or
/// a running server (its approval page, `vectorstep approvals`, Telegram). With
/// neither, the run would wait out the step's timeout behind a link nobody can
/// open, so it is refused before it starts.
async fn someone_can_answer(cli: &Cli, p: &vectorstep::pipeline::Pipeline) -> anyhow::Result<()> {
    if !p.steps.iter().any(|e| e.asks_human()) || std::io::stdin().is_terminal() {
        return Ok(());
    }
    let base = super::approvals::base_url(cli, std::env::var("VECTORSTEP_URL").ok().as_deref())?;
    let reachable = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?
        .get(format!("{base}/healthz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success());
    if reachable {
        return Ok(());
    }
    anyhow::bail!(
        "pipeline `{}` has a human step, standard input is not a terminal, and no server answers at {base} to decide it; \
         run it from a terminal to answer on the prompt, or start `vectorstep serve` on the same store first \
         (its approval page and `vectorstep approvals approve` decide it; VECTORSTEP_URL points elsewhere)",
        p.name
    )
}

pub fn show(cli: &Cli, run_id: &str, json: bool, verbose: bool) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let store = super::open_store(&config)?;
    let run = store
        .run(run_id)?
        .ok_or_else(|| anyhow::anyhow!("no run with id {run_id}"))?;
    let steps = store.steps(run_id)?;
    let events = store.events(run_id)?;
    let journals = store.journals_of_run(run_id)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&view::run_detail(&run, &steps, &events, &journals))?
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
    if let Some(old) = &run.replay_of {
        println!("replay of run {old}");
    }
    if let Some(r) = &run.reason {
        println!("reason: {r}");
    }
    println!();
    print!("{}", view::step_table(&steps));
    if verbose {
        println!();
        print!("{}", view::step_details(&steps));
    }
    if !journals.is_empty() {
        let detail = view::run_detail(&run, &steps, &[], &journals);
        print!("{}", view::agent_turn_tables(&detail));
    }
    println!();
    for e in events {
        // Messages quote payloads, tool arguments and model output.
        println!(
            "{}  {:<5}  {:<28}  {}",
            rfc3339(e.ts),
            e.level,
            e.event,
            view::terminal_safe(&e.msg)
        );
    }
    Ok(0)
}

pub fn sweep_dry_run(cli: &Cli) -> anyhow::Result<i32> {
    let config = load_config(&cli.config)?;
    let set = load_pipelines(&config, &[])?;
    let store = super::open_store(&config)?;
    let now = SystemClock.now_ms();
    let runs = store.running_runs_with_owners()?;
    if runs.is_empty() {
        println!("no running runs");
    }
    for (run, owner) in runs {
        // What `serve` would do with a run of `vectorstep run` depends on whether
        // that process still lives; probing its lock changes nothing.
        let adopt = match sweep::ownership(&config.database_path, owner.as_deref()) {
            sweep::Ownership::Serve => "",
            sweep::Ownership::DeadCli => "adopt (its `vectorstep run` process died), ",
            sweep::Ownership::LiveCli { pid, lock } => {
                let pid = pid.map_or_else(|| "unknown".to_string(), |p| p.to_string());
                println!(
                    "{}  {}  left alone: owned by a live `vectorstep run` (pid {pid}, lock {})",
                    run.id,
                    run.pipeline_name,
                    lock.display()
                );
                continue;
            }
        };
        match sweep::decide(&run, &set, &config, now) {
            sweep::Decision::Resume => {
                let Some(p) = set.get(&run.pipeline_name) else {
                    continue;
                };
                let plan = vectorstep::run::plan::plan(p, &store.steps(&run.id)?);
                println!(
                    "{}  {}  {adopt}resume: {} step(s) and {} branch(es) kept; in flight: {}; on_interrupted={}",
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
                    "{}  {}  {adopt}interrupt ({}): {message}",
                    run.id,
                    run.pipeline_name,
                    event.name()
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
        for a in list
            .into_iter()
            .filter(|a| a.status == ApprovalStatus::Pending)
        {
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
            let decider = vectorstep::runner::Decider {
                by,
                via: Some("terminal"),
                client: None,
            };
            if let Err(e) = engine.decide_approval_by(&a.token, approve, &decider).await {
                eprintln!("could not record the decision: {e}");
            }
        }
    }
}
