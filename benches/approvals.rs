//! 10,000 runs parked on human approvals in one process, then a "crash" and a
//! restart on the same store.
//!
//! Run: `cargo bench --bench approvals` (add `-- --burst` to start all 10,000 runs
//! at once instead of in waves of 1,000). Targets: resident memory with every run
//! waiting stays under 100 MB, and after the restart every wait is re-armed (each
//! run has logged `approval_rearmed`) within 2 seconds of the new engine starting.
//!
//! The restart is measured twice: in this process (drop every task and the engine,
//! build a new engine on the same store, as the brief asks), and in a fresh child
//! process, whose resident memory is what a restarted service really uses (this
//! process keeps the memory the first engine freed). Approvals go to the page only
//! (no chat), so this measures the engine, the store and the waiters, not a Bot API.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing_subscriber::layer::SubscriberExt;
use vectorstep::clock::SystemClock;
use vectorstep::config::Config;
use vectorstep::executor::Executors;
use vectorstep::pipeline::PipelineSet;
use vectorstep::run::context::Normalised;
use vectorstep::runner::{sweep, Created, DriveMode, Engine};
use vectorstep::store::Store;

const RUNS: usize = 10_000;
const WAVE: usize = 1_000;

/// Counts "Re-armed human approval" log lines, which human waits emit right after
/// committing `approval_rearmed`.
struct Rearmed(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Rearmed {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Msg(bool);
        impl tracing::field::Visit for Msg {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" && format!("{v:?}").starts_with("Re-armed human approval")
                {
                    self.0 = true;
                }
            }
        }
        let mut m = Msg(false);
        event.record(&mut m);
        if m.0 {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

struct Setup {
    config: Arc<Config>,
    set: PipelineSet,
    store: Store,
}

impl Setup {
    fn load(cfg: &std::path::Path) -> Setup {
        let config = Arc::new(Config::load(cfg, true).expect("config").0);
        let (set, d) =
            vectorstep::pipeline::load(std::slice::from_ref(&config.pipeline_config_dir), &config);
        let set = set.unwrap_or_else(|| panic!("{d}"));
        let store = Store::open(&config.database_path).expect("store");
        Setup { config, set, store }
    }

    /// An engine set up as `serve` sets it up (parking runs that wait for a human).
    fn engine(&self, rt: &tokio::runtime::Runtime) -> Arc<Engine> {
        let _guard = rt.enter();
        let engine = Engine::new(
            self.config.clone(),
            self.set.clone(),
            self.store.clone(),
            Executors::standard(&self.config),
            Arc::new(SystemClock),
        );
        engine.enable_parking();
        engine
    }
}

fn main() {
    let rearmed = Arc::new(AtomicUsize::new(0));
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(Rearmed(rearmed.clone())),
    )
    .expect("subscriber");
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--fresh-restart") {
        let cfg = args.get(i + 1).expect("--fresh-restart CONFIG");
        let s = Setup::load(std::path::Path::new(cfg));
        restart("fresh process", &s, &rearmed);
        return;
    }
    let burst = args.iter().any(|a| a == "--burst");

    let dir = tempfile::tempdir().expect("tempdir");
    let pdir = dir.path().join("pipelines");
    std::fs::create_dir_all(&pdir).expect("mkdir");
    std::fs::write(
        pdir.join("gate.yaml"),
        "name: gate\nstage: production\ndurable: true\ntrigger: {}\nsteps:\n\
         \x20 - name: approve\n    executor: human\n    timeout_seconds: 86400\n\
         \x20   prompt_template: \"Restart {{ pipeline_name }}?\"\n",
    )
    .expect("write");
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        "pipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\ndatabase: {path: ./approvals.db}\n",
    )
    .expect("write");
    let s = Setup::load(&cfg);

    // Park every run on its approval.
    let rt = runtime();
    let first = s.engine(&rt);
    let rss_before = rss_mb();
    let t = Instant::now();
    rt.block_on(async {
        let pipeline = first.pipeline("gate").expect("gate");
        let trigger = Normalised {
            source: "bench".into(),
            pipeline: Some("gate".into()),
            ..Normalised::default()
        };
        let creating: Vec<_> = (0..RUNS)
            .map(|_| {
                let (e, p, tr) = (first.clone(), pipeline.clone(), trigger.clone());
                tokio::spawn(async move {
                    e.create_run(&p, &tr, &serde_json::json!({}), None, None)
                        .await
                })
            })
            .collect();
        let mut ids = Vec::with_capacity(RUNS);
        for c in creating {
            match c.await {
                Ok(Ok(Created::Inserted(id))) => ids.push(id),
                other => panic!("create_run: {other:?}"),
            }
        }
        // Driven the way `serve` drives runs (one task each), in waves as webhooks
        // would arrive unless `--burst`.
        let wave = if burst { RUNS } else { WAVE };
        for (n, id) in ids.into_iter().enumerate() {
            first.spawn(id, DriveMode::New);
            if (n + 1) % wave == 0 {
                wait_until("a wave parked", Duration::from_secs(120), || {
                    pending(&s.store) > n
                })
                .await;
            }
        }
        println!(
            "parked {RUNS} runs on approvals in {:.2}s ({})",
            t.elapsed().as_secs_f64(),
            if burst {
                "all started at once"
            } else {
                "started in waves of 1,000"
            }
        );
        // Let every waiter settle into its wait.
        tokio::time::sleep(Duration::from_secs(2)).await;
    });
    let rss_parked = rss_mb();
    println!(
        "resident memory: {rss_before:.1} MB before, {rss_parked:.1} MB with {RUNS} runs waiting \
         (+{:.1} MB, {:.1} KB per run; target < 100 MB total)",
        rss_parked - rss_before,
        (rss_parked - rss_before) * 1024.0 / RUNS as f64
    );

    // "Crash": drop every task and the engine, keep only the store.
    drop(first);
    rt.shutdown_timeout(Duration::from_secs(5));
    restart("in this process", &s, &rearmed);

    // The same restart again, as a new process on the same store.
    let status = std::process::Command::new(std::env::current_exe().expect("exe"))
        .arg("--fresh-restart")
        .arg(&cfg)
        .status()
        .expect("child");
    assert!(status.success(), "fresh-process restart failed");
}

/// Sweeps, resumes every run and waits until each has re-armed its approval.
fn restart(label: &str, s: &Setup, rearmed: &AtomicUsize) {
    rearmed.store(0, Ordering::Relaxed);
    let rt = runtime();
    let engine = s.engine(&rt);
    rt.block_on(async {
        let t = Instant::now();
        let resumable = sweep::sweep(&engine).await.expect("sweep");
        let swept = t.elapsed();
        // As `serve` does it.
        tokio::spawn({
            let engine = engine.clone();
            async move { sweep::resume_all(&engine, resumable).await }
        });
        wait_until("every wait re-armed", Duration::from_secs(120), || {
            rearmed.load(Ordering::Relaxed) >= RUNS
        })
        .await;
        println!(
            "restart ({label}): sweep {:.3}s; all {RUNS} approvals re-armed after {:.3}s (target < 2s); \
             resident memory {:.1} MB",
            swept.as_secs_f64(),
            t.elapsed().as_secs_f64(),
            rss_mb()
        );
        assert_eq!(pending(&s.store), RUNS);
    });
    drop(engine);
    rt.shutdown_timeout(Duration::from_secs(5));
}

fn pending(store: &Store) -> usize {
    store.count_pending_production_approvals().unwrap_or(0) as usize
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < limit, "{what}: not reached within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
