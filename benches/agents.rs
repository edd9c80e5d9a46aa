//! The engine's cost per agent turn, next to the cost of one fsync'd commit
//! measured in the same process, and the memory of runs parked on tool approvals.
//!
//! Run: `cargo bench --bench agents`. A fake OpenAI-compatible model and the
//! declared webhook tool are one axum server on 127.0.0.1 answering at once, so
//! what is measured is the engine: the agent loop, its journal commits (two per
//! turn with one tool call), the model and tool HTTP round trips over loopback.
//! Targets:
//! - one run: time per turn (one model call, one tool call) at most 2.5x one
//!   durable commit of the store;
//! - 50 concurrent runs: turns per second at least 2x the store's commit rate in
//!   sequence (concurrent runs share fsyncs through the group-commit writer);
//! - 1,000 runs parked on tool-call approvals (parking on, as `serve` has it):
//!   resident memory under 100 MB, and the engine counts all 1,000 as parked.
//!
//! The first two are measured in 3 rounds, each with the store's commit timed
//! right before and after it (the disk of a shared machine changes speed from
//! minute to minute); the median ratio decides. `BENCH_PARK_WAVE=N` starts the
//! parked runs N at a time instead of all at once. See docs/performance.md.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Json;
use serde_json::{json, Value};
use vectorstep::clock::SystemClock;
use vectorstep::config::Config;
use vectorstep::events::Event;
use vectorstep::executor::Executors;
use vectorstep::run::context::Normalised;
use vectorstep::runner::{Created, DriveMode, Engine, RunEnd};
use vectorstep::store::Store;

/// Tool-calling turns of the single run (plus its final answer turn).
const LONG_CALLS: usize = 40;
/// Concurrent runs and the tool-calling turns of each.
const CONCURRENT: usize = 50;
const SHORT_CALLS: usize = 20;
const PARKED: usize = 1_000;
/// Commits per baseline measurement.
const BASELINE_COMMITS: u32 = 200;

/// The fake model: it calls the first tool it is offered until the conversation
/// holds as many tool results as the prompt's `calls=N` asks for, then answers.
async fn chat(Json(body): Json<Value>) -> Json<Value> {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let results = messages.iter().filter(|m| m["role"] == "tool").count();
    let wanted = messages
        .iter()
        .filter_map(|m| m["content"].as_str())
        .find_map(|c| {
            let rest = &c[c.find("calls=")? + "calls=".len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<usize>().ok()
        })
        .unwrap_or(0);
    let tool = body["tools"][0]["function"]["name"].as_str();
    let message = match tool {
        Some(tool) if results < wanted => json!({
            "role": "assistant", "content": null,
            "tool_calls": [{"id": format!("call_{results}"), "type": "function",
                "function": {"name": tool, "arguments": "{\"service\": \"api\"}"}}]}),
        _ => {
            let answer = json!({"confidence": 0.9, "summary": "done", "next_step_context": ""});
            json!({"role": "assistant", "content": answer.to_string()})
        }
    };
    Json(json!({
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 10}
    }))
}

/// Starts the fake model (`/v1/chat/completions`) and the tool (`/tool`).
async fn peer() -> String {
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/tool", post(|| async { "deployment api restarted" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn config_yaml(url: &str) -> String {
    let params =
        "parameters: {type: object, properties: {service: {type: string}}, required: [service]}";
    format!(
        "pipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\ndatabase: {{path: ./agents.db}}\n\
         providers:\n  fake: {{base_url: \"{url}/v1\"}}\n\
         agents:\n\
         \x20 worker: {{provider: fake, model: m, system_prompt: \"You fix things.\", tools: [restart_service], max_turns: 60}}\n\
         \x20 gated: {{provider: fake, model: m, system_prompt: \"You fix things.\", tools: [guarded_restart], approval_timeout_seconds: 86400}}\n\
         tools:\n\
         \x20 restart_service:\n    description: Restart one deployment\n    {params}\n    webhook: {{url: \"{url}/tool\"}}\n\
         \x20 guarded_restart:\n    description: Restart one deployment\n    {params}\n    webhook: {{url: \"{url}/tool\"}}\n    approval: required\n"
    )
}

fn pipeline_yaml(name: &str, agent: &str, calls: usize) -> String {
    format!(
        "name: {name}\nstage: production\ntrigger: {{}}\ndurable: true\nsteps:\n\
         \x20 - name: triage\n    executor: agent\n    executor_config: {{agent: {agent}}}\n\
         \x20   prompt_template: \"Investigate the alert. calls={calls}\"\n"
    )
}

async fn create(engine: &Arc<Engine>, name: &str) -> String {
    let p = engine.pipeline(name).expect("pipeline loaded");
    let trigger = Normalised {
        source: "bench".into(),
        pipeline: Some(name.into()),
        ..Default::default()
    };
    match engine
        .create_run(&p, &trigger, &json!({}), None, None)
        .await
    {
        Ok(Created::Inserted(id)) => id,
        other => panic!("run not created: {other:?}"),
    }
}

async fn run_one(engine: &Arc<Engine>, name: &str) {
    let id = create(engine, name).await;
    match engine.drive(&id, DriveMode::New).await {
        Ok(RunEnd::Finished(s)) => assert_eq!(s.to_string(), "completed", "run {id}"),
        other => panic!("run did not finish: {other:?}"),
    }
}

/// The unit of the targets: one durable commit of a small batch through a store
/// like the engine's (its own file in the same folder, opened once and kept, so
/// its WAL ages like the engine's), one commit after another.
struct Baseline {
    store: Store,
    written: u32,
}

impl Baseline {
    async fn open(dir: &std::path::Path) -> Baseline {
        let store = Store::open(&dir.join("baseline.db")).expect("baseline store");
        let mut b = Baseline { store, written: 0 };
        b.cost(50).await;
        b
    }

    /// Mean cost of `n` commits in sequence, each durable when `commit` returns.
    async fn cost(&mut self, n: u32) -> Duration {
        let t = Instant::now();
        for _ in 0..n {
            self.written += 1;
            let ev = Event::FanOutEmpty { step: "x".into() }.write(
                "baseline",
                0,
                format!("commit {}", self.written),
            );
            self.store.commit(vec![ev]).await.expect("commit");
        }
        t.elapsed() / n
    }

    /// Measures around `f`: half the commits before it, half after, so a change of
    /// the disk's speed during the measurement shows in both.
    async fn around<T>(&mut self, f: impl std::future::Future<Output = T>) -> (Duration, T) {
        let before = self.cost(BASELINE_COMMITS / 2).await;
        let out = f.await;
        let after = self.cost(BASELINE_COMMITS / 2).await;
        let commit = (before + after) / 2;
        println!(
            "  baseline: one durable store commit {:.3} ms ({:.3} before, {:.3} after; {:.0} commits/s in sequence)",
            ms(commit),
            ms(before),
            ms(after),
            1.0 / commit.as_secs_f64()
        );
        (commit, out)
    }
}

/// Round trips to the fake peer from a plain reqwest client, the same HTTP stack
/// the engine uses: a model request with the conversation of a mid-run turn
/// (`LONG_CALLS / 2` tool calls and results), and a tool call. They show how much
/// of a turn is loopback HTTP rather than the engine.
async fn http_round_trips(url: &str) -> (Duration, Duration) {
    let client = reqwest::Client::new();
    let mut messages = vec![
        json!({"role": "system", "content": "You fix things."}),
        json!({"role": "user", "content": format!("Investigate the alert. calls={LONG_CALLS}")}),
    ];
    for i in 0..LONG_CALLS / 2 {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{i}"),
            "type": "function", "function": {"name": "restart_service", "arguments": "{\"service\": \"api\"}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": "deployment api restarted"}));
    }
    let body = json!({"model": "m", "messages": messages, "tools": [{"type": "function", "function": {
        "name": "restart_service", "description": "Restart one deployment",
        "parameters": {"type": "object", "properties": {"service": {"type": "string"}}, "required": ["service"]}}}]});
    let n = 200u32;
    let mut model = Duration::ZERO;
    let mut tool = Duration::ZERO;
    for i in 0..n + 20 {
        let t = Instant::now();
        let r = client
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .expect("model request");
        let v: Value = r.json().await.expect("model answer");
        assert!(v["choices"][0]["message"].is_object());
        let m = t.elapsed();
        let t = Instant::now();
        let r = client
            .post(format!("{url}/tool"))
            .json(&json!({"service": "api"}))
            .send()
            .await
            .expect("tool request");
        r.text().await.expect("tool answer");
        if i >= 20 {
            model += m;
            tool += t.elapsed();
        }
    }
    (model / n, tool / n)
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "MISS"
    }
}

fn rss_mb() -> f64 {
    status_mb("VmRSS:")
}

/// A memory line of /proc/self/status in MB (`VmRSS:` now, `VmHWM:` the peak).
fn status_mb(key: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let url = rt.block_on(peer());
    let pdir = dir.path().join("pipelines");
    std::fs::create_dir_all(&pdir).expect("mkdir");
    for (name, agent, calls) in [
        ("long", "worker", LONG_CALLS),
        ("zero", "worker", 0),
        ("short", "worker", SHORT_CALLS),
        ("gate", "gated", 1),
    ] {
        std::fs::write(
            pdir.join(format!("{name}.yaml")),
            pipeline_yaml(name, agent, calls),
        )
        .expect("write");
    }
    let cfg_path = dir.path().join("config.yaml");
    std::fs::write(&cfg_path, config_yaml(&url)).expect("write");
    let config = Arc::new(Config::load(&cfg_path, true).expect("config").0);
    let (set, diags) = vectorstep::pipeline::load(std::slice::from_ref(&pdir), &config);
    let set = set.unwrap_or_else(|| panic!("{diags}"));
    let store = Store::open(&config.database_path).expect("store");

    rt.block_on(async {
        let engine = Engine::new(
            config.clone(),
            set,
            store.clone(),
            Executors::standard(&config),
            Arc::new(SystemClock),
        );
        // As `serve` sets it up: tool approvals park their runs.
        engine.enable_parking();
        // Warm-up: connections, file creation, page cache.
        run_one(&engine, "short").await;
        run_one(&engine, "zero").await;

        let mut baseline = Baseline::open(dir.path()).await;
        single_run(&engine, &store, &mut baseline, &url).await;
        concurrent_runs(&engine, &store, &mut baseline).await;
        parked_runs(&engine, &store).await;

        let stats = store.stats();
        println!(
            "store: {} batches in {} transactions ({:.1} batches per fsync)",
            stats.batches_committed,
            stats.transactions_committed,
            stats.batches_committed as f64 / stats.transactions_committed.max(1) as f64
        );
    });
}

/// Rounds of the side-by-side measurements: the machine's disk is shared, so a
/// commit's cost changes from minute to minute; each round measures the baseline
/// right before its runs and the ratio is taken per round.
const ROUNDS: usize = 3;

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// `LONG_CALLS` tool turns plus the answer turn, per round; the run's fixed cost
/// (creating it, its step records) is shown by a run of the answer turn alone.
async fn single_run(engine: &Arc<Engine>, store: &Store, baseline: &mut Baseline, url: &str) {
    println!("1. one run, {LONG_CALLS} turns with one tool call each + the answer turn:");
    let turns = (LONG_CALLS + 1) as u32;
    let (mut ratios, mut marginals) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let (model_rtt, tool_rtt) = http_round_trips(url).await;
        let before = store.stats().transactions_committed;
        let (commit, (long, cpu)) = baseline
            .around(async {
                let (t, cpu) = (Instant::now(), cpu_time());
                run_one(engine, "long").await;
                (t.elapsed(), cpu_time() - cpu)
            })
            .await;
        let fsyncs = store.stats().transactions_committed - before;
        let t = Instant::now();
        run_one(engine, "zero").await;
        let zero = t.elapsed();
        let per_turn = long / turns;
        let marginal = long.saturating_sub(zero) / LONG_CALLS as u32;
        let ratio = per_turn.as_secs_f64() / commit.as_secs_f64();
        ratios.push(ratio);
        marginals.push(marginal.as_secs_f64() / commit.as_secs_f64());
        println!(
            "  {:.0} turns/s, {:.3} ms per turn (whole run / {turns}) = {ratio:.2}x one store commit; \
             {fsyncs} fsyncs in the run ({:.2} per turn); marginal tool turn {:.3} ms; answer-only run {:.3} ms",
            turns as f64 / long.as_secs_f64(),
            ms(per_turn),
            fsyncs as f64 / turns as f64,
            ms(marginal),
            ms(zero)
        );
        let commits = commit * 2;
        let rest = per_turn
            .saturating_sub(commits)
            .saturating_sub(model_rtt)
            .saturating_sub(tool_rtt);
        println!(
            "    of a turn: 2 commits {:.3} ms, model round trip {:.3} ms, tool round trip {:.3} ms, \
             the rest {:.3} ms; CPU per turn {:.3} ms (whole process: engine, writer, fake peer)",
            ms(commits),
            ms(model_rtt),
            ms(tool_rtt),
            ms(rest),
            ms(cpu / turns)
        );
    }
    let (mid, lo, hi) = median(ratios);
    let (mmid, mlo, mhi) = median(marginals);
    println!(
        "  per turn: median {mid:.2}x one store commit (range {lo:.2}-{hi:.2}; marginal tool turn \
         {mmid:.2}x, {mlo:.2}-{mhi:.2}) (target <= 2.5x) {}",
        verdict(mid <= 2.5)
    );
}

async fn concurrent_runs(engine: &Arc<Engine>, store: &Store, baseline: &mut Baseline) {
    println!("2. {CONCURRENT} concurrent runs, {SHORT_CALLS} tool turns + the answer turn each:");
    let mut ratios = Vec::new();
    for _ in 0..ROUNDS {
        let before = store.stats();
        let (commit, (elapsed, after, cpu, wcpu)) = baseline
            .around(async {
                let (t, cpu, wcpu) = (Instant::now(), cpu_time(), writer_cpu());
                let handles: Vec<_> = (0..CONCURRENT)
                    .map(|_| {
                        let e = engine.clone();
                        tokio::spawn(async move { run_one(&e, "short").await })
                    })
                    .collect();
                for h in handles {
                    h.await.expect("join");
                }
                (
                    t.elapsed(),
                    store.stats(),
                    cpu_time() - cpu,
                    writer_cpu() - wcpu,
                )
            })
            .await;
        let commit_rate = 1.0 / commit.as_secs_f64();
        let turns = CONCURRENT * (SHORT_CALLS + 1);
        let rate = turns as f64 / elapsed.as_secs_f64();
        let ratio = rate / commit_rate;
        ratios.push(ratio);
        println!(
            "  {rate:.0} turns/s ({turns} turns in {:.2}s) = {ratio:.2}x the store's sequential commit rate; \
             {:.1} batches per fsync; CPU per turn {:.3} ms, store writer thread busy {:.0}% of the time",
            elapsed.as_secs_f64(),
            (after.batches_committed - before.batches_committed) as f64
                / (after.transactions_committed - before.transactions_committed).max(1) as f64,
            ms(cpu / turns as u32),
            100.0 * wcpu.as_secs_f64() / elapsed.as_secs_f64()
        );
    }
    let (mid, lo, hi) = median(ratios);
    println!(
        "  turns/s: median {mid:.2}x the commit rate (range {lo:.2}-{hi:.2}) (target >= 2x) {}",
        verdict(mid >= 2.0)
    );
}

async fn parked_runs(engine: &Arc<Engine>, store: &Store) {
    println!("3. {PARKED} runs parked on a tool call's approval:");
    println!(
        "  started {}",
        match std::env::var("BENCH_PARK_WAVE") {
            Ok(n) => format!("in waves of {n} (BENCH_PARK_WAVE)"),
            Err(_) => "all at once".to_string(),
        }
    );
    let rss_before = rss_mb();
    let t = Instant::now();
    let creating: Vec<_> = (0..PARKED)
        .map(|_| {
            let e = engine.clone();
            tokio::spawn(async move { create(&e, "gate").await })
        })
        .collect();
    let mut ids = Vec::with_capacity(PARKED);
    for c in creating {
        ids.push(c.await.expect("join"));
    }
    let pending_before = store.count_pending_production_approvals().expect("count");
    // All at once by default (the worst case: every driver's transient state alive
    // together); `BENCH_PARK_WAVE=N` starts them N at a time, as webhooks trickle in.
    let wave = std::env::var("BENCH_PARK_WAVE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(PARKED);
    let limit = Duration::from_secs(120);
    for (n, id) in ids.into_iter().enumerate() {
        engine.spawn(id, DriveMode::New);
        if (n + 1) % wave == 0 || n + 1 == PARKED {
            while engine.parked_runs() <= n {
                assert!(
                    t.elapsed() < limit,
                    "only {} of {PARKED} runs parked after {limit:?}",
                    engine.parked_runs()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    let parked_after = t.elapsed();
    // Let every driver finish ending its task.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let parked = engine.parked_runs();
    let in_tasks = engine.active_runs();
    let pending = store.count_pending_production_approvals().expect("count") - pending_before;
    let rss = rss_mb();
    println!(
        "  all parked after {:.2}s: parked_runs() = {parked}, runs still in tasks = {in_tasks}, \
         pending approvals = {pending} (target: {PARKED} parked, 0 in tasks) {}",
        parked_after.as_secs_f64(),
        verdict(parked == PARKED && in_tasks == 0 && pending as usize == PARKED)
    );
    println!(
        "  resident memory {rss:.1} MB with all parked ({rss_before:.1} MB before, +{:.1} KB per run; \
         peak so far {:.1} MB; target < 100 MB) {}",
        (rss - rss_before) * 1024.0 / PARKED as f64,
        status_mb("VmHWM:"),
        verdict(rss < 100.0)
    );
}

/// CPU time of the store's writer thread so far (from /proc), which shows whether
/// the single writer is what limits concurrent turns.
fn writer_cpu() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let tick = Duration::from_secs(1) / 100; // USER_HZ on Linux
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("vectorstep-stor") {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
        let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
        return tick * (ticks(11) + ticks(12));
    }
    Duration::ZERO
}

/// CPU time this process has used (all threads: engine, store writer, fake peer).
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
