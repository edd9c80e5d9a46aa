//! The intake bench's overload case: a service at `concurrency.max_runs`, where
//! clients that are refused 429 retry every 50 ms. Every 429 first checks dedup
//! (a retried alert whose run exists must be answered `deduplicated`), so the cost
//! of a refusal decides whether retrying clients starve the runs in progress.
//!
//! Measured side by side in one process: accepted runs per second with feeder
//! clients keeping the cap full, alone and then with 100 retrying clients on top;
//! and the CPU time per 429 answer while the cap is held by slow runs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vectorstep::clock::SystemClock;
use vectorstep::config::Config;
use vectorstep::executor::Executors;
use vectorstep::http::{router, AppState};
use vectorstep::runner::Engine;
use vectorstep::store::Store;

use super::{alert, Conn, PATH};

const MAX_RUNS: usize = 40;
const FEEDERS: usize = 40;
const RETRIERS: usize = 100;

fn pipeline(delay_ms: u64) -> String {
    format!(
        "name: bench\nstage: production\ntrigger:\n  match: {{alertname: Bench}}\nsteps:\n  - name: triage\n    executor: mock\n    executor_config:\n      delay_ms: {delay_ms}\n      output: {{confidence: 0.9, summary: \"triaged\", next_step_context: \"\"}}\n"
    )
}

/// CPU seconds this process has used (user + system).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// A capped service on its own store, served by the same loop as `serve`.
async fn start(dir: &std::path::Path, delay_ms: u64) -> (std::net::SocketAddr, Arc<Engine>) {
    let pdir = dir.join("pipelines");
    std::fs::create_dir_all(&pdir).expect("mkdir");
    std::fs::write(pdir.join("bench.yaml"), pipeline(delay_ms)).expect("write");
    let cfg_path = dir.join("config.yaml");
    std::fs::write(
        &cfg_path,
        format!(
            "server: {{host: 127.0.0.1, port: 0}}\npipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\n\
             database: {{path: ./bench.db}}\ndedup: {{enabled: true, window_seconds: 300}}\n\
             concurrency: {{max_runs: {MAX_RUNS}}}\n"
        ),
    )
    .expect("write");
    let config = Arc::new(Config::load(&cfg_path, true).expect("config").0);
    let (set, diags) = vectorstep::pipeline::load(std::slice::from_ref(&pdir), &config);
    let set = set.unwrap_or_else(|| panic!("{diags}"));
    let store = Store::open(&config.database_path).expect("store");
    let engine = Engine::new(
        config.clone(),
        set,
        store,
        Executors::standard(&config),
        Arc::new(SystemClock),
    );
    let state = AppState::new(engine.clone(), None);
    state.ready.store(true, Ordering::SeqCst);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    // The configured defaults, as `serve` would have them with 10,000 open files.
    let limits = vectorstep::http::server::Limits::from_config(&config.server, 10_000);
    tokio::spawn(vectorstep::http::server::serve(
        listener,
        router(state),
        limits,
        std::future::pending(),
    ));
    (addr, engine)
}

#[derive(Default)]
struct Counts {
    accepted: AtomicUsize,
    refused: AtomicUsize,
}

/// A client that posts distinct alerts for as long as `run` is set; after a 429 it
/// waits `retry` and sends the same alert again.
fn client(
    addr: std::net::SocketAddr,
    prefix: String,
    retry: Duration,
    run: Arc<AtomicBool>,
    counts: Arc<Counts>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut conn = Conn::open(addr, PATH).await;
        let mut i = 0usize;
        let mut body = alert(&format!("{prefix}-{i}"));
        while run.load(Ordering::Relaxed) {
            let (code, status, _) = conn.post(&body).await;
            match (code, status.as_str()) {
                (202, "accepted") => {
                    counts.accepted.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                    body = alert(&format!("{prefix}-{i}"));
                }
                (429, _) => {
                    counts.refused.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(retry).await;
                }
                other => panic!("unexpected answer {other:?}"),
            }
        }
    })
}

/// Accepted runs per second over `for_` with the cap kept full by feeders, and
/// `retriers` clients retrying 429s every 50 ms on top. Returns (accepted/s, 429s).
async fn saturated(tag: &str, retriers: usize, for_: Duration) -> (f64, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, engine) = start(dir.path(), 20).await;
    let run = Arc::new(AtomicBool::new(true));
    let feeders = Arc::new(Counts::default());
    let noise = Arc::new(Counts::default());
    let mut tasks = Vec::new();
    for f in 0..FEEDERS {
        tasks.push(client(
            addr,
            format!("{tag}-feed-{f}"),
            Duration::from_millis(2),
            run.clone(),
            feeders.clone(),
        ));
    }
    for r in 0..retriers {
        tasks.push(client(
            addr,
            format!("{tag}-retry-{r}"),
            Duration::from_millis(50),
            run.clone(),
            noise.clone(),
        ));
    }
    // Let the cap fill, then count.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let a0 = feeders.accepted.load(Ordering::Relaxed) + noise.accepted.load(Ordering::Relaxed);
    let r0 = feeders.refused.load(Ordering::Relaxed) + noise.refused.load(Ordering::Relaxed);
    let t = Instant::now();
    tokio::time::sleep(for_).await;
    let elapsed = t.elapsed().as_secs_f64();
    let accepted =
        feeders.accepted.load(Ordering::Relaxed) + noise.accepted.load(Ordering::Relaxed) - a0;
    let refused =
        feeders.refused.load(Ordering::Relaxed) + noise.refused.load(Ordering::Relaxed) - r0;
    run.store(false, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    engine.wait_idle(Duration::from_secs(60)).await;
    (accepted as f64 / elapsed, refused)
}

/// CPU per 429: the cap is held by runs that sleep for the whole phase, so every
/// request is refused; process CPU (server and load generator together, minus an
/// idle baseline over the same time) divided by the 429s answered.
async fn cpu_per_refusal(for_: Duration) -> (f64, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, engine) = start(dir.path(), 60_000).await;
    let run = Arc::new(AtomicBool::new(true));
    let holders = Arc::new(Counts::default());
    // Fill the cap with runs that stay in flight.
    let mut conn = Conn::open(addr, PATH).await;
    for i in 0..MAX_RUNS {
        let (code, _, _) = conn.post(&alert(&format!("hold-{i}"))).await;
        assert_eq!(code, 202);
        holders.accepted.fetch_add(1, Ordering::Relaxed);
    }
    let idle0 = cpu_seconds();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rate = (cpu_seconds() - idle0) / 0.5;
    let counts = Arc::new(Counts::default());
    let mut tasks = Vec::new();
    for r in 0..RETRIERS {
        tasks.push(client(
            addr,
            format!("cpu-{r}"),
            Duration::from_millis(50),
            run.clone(),
            counts.clone(),
        ));
    }
    let c0 = cpu_seconds();
    let t = Instant::now();
    tokio::time::sleep(for_).await;
    let cpu = cpu_seconds() - c0 - idle_rate * t.elapsed().as_secs_f64();
    let refused = counts.refused.load(Ordering::Relaxed);
    run.store(false, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    assert_eq!(counts.accepted.load(Ordering::Relaxed), 0, "the cap held");
    engine.begin_shutdown();
    (cpu.max(0.0) / refused.max(1) as f64, refused)
}

pub async fn run() {
    let d = Duration::from_secs(super::env_usize("BENCH_OVERLOAD_SECONDS", 5) as u64);
    println!("-- at the cap: max_runs {MAX_RUNS}, {FEEDERS} feeders keeping it full, runs of one 20 ms mock step");
    // Alternated, so a noisy neighbour on the shared machine hits both cases alike.
    let mut quiet = Vec::new();
    let mut noisy = Vec::new();
    for round in 0..2 {
        let (q, q429) = saturated(&format!("q{round}"), 0, d).await;
        let (n, n429) = saturated(&format!("n{round}"), RETRIERS, d).await;
        println!(
            "round {round}: without retriers {q:>6.0} runs/s ({q429} 429s) | with {RETRIERS} clients retrying 429s every 50 ms {n:>6.0} runs/s ({n429} 429s) = {:.0}%",
            100.0 * n / q
        );
        quiet.push(q);
        noisy.push(n);
    }
    let q: f64 = quiet.iter().sum::<f64>() / quiet.len() as f64;
    let n: f64 = noisy.iter().sum::<f64>() / noisy.len() as f64;
    println!(
        "accepted-run throughput with retriers: {:.0}% of without (target >= 80%: {})",
        100.0 * n / q,
        if n >= 0.8 * q { "met" } else { "NOT met" }
    );
    let (cpu, refused) = cpu_per_refusal(d).await;
    println!(
        "CPU per 429 answer (server + load generator in one process): {:.0} us over {refused} refusals ({:.0}/s)",
        cpu * 1e6,
        refused as f64 / d.as_secs_f64()
    );
}
