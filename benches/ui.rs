//! The operator web UI: what its pages cost the server, and what clients holding
//! the events stream open cost the engine.
//!
//! Run: `cargo bench --bench ui`. Three ratios, each measured side by side in one
//! run, the two sides alternating in rounds (the machine is shared and noisy), and
//! reported as medians:
//!
//! 1. `GET /ui` (first page, no filters) with 100,000 finished runs in the store
//!    against the same page with 100 runs; target at most 2x. Server time: the
//!    real router (`vectorstep::http::router`) is called in-process through its
//!    `tower_service::Service` impl, and the body is read to the end, so no
//!    client or socket is in the number. The counts by status on that page are
//!    cached for 3 s and refreshed off the request path; one uncached count is
//!    timed on its own, to show why.
//! 2. `GET /ui/runs/{id}` of a run of 200 `mock` steps that the engine drove (its
//!    step records and run log as the engine writes them); target under 50 ms.
//! 3. The engine's CPU time per step while 100 plain HTTP clients each hold
//!    `GET /runs/{id}/events` open on one of the 100 runs being driven, against
//!    the same workload without clients; target at most 20% more. The server is
//!    the real router on the server loop `serve` uses, on 127.0.0.1; the clients
//!    (reqwest, reading the stream to its `end` event) run in a child process
//!    (this executable with `--sse-clients ADDR`, at nice 19, as clients on
//!    other machines would not compete for the server's cores) so that the CPU
//!    time of this process (`getrusage`, every thread) is the server's and the
//!    engine's only.
//!
//! Knobs: `BENCH_RUNS` (100,000), `BENCH_LIST_ROUNDS` (10, of 20 requests per
//! side), `BENCH_SSE_ROUNDS` (6), `BENCH_SSE_STEPS` (steps per run, 100),
//! `BENCH_SSE_DELAY_MS` (each mock step's delay, 0), `BENCH_SSE_SIDES` (`with`
//! or `without` times one side only, to profile it; no ratio is then printed).
//!
//! Nothing here asserts on time: the targets are printed as met or missed.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower_service::Service;
use vectorstep::clock::SystemClock;
use vectorstep::config::Config;
use vectorstep::domain::RunStatus;
use vectorstep::executor::Executors;
use vectorstep::http::{router, AppState};
use vectorstep::pipeline::PipelineSet;
use vectorstep::run::context::Normalised;
use vectorstep::runner::{Created, DriveMode, Engine, RunEnd};
use vectorstep::store::{RunQuery, RunRecord, Store, Write};

const SMALL_RUNS: usize = 100;
const FILL_BATCH: usize = 1_000;
const PER_ROUND: usize = 20;
const RUN_PAGE_STEPS: usize = 200;
const SSE_CLIENTS: usize = 100;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pipeline_yaml(name: &str, steps: usize, delay_ms: usize) -> String {
    let mut s = format!("name: {name}\ntrigger: {{}}\nstage: production\ndurable: true\nsteps:\n");
    let delay = if delay_ms > 0 {
        format!("      delay_ms: {delay_ms}\n")
    } else {
        String::new()
    };
    for i in 0..steps {
        s.push_str(&format!(
            "  - name: s{i}\n    executor: mock\n    executor_config:\n{delay}      output: {{confidence: 0.9, summary: \"step {i} looked at the service\", next_step_context: \"\"}}\n    prompt_template: \"step {i} of {{{{ pipeline_name }}}}\"\n"
        ));
    }
    s
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn median_f(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn verdict(met: bool) -> &'static str {
    if met {
        "MET"
    } else {
        "MISSED"
    }
}

/// User plus system CPU time of this process, every thread.
fn cpu_time() -> Duration {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_SELF needs nothing else.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Finished runs as the engine leaves them (completed, one in ten failed), one
/// per second up to `now`, with an Alertmanager-like trigger in `context_json`,
/// committed through the writer in batches of 1,000.
fn fill(store: &Store, n: usize, now: i64) {
    let mut batch = Vec::with_capacity(FILL_BATCH);
    for i in 0..n {
        let triggered_at = now - ((n - i) as i64) * 1000;
        let failed = i % 10 == 3;
        let service = format!("svc-{}", i % 50);
        let trigger = Normalised {
            source: "alertmanager".into(),
            pipeline: Some("page".into()),
            severity: Some(if i % 4 == 0 { "critical" } else { "warning" }.into()),
            labels: BTreeMap::from([
                ("alertname".into(), format!("HighLatency{}", i % 37)),
                ("service".into(), service.clone()),
                ("namespace".into(), "production".into()),
                (
                    "instance".into(),
                    format!("10.0.{}.{}:9090", i % 200, i % 251),
                ),
            ]),
            summary: Some(format!("p99 latency above 2s on {service}")),
            fingerprint: Some(format!("{i:016x}")),
            team: Some(["sre", "db", "net"][i % 3].into()),
            metadata: Default::default(),
            received_at: vectorstep::clock::rfc3339(triggered_at),
            ..Normalised::default()
        };
        let payload = serde_json::json!({
            "status": "firing",
            "alerts": [{"labels": trigger.labels, "annotations": {"summary": trigger.summary},
                        "startsAt": trigger.received_at, "fingerprint": trigger.fingerprint}],
        });
        batch.push(Write::InsertRun(RunRecord {
            id: uuid::Uuid::now_v7().to_string(),
            pipeline_name: "page".into(),
            status: if failed {
                RunStatus::Failed
            } else {
                RunStatus::Completed
            },
            source: trigger.source.clone(),
            team: trigger.team.clone(),
            stage: "production".into(),
            triggered_at,
            completed_at: Some(triggered_at + 2_000 + (i % 7_000) as i64),
            resumed_at: None,
            resume_count: 0,
            config_fingerprint: "0123456789abcdef".into(),
            parent_run_id: None,
            parent_step_path: None,
            dedup_fingerprint: trigger.fingerprint.clone(),
            context_json: serde_json::to_string(&trigger).expect("trigger json"),
            payload_json: payload.to_string(),
            tokens_used: 0,
            cost_usd: 0.0,
            terminal_step: Some(if failed { "s7" } else { "s199" }.into()),
            reason: failed.then(|| "step s7 failed: mock failure".into()),
            final_output_json: None,
            replay_of: None,
        }));
        if batch.len() == FILL_BATCH || i + 1 == n {
            store
                .commit_blocking(std::mem::take(&mut batch))
                .expect("fill commit");
        }
    }
}

fn engine(
    rt: &tokio::runtime::Runtime,
    config: &Arc<Config>,
    set: &PipelineSet,
    store: &Store,
) -> Arc<Engine> {
    let _guard = rt.enter();
    Engine::new(
        config.clone(),
        set.clone(),
        store.clone(),
        Executors::standard(config),
        Arc::new(SystemClock),
    )
}

/// One request through the router, in-process; the body read to its end.
/// Returns the time taken and the body's length.
async fn call(app: &axum::Router, uri: &str) -> (Duration, usize) {
    let mut svc = app.clone();
    let req = Request::builder()
        .uri(uri)
        .body(Body::empty())
        .expect("request");
    let t = Instant::now();
    std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut svc, cx))
        .await
        .expect("ready");
    let resp = svc.call(req).await.expect("infallible");
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    let took = t.elapsed();
    assert_eq!(
        status,
        StatusCode::OK,
        "{uri}: {}",
        String::from_utf8_lossy(&body)
    );
    (took, body.len())
}

async fn create(engine: &Arc<Engine>, pipeline: &str) -> String {
    let p = engine.pipeline(pipeline).expect("pipeline loaded");
    let trigger = Normalised {
        source: "bench".into(),
        pipeline: Some(pipeline.into()),
        labels: BTreeMap::from([("service".into(), "api".into())]),
        summary: Some("bench run".into()),
        ..Default::default()
    };
    match engine
        .create_run(&p, &trigger, &serde_json::json!({}), None, None)
        .await
    {
        Ok(Created::Inserted(id)) => id,
        other => panic!("run not created: {other:?}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--sse-clients") {
        sse_clients(args.get(i + 1).expect("--sse-clients ADDR"));
        return;
    }
    let big_runs = env_usize("BENCH_RUNS", 100_000);
    let list_rounds = env_usize("BENCH_LIST_ROUNDS", 10);
    let sse_rounds = env_usize("BENCH_SSE_ROUNDS", 6);
    let sse_steps = env_usize("BENCH_SSE_STEPS", 100);
    let sse_delay = env_usize("BENCH_SSE_DELAY_MS", 0);

    let dir = tempfile::tempdir().expect("tempdir");
    let pdir = dir.path().join("pipelines");
    std::fs::create_dir_all(&pdir).expect("mkdir");
    std::fs::write(
        pdir.join("page.yaml"),
        pipeline_yaml("page", RUN_PAGE_STEPS, 0),
    )
    .expect("write");
    std::fs::write(
        pdir.join("hold.yaml"),
        "name: hold\ntrigger: {}\nstage: production\ndurable: true\nsteps:\n  - name: wait\n    \
         executor: mock\n    executor_config: {delay_ms: 7000}\n    prompt_template: \"wait\"\n",
    )
    .expect("write");
    std::fs::write(
        pdir.join("sse.yaml"),
        pipeline_yaml("sse", sse_steps, sse_delay),
    )
    .expect("write");
    let cfg_path = dir.path().join("config.yaml");
    std::fs::write(
        &cfg_path,
        "pipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\ndatabase: {path: ./unused.db}\n\
         concurrency: {max_runs: 1000}\n",
    )
    .expect("write");
    let config = Arc::new(Config::load(&cfg_path, true).expect("config").0);
    let (set, diags) = vectorstep::pipeline::load(std::slice::from_ref(&pdir), &config);
    let set = set.unwrap_or_else(|| panic!("{diags}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "vectorstep UI bench: {} CPUs, tokio workers = CPUs, SQLite synchronous=FULL, no log subscriber",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    runs_list(&rt, &config, &set, dir.path(), big_runs, list_rounds);
    run_page(&rt, &config, &set, dir.path());
    sse(
        &rt,
        &config,
        &set,
        dir.path(),
        sse_rounds,
        sse_steps,
        sse_delay,
    );
}

/// 1. `GET /ui` with `big_runs` runs against 100 runs.
fn runs_list(
    rt: &tokio::runtime::Runtime,
    config: &Arc<Config>,
    set: &PipelineSet,
    dir: &std::path::Path,
    big_runs: usize,
    rounds: usize,
) {
    println!("\n== 1. runs list: GET /ui, first page, no filters ==");
    let now = chrono::Utc::now().timestamp_millis();
    let big = Store::open(&dir.join("big.db")).expect("store");
    let small = Store::open(&dir.join("small.db")).expect("store");
    let t = Instant::now();
    fill(&big, big_runs, now);
    fill(&small, SMALL_RUNS, now);
    println!(
        "filled the stores in {:.1}s: {big_runs} and {SMALL_RUNS} finished runs",
        t.elapsed().as_secs_f64()
    );

    // The parts the page is made of, bare, on this thread.
    let first_page = RunQuery {
        limit: 51,
        ..RunQuery::default()
    };
    let mut bare = [(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
    for _ in 0..15 {
        for (i, store) in [&big, &small].into_iter().enumerate() {
            let t = Instant::now();
            let page = store.runs_page(&first_page).expect("page");
            bare[i].0.push(t.elapsed());
            assert_eq!(page.len(), 51);
            let t = Instant::now();
            let counts = store.count_runs_by_status().expect("counts");
            bare[i].1.push(t.elapsed());
            let total: u64 = counts.iter().map(|(_, n)| n).sum();
            assert_eq!(total as usize, [big_runs, SMALL_RUNS][i]);
        }
    }

    let big_engine = engine(rt, config, set, &big);
    let small_engine = engine(rt, config, set, &small);
    let apps = [
        router(AppState::new(big_engine, None)),
        router(AppState::new(small_engine, None)),
    ];
    let mut times = [Vec::new(), Vec::new()];
    let mut sizes = [0, 0];
    rt.block_on(async {
        // Warm-up: the first request counts uncached (nothing to show yet), the
        // page key is read, templates and the page cache get warm.
        for app in &apps {
            for _ in 0..PER_ROUND {
                call(app, "/ui").await;
            }
        }
        for round in 0..rounds {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for side in order {
                for _ in 0..PER_ROUND {
                    let (took, len) = call(&apps[side], "/ui").await;
                    times[side].push(took);
                    sizes[side] = len;
                }
            }
        }
    });
    let (b, s) = (median(&times[0]), median(&times[1]));
    let ratio = b.as_secs_f64() / s.as_secs_f64();
    for (i, label) in [format!("{big_runs} runs"), format!("{SMALL_RUNS} runs")]
        .iter()
        .enumerate()
    {
        println!(
            "GET /ui, {label:>13}: median {:.3} ms, p90 {:.3} ms over {} requests ({} bytes); \
             bare keyset page query {:.3} ms, one uncached count by status {:.3} ms",
            ms(median(&times[i])),
            ms(percentile(&times[i], 0.9)),
            times[i].len(),
            sizes[i],
            ms(median(&bare[i].0)),
            ms(median(&bare[i].1)),
        );
    }
    println!(
        "RESULT runs list: {:.3} ms / {:.3} ms = {ratio:.2}x (target <= 2x): {}",
        ms(b),
        ms(s),
        verdict(ratio <= 2.0)
    );
    println!(
        "  (an uncached count on every request would add {:.3} ms to the {big_runs}-run page: \
         {:.1}x its median)",
        ms(median(&bare[0].1)),
        (b + median(&bare[0].1)).as_secs_f64() / s.as_secs_f64()
    );
}

/// 2. `GET /ui/runs/{id}` of a 200-step run the engine drove.
fn run_page(
    rt: &tokio::runtime::Runtime,
    config: &Arc<Config>,
    set: &PipelineSet,
    dir: &std::path::Path,
) {
    println!("\n== 2. run page: GET /ui/runs/{{id}} of a {RUN_PAGE_STEPS}-step run ==");
    let store = Store::open(&dir.join("run.db")).expect("store");
    let engine = engine(rt, config, set, &store);
    let app = router(AppState::new(engine.clone(), None));
    let (times, len, id) = rt.block_on(async {
        let id = create(&engine, "page").await;
        match engine.drive(&id, DriveMode::New).await {
            Ok(RunEnd::Finished(s)) => assert_eq!(s.to_string(), "completed"),
            other => panic!("run did not finish: {other:?}"),
        }
        let uri = format!("/ui/runs/{id}");
        for _ in 0..PER_ROUND {
            call(&app, &uri).await;
        }
        let mut times = Vec::new();
        let mut len = 0;
        for _ in 0..10 * PER_ROUND {
            let (took, l) = call(&app, &uri).await;
            times.push(took);
            len = l;
        }
        (times, len, id)
    });
    let steps = store.steps(&id).expect("steps").len();
    let events = store.events(&id).expect("events").len();
    let m = median(&times);
    println!(
        "run {id}: {steps} step records, {events} log entries; page {len} bytes; \
         median {:.3} ms, p90 {:.3} ms over {} requests",
        ms(m),
        ms(percentile(&times, 0.9)),
        times.len()
    );
    println!(
        "RESULT run page: median {:.3} ms (target < 50 ms): {}",
        ms(m),
        verdict(m < Duration::from_millis(50))
    );
}

/// 3. Engine CPU per step with 100 clients on the events stream, and without.
fn sse(
    rt: &tokio::runtime::Runtime,
    config: &Arc<Config>,
    set: &PipelineSet,
    dir: &std::path::Path,
    rounds: usize,
    steps: usize,
    delay_ms: usize,
) {
    println!(
        "\n== 3. events stream: {SSE_CLIENTS} runs of {steps} mock steps (delay {delay_ms} ms) \
         driven at once, with {SSE_CLIENTS} clients on GET /runs/{{id}}/events (one per run) and without =="
    );
    let store = Store::open(&dir.join("sse.db")).expect("store");
    let engine = engine(rt, config, set, &store);
    let total_steps = (SSE_CLIENTS * steps) as f64;
    // One side alone (`BENCH_SSE_SIDES=with|without`) is for profiling each.
    let sides: Vec<bool> = match std::env::var("BENCH_SSE_SIDES").as_deref() {
        Ok("with") => vec![true],
        Ok("without") => vec![false],
        _ => vec![false, true],
    };
    // [without, with]: CPU per step, wall per step.
    let mut cpu = [Vec::new(), Vec::new()];
    let mut wall = [Vec::new(), Vec::new()];
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let limits = vectorstep::http::server::Limits::from_config(&config.server, 10_000);
        tokio::spawn(vectorstep::http::server::serve(
            listener,
            router(AppState::new(engine.clone(), None)),
            limits,
            std::future::pending(),
        ));
        let mut child = tokio::process::Command::new(std::env::current_exe().expect("exe"))
            .arg("--sse-clients")
            .arg(addr.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("client process");
        let mut to_child = child.stdin.take().expect("stdin");
        let mut from_child = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
            child.stdout.take().expect("stdout"),
        ));
        // Warm-up, one round of each side untimed.
        for round in 0..=rounds {
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for with_clients in order.into_iter().filter(|w| sides.contains(w)) {
                let mut ids = Vec::with_capacity(SSE_CLIENTS);
                for _ in 0..SSE_CLIENTS {
                    ids.push(create(&engine, "sse").await);
                }
                if with_clients {
                    let line = format!("{}\n", ids.join(" "));
                    tokio::io::AsyncWriteExt::write_all(&mut to_child, line.as_bytes())
                        .await
                        .expect("to client process");
                    expect_line(&mut from_child, "ready").await;
                }
                let (c0, t0) = (cpu_time(), Instant::now());
                let handles: Vec<_> = ids
                    .iter()
                    .map(|id| engine.spawn(id.clone(), DriveMode::New))
                    .collect();
                for h in handles {
                    match h.await.expect("join") {
                        Ok(RunEnd::Finished(s)) => assert_eq!(s.to_string(), "completed"),
                        other => panic!("run did not finish: {other:?}"),
                    }
                }
                let driven = t0.elapsed();
                let mut delivered = 0usize;
                if with_clients {
                    // Until every stream has read its run's log to the `end` event.
                    let line = expect_line(&mut from_child, "done").await;
                    delivered = line[5..].trim().parse().expect("event count");
                }
                let (c, w) = (cpu_time() - c0, t0.elapsed());
                let side = usize::from(with_clients);
                let per_step_cpu = c.as_secs_f64() * 1e6 / total_steps;
                let per_step_wall = w.as_secs_f64() * 1e6 / total_steps;
                println!(
                    "round {round}{} {:>15}: CPU {:.3}s = {per_step_cpu:.1} us/step; wall {:.3}s \
                     (runs done after {:.3}s) = {per_step_wall:.1} us/step{}",
                    if round == 0 { " (warm-up)" } else { "" },
                    if with_clients {
                        "with clients"
                    } else {
                        "without clients"
                    },
                    c.as_secs_f64(),
                    w.as_secs_f64(),
                    driven.as_secs_f64(),
                    if with_clients {
                        format!("; {delivered} events delivered")
                    } else {
                        String::new()
                    }
                );
                if round > 0 {
                    cpu[side].push(per_step_cpu);
                    wall[side].push(per_step_wall);
                }
            }
        }
        if sides.len() == 2 {
            follower_cost(&engine, &mut to_child, &mut from_child).await;
        }
        drop(to_child);
        let _ = child.wait().await;
    });
    // Rounds alternate the order, so each with-clients side has a neighbour.
    if sides.len() < 2 {
        return;
    }
    let pairs: Vec<f64> = cpu[1].iter().zip(&cpu[0]).map(|(w, o)| w / o).collect();
    let (c0, c1) = (median_f(&cpu[0]), median_f(&cpu[1]));
    let (w0, w1) = (median_f(&wall[0]), median_f(&wall[1]));
    println!(
        "wall per step: {w0:.1} us without, {w1:.1} us with clients = {:.2}x (clients share the cores)",
        w1 / w0
    );
    println!(
        "RESULT events stream: CPU per step {c1:.1} us with {SSE_CLIENTS} clients / {c0:.1} us without \
         = {:.2}x, {:+.0}% (target <= +20%): {}",
        c1 / c0,
        (c1 / c0 - 1.0) * 100.0,
        verdict(c1 / c0 <= 1.2)
    );
    println!(
        "  per round (with / without of the same round): {} ; median {:.2}x",
        pairs
            .iter()
            .map(|r| format!("{r:.2}x"))
            .collect::<Vec<_>>()
            .join(" "),
        median_f(&pairs)
    );
}

/// What a follower costs by the second, whatever the step rate: 100 runs wait
/// in a long `hold` step (nothing to send) while one other run after another
/// commits steps in the background, first without clients, then with a client
/// on each waiting run. The difference is the followers' polling: each reads the
/// store whenever this process committed anything since its last look.
async fn follower_cost(
    engine: &Arc<Engine>,
    to_child: &mut tokio::process::ChildStdin,
    from_child: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    let mut ids = Vec::with_capacity(SSE_CLIENTS);
    for _ in 0..SSE_CLIENTS {
        ids.push(create(engine, "hold").await);
    }
    let held: Vec<_> = ids
        .iter()
        .map(|id| engine.spawn(id.clone(), DriveMode::New))
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let (engine, stop) = (engine.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = create(&engine, "sse").await;
                engine.drive(&id, DriveMode::New).await.expect("busy run");
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let window = Duration::from_secs(2);
    let measure = async || {
        let (c0, s0) = (cpu_time(), engine.store.stats().transactions_committed);
        tokio::time::sleep(window).await;
        (
            cpu_time() - c0,
            engine.store.stats().transactions_committed - s0,
        )
    };
    let (without, commits0) = measure().await;
    let line = format!("{}\n", ids.join(" "));
    tokio::io::AsyncWriteExt::write_all(to_child, line.as_bytes())
        .await
        .expect("to client process");
    expect_line(from_child, "ready").await;
    let (with, commits1) = measure().await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.await.expect("busy");
    for h in held {
        h.await.expect("join").expect("held run");
    }
    expect_line(from_child, "done").await;
    let extra = with.saturating_sub(without).as_secs_f64() / window.as_secs_f64();
    println!(
        "followers of waiting runs, while other runs commit ({commits0} and {commits1} commits in \
         the two {}s windows): CPU {:.0} ms/s without clients, {:.0} ms/s with {SSE_CLIENTS}: \
         {:.1} ms of CPU per second per 100 followers = {:.0} us per follower per second",
        window.as_secs(),
        without.as_secs_f64() * 1000.0 / window.as_secs_f64(),
        with.as_secs_f64() * 1000.0 / window.as_secs_f64(),
        extra * 1000.0,
        extra * 1e6 / SSE_CLIENTS as f64
    );
}

/// The next line of the client process, which must start with `what`.
async fn expect_line(
    from_child: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    what: &str,
) -> String {
    let line = from_child
        .next_line()
        .await
        .expect("client process output")
        .expect("client process ended");
    assert!(
        line.starts_with(what),
        "client process said {line:?}, expected {what}"
    );
    line
}

/// The child process of part 3: for each line of run ids on stdin, one streaming
/// GET of `/runs/{id}/events` per id (each on its own connection); prints
/// `ready` once every stream has delivered its first event and `done N` when
/// every stream has ended, N the events delivered.
fn sse_clients(addr: &str) {
    // The clients stand for browsers on other machines: at the lowest priority
    // they take only the CPU the engine leaves idle, so what they cost the
    // engine is the serving of their streams, not a fight for the two cores.
    // SAFETY: setpriority takes plain integers and changes only this process.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(600))
            .build()
            .expect("client");
        let mut lines =
            tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
        while let Some(line) = lines.next_line().await.expect("stdin") {
            let ids: Vec<String> = line.split_whitespace().map(str::to_string).collect();
            let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel();
            let tasks: Vec<_> = ids
                .iter()
                .map(|id| {
                    let (client, ready) = (client.clone(), ready_tx.clone());
                    let url = format!("http://{addr}/runs/{id}/events");
                    tokio::spawn(async move { follow(client, url, ready).await })
                })
                .collect();
            for _ in 0..ids.len() {
                ready_rx
                    .recv()
                    .await
                    .expect("a stream ended before its first event");
            }
            say("ready");
            let mut total = 0;
            for t in tasks {
                total += t.await.expect("join");
            }
            say(&format!("done {total}"));
        }
    });
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("stdout");
    out.flush().expect("stdout");
}

async fn follow(
    client: reqwest::Client,
    url: String,
    ready: tokio::sync::mpsc::UnboundedSender<()>,
) -> usize {
    let mut resp = client.get(&url).send().await.expect("events stream");
    assert_eq!(resp.status(), reqwest::StatusCode::OK, "{url}");
    let (mut buf, mut events, mut ended) = (Vec::<u8>::new(), 0, false);
    while let Some(chunk) = resp.chunk().await.expect("stream chunk") {
        buf.extend_from_slice(&chunk);
        while let Some(n) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=n).collect();
            if line.starts_with(b"id:") {
                if events == 0 {
                    let _ = ready.send(());
                }
                events += 1;
            } else if line.starts_with(b"event:") && line.windows(3).any(|w| w == b"end") {
                ended = true;
            }
        }
    }
    assert!(ended, "{url}: the stream closed without its end event");
    events
}
