//! Outbound connections per peer are bounded: 2,000 runs in flight at once, each a
//! webhook step to the same local peer, never hold more sockets to it than
//! `concurrency.max_connections_per_host`. The peer is a bare HTTP/1.1 server on
//! 127.0.0.1 that counts the connections open at any moment.

mod common;
use common::service_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use service_support::Intake;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

#[derive(Default)]
struct Counts {
    open: AtomicUsize,
    max_open: AtomicUsize,
    accepted: AtomicUsize,
    requests: AtomicUsize,
}

/// A keep-alive HTTP/1.1 peer that answers every request after `delay`.
async fn counting_peer(delay: Duration) -> (String, Arc<Counts>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let counts = Arc::new(Counts::default());
    let c = counts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let c = c.clone();
            c.accepted.fetch_add(1, Ordering::SeqCst);
            let now = c.open.fetch_add(1, Ordering::SeqCst) + 1;
            c.max_open.fetch_max(now, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut s = BufReader::new(stream);
                'requests: loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match s.read_line(&mut line).await {
                            Ok(0) | Err(_) => break 'requests,
                            Ok(_) => {}
                        }
                        let h = line.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            if k.eq_ignore_ascii_case("content-length") {
                                length = v.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0u8; length];
                    if s.read_exact(&mut body).await.is_err() {
                        break;
                    }
                    c.requests.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(delay).await;
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                    if s.get_mut().write_all(answer).await.is_err() {
                        break;
                    }
                }
                c.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (url, counts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_runs_hold_no_more_sockets_to_a_peer_than_the_bound() {
    const RUNS: usize = 2_000;
    const BOUND: usize = 16;
    let (peer, counts) = counting_peer(Duration::from_millis(20)).await;
    let pipeline = format!(
        "name: hook\nstage: production\ntrigger: {{match: {{}}}}\nsteps:\n\
         \x20 - name: call\n    executor: webhook\n    executor_config: {{url: \"{peer}/hook\", timeout_seconds: 120}}\n\
         \x20   prompt_template: '{{\"run\": \"{{{{ run_id }}}}\"}}'\n"
    );
    let s = Intake::start(
        "",
        &format!("concurrency: {{max_runs: 5000, max_connections_per_host: {BOUND}}}\ndedup: {{enabled: false}}\n"),
        &[("hook", pipeline)],
    )
    .await;
    // Start every run before the first can finish: 50 client tasks, 40 runs each.
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..50 {
        let (http, url) = (s.http.clone(), s.url("/pipelines/hook/run"));
        tasks.push(tokio::spawn(async move {
            for i in 0..RUNS / 50 {
                let r = http
                    .post(&url)
                    .json(&json!({"idempotency_key": format!("{t}-{i}")}))
                    .send()
                    .await
                    .expect("POST run");
                assert_eq!(r.status().as_u16(), 202);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Every run's request reaches the peer, BOUND at a time.
    let deadline = Instant::now() + Duration::from_secs(120);
    while counts.requests.load(Ordering::SeqCst) < RUNS {
        assert!(
            Instant::now() < deadline,
            "only {} of {RUNS} requests arrived\n{}",
            counts.requests.load(Ordering::SeqCst),
            s.svc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let max_open = counts.max_open.load(Ordering::SeqCst);
    let accepted = counts.accepted.load(Ordering::SeqCst);
    println!(
        "{RUNS} runs in {:?}: at most {max_open} sockets open at once, {accepted} accepted in all",
        started.elapsed()
    );
    assert!(
        max_open <= BOUND,
        "{max_open} sockets open at once, bound {BOUND}"
    );
    assert!(
        max_open >= 2,
        "the runs did call the peer concurrently ({max_open})"
    );
    assert_eq!(
        counts.requests.load(Ordering::SeqCst),
        RUNS,
        "each run called once"
    );
}
