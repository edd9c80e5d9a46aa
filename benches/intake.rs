//! Webhook intake throughput: the real router (`vectorstep::http::router`) served by
//! the server loop `serve` uses (`vectorstep::http::server`) on 127.0.0.1:0 in this process, on a `synchronous=FULL` store, driven over
//! loopback by bare HTTP/1.1 keep-alive clients (reqwest for warm-up and the burst).
//! Every accepted webhook starts a real run (one `mock` step, no delay), so run
//! writes compete with intake for the same writer.
//!
//! Run: `cargo bench --bench intake`. `BENCH_N` (default 10000) sets the number of
//! accepted webhooks, `BENCH_CLIENTS` (default 64) the concurrent client tasks.
//! Target: >= 5,000 accepted webhooks/s on a 2-core machine; a burst of 1,000
//! identical alerts creates exactly one run. Then the overload case
//! (`intake_overload.rs`): at `concurrency.max_runs`, 100 clients retrying 429s
//! every 50 ms keep accepted-run throughput within 80% of the case without them;
//! `BENCH_OVERLOAD_SECONDS` (default 5) sets each of its phases' length.

#[path = "intake_overload.rs"]
mod overload;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vectorstep::clock::SystemClock;
use vectorstep::config::Config;
use vectorstep::executor::Executors;
use vectorstep::http::{router, AppState};
use vectorstep::runner::Engine;
use vectorstep::store::{raw_commit_probe, RunFilter, Store};

const PIPELINE: &str = "name: bench\nstage: production\ntrigger:\n  match: {alertname: Bench}\nsteps:\n  - name: triage\n    executor: mock\n    executor_config:\n      output: {confidence: 0.9, summary: \"triaged\", next_step_context: \"\"}\n";

/// A one-alert Alertmanager notification; the fingerprint makes it distinct.
fn alert(fingerprint: &str) -> Vec<u8> {
    let labels = json!({"alertname": "Bench", "severity": "critical", "service": "checkout",
        "namespace": "prod-shop", "instance": "10.42.3.17:8080"});
    json!({
        "version": "4",
        "groupKey": format!("{{}}:{{alertname=\"Bench\", fp=\"{fingerprint}\"}}"),
        "status": "firing",
        "receiver": "vectorstep",
        "groupLabels": {"alertname": "Bench"},
        "commonLabels": labels,
        "commonAnnotations": {"summary": "checkout 5xx rate is 12.4% (threshold 5%)"},
        "externalURL": "http://alertmanager.example.invalid:9093",
        "alerts": [{
            "status": "firing",
            "labels": labels,
            "annotations": {"summary": "checkout 5xx rate is 12.4% (threshold 5%)",
                "description": "More than 5% of requests to checkout have failed."},
            "startsAt": "2024-11-28T14:08:12.304Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": fingerprint,
        }]
    })
    .to_string()
    .into_bytes()
}

const PATH: &str = "/webhook?source=alertmanager";

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Posts one alert; returns the HTTP status, the answer's `status` field and the
/// latency.
async fn post(
    client: &reqwest::Client,
    url: &reqwest::Url,
    body: Vec<u8>,
) -> (u16, String, Duration) {
    let t = Instant::now();
    let resp = client
        .post(url.clone())
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request");
    let code = resp.status().as_u16();
    let v: Value = resp.json().await.expect("JSON answer");
    let elapsed = t.elapsed();
    (
        code,
        v["status"].as_str().unwrap_or("").to_string(),
        elapsed,
    )
}

/// A bare HTTP/1.1 keep-alive connection, the timed phases' load generator: it does
/// what a webhook sender must (write a request, read status, headers and a
/// `Content-Length` body) and nothing more, so the two cores it shares with the
/// server go to the server. The JSON answer is still parsed and checked.
struct Conn {
    stream: tokio::io::BufStream<tokio::net::TcpStream>,
    head: Vec<u8>,
}

impl Conn {
    async fn open(addr: std::net::SocketAddr, path: &str) -> Conn {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: "
        )
        .into_bytes();
        Conn {
            stream: tokio::io::BufStream::new(stream),
            head,
        }
    }

    /// Posts `body`; returns the HTTP status, the answer's `status` field and the
    /// latency.
    async fn post(&mut self, body: &[u8]) -> (u16, String, Duration) {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let t = Instant::now();
        let s = &mut self.stream;
        s.write_all(&self.head).await.expect("write");
        s.write_all(format!("{}\r\n\r\n", body.len()).as_bytes())
            .await
            .expect("write");
        s.write_all(body).await.expect("write");
        s.flush().await.expect("flush");
        let mut line = String::new();
        s.read_line(&mut line).await.expect("status line");
        let code: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("status line {line:?}"));
        let mut length = 0usize;
        loop {
            line.clear();
            s.read_line(&mut line).await.expect("header");
            let h = line.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((name, value)) = h.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().expect("content-length");
                }
            }
        }
        let mut answer = vec![0u8; length];
        s.read_exact(&mut answer).await.expect("body");
        let elapsed = t.elapsed();
        let v: Value = serde_json::from_slice(&answer).expect("JSON answer");
        (
            code,
            v["status"].as_str().unwrap_or("").to_string(),
            elapsed,
        )
    }
}

/// Sends `n` webhooks (`body(i)`) from `clients` concurrent tasks, asserts each is
/// answered `want`, and prints the rate and latency. Returns the rate per second.
async fn phase(
    what: &str,
    addr: std::net::SocketAddr,
    path: &str,
    n: usize,
    clients: usize,
    want: &'static str,
    body: fn(usize) -> Vec<u8>,
) -> f64 {
    // Bodies are built before the clock starts: the load generator shares the two
    // cores with the server, and what is measured is the server.
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new((0..n).map(body).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (next, bodies, path) = (next.clone(), bodies.clone(), path.to_string());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr, &path).await;
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return latencies;
                }
                let (code, status, d) = conn.post(&bodies[i]).await;
                assert_eq!(status, want, "webhook {i}: HTTP {code}");
                latencies.push(d);
            }
        }));
    }
    let mut latencies = Vec::with_capacity(n);
    for task in tasks {
        latencies.extend(task.await.expect("client task"));
    }
    let elapsed = t.elapsed();
    latencies.sort();
    let rate = n as f64 / elapsed.as_secs_f64();
    println!(
        "{what:<34} {n:>6} in {:>5.2}s = {rate:>6.0}/s   p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms",
        elapsed.as_secs_f64(),
        ms(percentile(&latencies, 0.50)),
        ms(percentile(&latencies, 0.99)),
        ms(percentile(&latencies, 1.0)),
    );
    rate
}

fn unrouted(i: usize) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&alert(&format!("nm-{i}"))).expect("alert");
    v["alerts"][0]["labels"]["alertname"] = json!("Unrouted");
    v.to_string().into_bytes()
}

fn same(_: usize) -> Vec<u8> {
    alert("dup")
}

fn distinct(i: usize) -> Vec<u8> {
    alert(&format!("fp-{i}"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `BENCH_OVERLOAD_SECONDS=0` skips the overload case.
fn overload_enabled() -> bool {
    env_usize("BENCH_OVERLOAD_SECONDS", 5) > 0
}

fn main() {
    let n = env_usize("BENCH_N", 10_000);
    let clients = env_usize("BENCH_CLIENTS", 64);
    let dir = tempfile::tempdir().expect("tempdir");
    let pdir = dir.path().join("pipelines");
    std::fs::create_dir_all(&pdir).expect("mkdir");
    std::fs::write(pdir.join("bench.yaml"), PIPELINE).expect("write");
    let cfg_path = dir.path().join("config.yaml");
    // No cap in the way: the bench measures intake, not 429s.
    std::fs::write(
        &cfg_path,
        "server: {host: 127.0.0.1, port: 0}\npipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\n\
         database: {path: ./bench.db}\ndedup: {enabled: true, window_seconds: 300}\nconcurrency: {max_runs: 1000000}\n",
    )
    .expect("write");
    let config = Arc::new(Config::load(&cfg_path, true).expect("config").0);
    let (set, diags) = vectorstep::pipeline::load(std::slice::from_ref(&pdir), &config);
    let set = set.unwrap_or_else(|| panic!("{diags}"));
    let store = Store::open(&config.database_path).expect("store");
    // `serve` installs this recorder too, so counters cost what they cost there.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("metrics recorder");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let engine = Engine::new(
            config.clone(),
            set,
            store.clone(),
            Executors::standard(&config),
            Arc::new(SystemClock),
        );
        let state = AppState::new(engine.clone(), Some(metrics));
        state.ready.store(true, Ordering::SeqCst);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = router(state);
        // The configured defaults, as `serve` would have them with 10,000 open files.
        let limits = vectorstep::http::server::Limits::from_config(&config.server, 10_000);
        // `BENCH_SERVER=axum` serves with plain `axum::serve` instead, to compare the
        // cost of the limits side by side.
        if std::env::var("BENCH_SERVER").as_deref() == Ok("axum") {
            println!("server loop: axum::serve (no limits)");
            tokio::spawn(async move { axum::serve(listener, app).await });
        } else {
            println!("server loop: vectorstep::http::server (as serve)");
            tokio::spawn(vectorstep::http::server::serve(
                listener,
                app,
                limits,
                std::future::pending(),
            ));
        }
        let url: reqwest::Url = format!("http://{addr}{PATH}")
            .parse()
            .expect("url");
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(clients)
            .build()
            .expect("client");

        // Warm-up: connections, page cache, prepared statements.
        for i in 0..200 {
            let (_, s, _) = post(&client, &url, alert(&format!("warm-{i}"))).await;
            assert_eq!(s, "accepted");
        }
        engine.wait_idle(Duration::from_secs(60)).await;
        let raw = raw_commit_probe(dir.path(), 200).expect("probe") / 200;
        println!(
            "raw fsync'd SQLite commit here and now: {:.2} ms ({:.0}/s); {clients} client tasks",
            ms(raw),
            1.0 / raw.as_secs_f64()
        );

        // Where the time goes, layer by layer: HTTP + parse + resolve (no store), then
        // + one store round trip (a duplicate writes nothing, so no fsync), then the
        // whole path (insert, `run_started`, and the run itself).
        phase("no_match (422, no store)", addr, PATH, n, clients, "no_match", unrouted).await;
        let (_, s, _) = post(&client, &url, same(0)).await;
        assert_eq!(s, "accepted");
        engine.wait_idle(Duration::from_secs(60)).await;
        phase("deduplicated (1 store read/write)", addr, PATH, n, clients, "deduplicated", same).await;

        let before = store.stats();
        let t = Instant::now();
        let rate = phase("accepted (run created and run)", addr, PATH, n, clients, "accepted", distinct).await;
        let answered = store.stats();
        let elapsed = t.elapsed();
        let idle = engine.wait_idle(Duration::from_secs(120)).await;
        let drained = t.elapsed();
        let after = store.stats();
        println!(
            "accepted: {rate:.0}/s against a target of 5000/s: {}",
            if rate >= 5000.0 { "met" } else { "NOT met" }
        );
        let tx = answered.transactions_committed - before.transactions_committed;
        let batches = answered.batches_committed - before.batches_committed;
        println!(
            "store while answering: {batches} batches ({:.1} per webhook) in {tx} transactions = {:.1} batches per fsync, {:.0} fsyncs/s, {:.2} ms per transaction",
            batches as f64 / n as f64,
            batches as f64 / tx.max(1) as f64,
            tx as f64 / elapsed.as_secs_f64(),
            ms(elapsed) / tx.max(1) as f64,
        );
        println!(
            "all {n} runs finished {:.2}s after the first webhook (idle: {idle}); {} transactions in all",
            drained.as_secs_f64(),
            after.transactions_committed - before.transactions_committed
        );

        // A burst of identical alerts: exactly one run.
        let body = alert("burst-identical");
        let t = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..1_000 {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            tasks.push(tokio::spawn(
                async move { post(&client, &url, body).await.1 },
            ));
        }
        let mut accepted = 0;
        let mut deduplicated = 0;
        for task in tasks {
            match task.await.expect("burst task").as_str() {
                "accepted" => accepted += 1,
                "deduplicated" => deduplicated += 1,
                other => panic!("burst answer {other}"),
            }
        }
        let burst = t.elapsed();
        let runs = store
            .runs(&RunFilter {
                status: None,
                pipeline: Some("bench".into()),
                limit: 0,
                offset: 0,
            })
            .expect("runs");
        let created = runs
            .iter()
            .filter(|r| r.dedup_fingerprint.as_deref() == Some("burst-identical:firing"))
            .count();
        println!(
            "burst of 1000 identical alerts in {:.2}s: {accepted} accepted, {deduplicated} deduplicated, {created} run(s) created",
            burst.as_secs_f64()
        );
        assert_eq!(
            (accepted, created),
            (1, 1),
            "a burst of identical alerts must create exactly one run"
        );
        engine.wait_idle(Duration::from_secs(60)).await;

        if overload_enabled() {
            overload::run().await;
        }
    });
}
