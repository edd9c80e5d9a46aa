//! A store that cannot write for a while, a database file that disappears, values the
//! store cannot hold, and the WAL under steady traffic, all against the real
//! `vectorstep serve`. Runs in flight when the store fails must complete once it
//! recovers, without a restart; `/readyz` and intake answer 503 while it cannot write.

mod common;
use common::crash_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crash_support::{event, events, step, Answer, HoldingPeer, Reply, Scratch, Service};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

/// A production pipeline started by name (`POST /pipelines/{name}/run`).
fn pipeline(name: &str, steps: &str) -> String {
    format!(
        "name: {name}\nstage: production\ntrigger: {{match: {{source: generic}}}}\nsteps:\n{steps}"
    )
}

fn webhook_step(name: &str, url: &str) -> String {
    format!(
        "  - name: {name}\n    executor: webhook\n    executor_config: {{url: \"{url}\", timeout_seconds: 120}}\n    prompt_template: '{{\"step\": \"{name}\"}}'\n"
    )
}

fn mock_step(name: &str) -> String {
    format!(
        "  - name: {name}\n    executor: mock\n    executor_config:\n      output: {{confidence: 0.9, summary: \"{name} done\", next_step_context: \"\"}}\n"
    )
}

/// What an HTTP request got back.
struct Got {
    status: u16,
    text: String,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn get(svc: &Service, path: &str) -> Got {
    let resp = client()
        .get(svc.url(path))
        .send()
        .await
        .expect("GET reaches the service");
    Got {
        status: resp.status().as_u16(),
        text: resp.text().await.unwrap_or_default(),
    }
}

async fn post_run(svc: &Service, pipeline: &str, body: Value) -> Got {
    let resp = client()
        .post(svc.url(&format!("/pipelines/{pipeline}/run")))
        .json(&body)
        .send()
        .await
        .expect("POST reaches the service");
    Got {
        status: resp.status().as_u16(),
        text: resp.text().await.unwrap_or_default(),
    }
}

async fn post_alert(svc: &Service, body: &Value) -> Got {
    let resp = client()
        .post(svc.url("/webhook?source=generic"))
        .json(body)
        .send()
        .await
        .expect("POST reaches the service");
    Got {
        status: resp.status().as_u16(),
        text: resp.text().await.unwrap_or_default(),
    }
}

/// Polls `/readyz` until its status is `want`; returns the body.
async fn wait_readyz(svc: &Service, want: u16) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = get(svc, "/readyz").await;
        if got.status == want {
            return got.text;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never answered {want}; last {} {}\n{}",
            got.status,
            got.text,
            svc.log_tail()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// `vectorstep_runs_in_progress` from `/metrics`.
async fn runs_in_progress(svc: &Service) -> f64 {
    let text = get(svc, "/metrics").await.text;
    text.lines()
        .find_map(|l| l.strip_prefix("vectorstep_runs_in_progress "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

/// Asserts a 503 with the error shape and returns its `detail`.
fn assert_refused(got: &Got, what: &str) -> String {
    assert_eq!(got.status, 503, "{what}: {}", got.text);
    let v = got.json();
    assert_eq!(v["error"], "store unavailable", "{what}: {}", got.text);
    v["detail"].as_str().unwrap_or_default().to_string()
}

/// Starts `n` runs of `p` whose first step is held by `peer`, and waits until every
/// one of them is in flight there.
async fn start_held_runs(svc: &Service, peer: &HoldingPeer, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(svc.post_run("p", json!({"n": i})).await);
    }
    peer.wait_for_request(n).await;
    ids
}

/// Waits for every run to finish and asserts each `completed` with both steps done.
async fn assert_all_completed(svc: &Service, ids: &[String]) {
    for id in ids {
        let run = svc.wait_until(id, |r| r["status"] != "running", WAIT).await;
        assert_eq!(run["status"], "completed", "run {id}: {run:#}");
        assert_eq!(step(&run, "first")["status"], "completed", "{run:#}");
        assert_eq!(step(&run, "second")["status"], "completed", "{run:#}");
        assert_eq!(events(&run, "run_finished").len(), 1, "{run:#}");
    }
}

// ---------------------------------------------------------------------------
// A lock held past the busy timeout.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_held_for_12_seconds_delays_runs_but_loses_none() {
    let dir = Scratch::new();
    let peer = HoldingPeer::start(|_| Answer::Hold(Reply::output(0.9, "first done"))).await;
    let steps = [
        webhook_step("first", &format!("{}/first", peer.url())),
        mock_step("second"),
    ]
    .concat();
    dir.write_pipeline("p", &pipeline("p", &steps));
    let svc = Service::start(&dir.root).await;
    let ids = start_held_runs(&svc, &peer, 3).await;

    // Another process takes the write lock and keeps it for 12 s: longer than the
    // store's 5 s busy timeout, so the runs' next commits fail, twice.
    let other = rusqlite::Connection::open(dir.db_path()).expect("open a second connection");
    other
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the lock");
    let locked_at = Instant::now();
    peer.release();

    let why = wait_readyz(&svc, 503).await;
    assert!(why.contains("cannot write"), "/readyz says why: {why}");
    assert!(
        locked_at.elapsed() < Duration::from_secs(12),
        "the outage was seen while the lock was held"
    );
    let detail = assert_refused(&post_run(&svc, "p", json!({"late": true})).await, "intake");
    assert!(detail.contains("cannot write"), "{detail}");
    // The runs wait for the store with their drivers alive: still in progress.
    assert_eq!(runs_in_progress(&svc).await, 3.0);
    for id in &ids {
        assert_eq!(svc.get_run(id).await["status"], "running");
    }

    // The scenario is a lock held for 12 s; the test holds it that long.
    tokio::time::sleep(Duration::from_secs(12).saturating_sub(locked_at.elapsed())).await;
    other.execute_batch("ROLLBACK").expect("release the lock");
    drop(other);

    assert_all_completed(&svc, &ids).await;
    wait_readyz(&svc, 200).await;
    let again = post_run(&svc, "p", json!({"after": true})).await;
    assert_eq!(again.status, 202, "{}", again.text);
    let again = again.json()["run_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_all_completed(&svc, &[again]).await;
    assert_eq!(peer.requests().len(), 4, "each first step ran exactly once");
}

// ---------------------------------------------------------------------------
// A full disk.
// ---------------------------------------------------------------------------

/// A tmpfs mounted on a folder, unmounted when dropped.
struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    fn mount(at: &Path, size_mb: u64) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test needs to mount a tmpfs (it runs as root in CI): mount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs {
            at: at.to_path_buf(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.at)
            .status();
    }
}

/// Writes `path` until the filesystem has no room left.
fn fill(path: &Path) {
    use std::io::Write as _;
    let mut f = std::fs::File::create(path).expect("create the filler");
    for chunk in [1 << 20, 64 << 10, 4 << 10, 512, 1] {
        let buf = vec![0u8; chunk];
        while f.write_all(&buf).is_ok() {}
    }
    let _ = f.sync_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_delays_runs_but_loses_none() {
    let dir = Scratch::new();
    let data = dir.db_path().parent().unwrap().to_path_buf();
    let mount = Tmpfs::mount(&data, 32);
    let peer = HoldingPeer::start(|_| Answer::Hold(Reply::output(0.9, "first done"))).await;
    let steps = [
        webhook_step("first", &format!("{}/first", peer.url())),
        mock_step("second"),
    ]
    .concat();
    dir.write_pipeline("p", &pipeline("p", &steps));
    let svc = Service::start(&dir.root).await;
    let ids = start_held_runs(&svc, &peer, 3).await;

    let filler = data.join("filler");
    fill(&filler);
    peer.release();

    let why = wait_readyz(&svc, 503).await;
    assert!(why.contains("full"), "/readyz names the full disk: {why}");
    let detail = assert_refused(&post_run(&svc, "p", json!({"late": true})).await, "intake");
    assert!(detail.contains("full"), "{detail}");
    assert_eq!(runs_in_progress(&svc).await, 3.0);
    for id in &ids {
        assert_eq!(svc.get_run(id).await["status"], "running");
    }

    std::fs::remove_file(&filler).expect("free the disk");
    assert_all_completed(&svc, &ids).await;
    wait_readyz(&svc, 200).await;
    let again = post_run(&svc, "p", json!({"after": true})).await;
    assert_eq!(again.status, 202, "{}", again.text);
    let again = again.json()["run_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_all_completed(&svc, &[again]).await;
    assert_eq!(peer.requests().len(), 4, "each first step ran exactly once");
    drop(svc);
    drop(mount);
}

#[test]
fn a_start_on_a_full_disk_says_so_and_exits_1() {
    let dir = Scratch::new();
    let data = dir.db_path().parent().unwrap().to_path_buf();
    let mount = Tmpfs::mount(&data, 4);
    dir.write_pipeline("p", &pipeline("p", &mock_step("first")));
    fill(&data.join("filler"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .arg("--config")
        .arg(dir.config_path())
        .arg("serve")
        .env_remove("VECTORSTEP_CONFIG")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run vectorstep serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is full") && stderr.contains("free some space"),
        "the error says the disk is full and what to do: {stderr}"
    );
    drop(mount);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_server_on_a_full_disk_refuses_intake_and_recovers_on_its_own() {
    let dir = Scratch::new();
    let data = dir.db_path().parent().unwrap().to_path_buf();
    let mount = Tmpfs::mount(&data, 32);
    dir.write_pipeline("p", &pipeline("p", &mock_step("first")));
    let svc = Service::start(&dir.root).await;
    let filler = data.join("filler");
    fill(&filler);

    // Nothing has failed yet: the first request finds out, and stores nothing.
    let refused = post_run(&svc, "p", json!({})).await;
    let detail = assert_refused(&refused, "intake on a full disk");
    assert!(detail.contains("full"), "{detail}");
    let why = wait_readyz(&svc, 503).await;
    assert!(why.contains("full"), "{why}");

    // No traffic from here on: only the server's own probe can see the space come back.
    std::fs::remove_file(&filler).expect("free the disk");
    wait_readyz(&svc, 200).await;
    let accepted = post_run(&svc, "p", json!({})).await;
    assert_eq!(accepted.status, 202, "{}", accepted.text);
    let id = accepted.json()["run_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(svc.wait_terminal(&id).await["status"], "completed");
    let runs = svc.list_runs().await;
    assert_eq!(
        runs.len(),
        1,
        "the refused request stored nothing: {runs:#?}"
    );
    drop(svc);
    drop(mount);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_during_an_outage_leaves_the_runs_for_the_next_start() {
    let dir = Scratch::new();
    let peer = HoldingPeer::start(|_| Answer::Hold(Reply::output(0.9, "first done"))).await;
    let steps = [
        webhook_step("first", &format!("{}/first", peer.url())),
        mock_step("second"),
    ]
    .concat();
    dir.write_pipeline(
        "p",
        &pipeline("p", &steps).replace("stage: production\n", "stage: production\ndurable: true\n"),
    );
    let mut svc = Service::start(&dir.root).await;
    let ids = start_held_runs(&svc, &peer, 2).await;
    let other = rusqlite::Connection::open(dir.db_path()).expect("open a second connection");
    other
        .execute_batch("BEGIN IMMEDIATE")
        .expect("take the lock");
    peer.release();
    wait_readyz(&svc, 503).await;

    // The waiting runs give up at once on SIGTERM; nothing is lost, nothing hangs.
    let status = svc.sigterm(Duration::from_secs(40)).await;
    assert!(status.success(), "{status}\n{}", svc.log_tail());
    other.execute_batch("ROLLBACK").expect("release the lock");
    drop(other);

    svc.restart().await;
    assert_all_completed(&svc, &ids).await;
    for id in &ids {
        let run = svc.get_run(id).await;
        assert_eq!(events(&run, "run_resumed").len(), 1, "{run:#}");
    }
}

// ---------------------------------------------------------------------------
// A value the store cannot hold.
// ---------------------------------------------------------------------------

/// A chat completion whose usage claims `tokens` prompt tokens.
fn completion_with_usage(tokens: Value) -> Reply {
    let content = json!({"confidence": 0.95, "summary": "looked into it", "next_step_context": ""});
    Reply::json(
        200,
        json!({
            "id": "chatcmpl-huge",
            "object": "chat.completion",
            "model": "fake-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content.to_string()}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": tokens, "completion_tokens": 1}
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_llm_reporting_2_pow_64_tokens_fails_the_step_and_the_run_follows_on_failure() {
    let dir = Scratch::new();
    let llm = HoldingPeer::answering(completion_with_usage(json!(u64::MAX))).await;
    dir.write_config(&format!(
        "providers:\n  fake: {{base_url: \"{}/v1\", timeout_seconds: 60}}\n\
         agents:\n  triage: {{provider: fake, model: fake-model, system_prompt: \"Answer in JSON.\"}}\n\
         pricing:\n  fake-model: {{input_per_mtok: 3.0, output_per_mtok: 15.0}}\n",
        llm.url()
    ));
    let agent = |on_failure: &str| {
        format!(
            "  - name: triage\n    executor: agent\n    executor_config: {{agent: triage}}\n    prompt_template: \"look\"\n    on_failure: {on_failure}\n"
        )
    };
    dir.write_pipeline(
        "p",
        &pipeline("p", &[agent("continue"), mock_step("after")].concat()),
    );
    dir.write_pipeline(
        "q",
        &pipeline("q", &[agent("abort"), mock_step("after")].concat()),
    );
    let svc = Service::start(&dir.root).await;

    let id = svc.post_run("p", json!({})).await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(
        run["status"], "completed",
        "on_failure: continue goes on: {run:#}"
    );
    let triage = step(&run, "triage");
    assert_eq!(triage["status"], "failed", "{run:#}");
    let error = triage["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("usage.prompt_tokens") && error.contains("18446744073709551615"),
        "the error names the field and the value: {error}"
    );
    assert_eq!(step(&run, "after")["status"], "completed", "{run:#}");
    assert_eq!(
        run["tokens_used"], 0,
        "nothing of the bogus count is kept: {run:#}"
    );
    event(&run, "step_failed_continuing");

    let id = svc.post_run("q", json!({})).await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(
        run["status"], "failed",
        "on_failure: abort ends the run: {run:#}"
    );
    assert!(
        run["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("usage.prompt_tokens"),
        "{run:#}"
    );
    assert!(
        crash_support::step_of(&run, "after").is_none(),
        "nothing runs after an aborting failure: {run:#}"
    );
    assert_eq!(llm.requests().len(), 2);
    wait_readyz(&svc, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_whose_writes_the_store_refuses_ends_failed_with_the_reason() {
    let dir = Scratch::new();
    // A mock usage past what a signed 64-bit total can hold: the store refuses the
    // run's usage total, which no retry can fix.
    let steps = "  - name: first\n    executor: mock\n    executor_config:\n      output: {confidence: 0.9, summary: \"big\", next_step_context: \"\"}\n      usage: {input_tokens: 9223372036854775807, output_tokens: 1}\n";
    dir.write_pipeline("p", &pipeline("p", &[steps, &mock_step("second")].concat()));
    let svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "failed", "{run:#}");
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("The run could not continue:") && reason.contains("SetRunUsage"),
        "the reason says what the store refused: {reason}"
    );
    let finished = event(&run, "run_finished");
    assert_eq!(finished["status"], "failed", "{finished}");
    let deadline = Instant::now() + WAIT;
    while runs_in_progress(&svc).await != 0.0 {
        assert!(Instant::now() < deadline, "the failed run is still counted");
        tokio::time::sleep(POLL).await;
    }
    wait_readyz(&svc, 200).await;
}

// ---------------------------------------------------------------------------
// The database file deleted or replaced.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_database_file_is_noticed_before_the_next_webhook() {
    let dir = Scratch::new();
    dir.write_pipeline("p", &pipeline("p", &mock_step("first")));
    let svc = Service::start(&dir.root).await;
    let alert = json!({"pipeline": "p", "summary": "disk"});
    let first = post_alert(&svc, &alert).await;
    assert_eq!(first.status, 202, "{}", first.text);

    std::fs::remove_file(dir.db_path()).expect("delete the database file");
    let refused = post_alert(&svc, &alert).await;
    let detail = assert_refused(&refused, "webhook after the delete");
    assert!(detail.contains("deleted"), "{detail}");
    let ready = get(&svc, "/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.text);
    assert!(ready.text.contains("deleted"), "{}", ready.text);
    let log = std::fs::read_to_string(dir.root.join("serve.log")).unwrap_or_default();
    let deadline = Instant::now() + WAIT;
    let mut log_says = log.contains("no longer the file this process opened");
    while !log_says {
        assert!(
            Instant::now() < deadline,
            "no error logged\n{}",
            svc.log_tail()
        );
        tokio::time::sleep(POLL).await;
        let log = std::fs::read_to_string(dir.root.join("serve.log")).unwrap_or_default();
        log_says = log.contains("no longer the file this process opened");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replaced_database_file_is_never_written() {
    let dir = Scratch::new();
    dir.write_pipeline("p", &pipeline("p", &mock_step("first")));
    let svc = Service::start(&dir.root).await;
    let first = post_run(&svc, "p", json!({})).await;
    assert_eq!(first.status, 202, "{}", first.text);

    // Another file takes the path (a restore from backup done the wrong way round).
    let other = dir.db_path().with_file_name("other.db");
    std::fs::copy(dir.db_path(), &other).expect("copy");
    std::fs::rename(&other, dir.db_path()).expect("replace the database file");
    let detail = assert_refused(&post_run(&svc, "p", json!({})).await, "intake");
    assert!(detail.contains("different file"), "{detail}");
    let why = wait_readyz(&svc, 503).await;
    assert!(why.contains("different file"), "{why}");
}

// ---------------------------------------------------------------------------
// The WAL under steady traffic.
// ---------------------------------------------------------------------------

fn wal_size(db: &Path) -> u64 {
    let mut p = db.as_os_str().to_os_string();
    p.push("-wal");
    std::fs::metadata(PathBuf::from(p))
        .map(|m| m.len())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_wal_stays_under_its_documented_bound_under_steady_traffic() {
    let dir = Scratch::new();
    dir.write_pipeline(
        "p",
        &pipeline(
            "p",
            &[mock_step("a"), mock_step("b"), mock_step("c")].concat(),
        ),
    );
    let svc = Service::start(&dir.root).await;
    let db = dir.db_path();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));

    // A reader that keeps a snapshot open most of the time (a dashboard, the CLI):
    // without help, passive checkpoints can then never finish and the WAL only grows.
    let reader = {
        let (db, stop) = (db.clone(), stop.clone());
        std::thread::spawn(move || {
            let conn = rusqlite::Connection::open_with_flags(
                &db,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .expect("open a reader");
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                conn.execute_batch("BEGIN").unwrap();
                let _: i64 = conn
                    .query_row("SELECT count(*) FROM pipeline_runs", [], |r| r.get(0))
                    .unwrap();
                std::thread::sleep(Duration::from_millis(400));
                conn.execute_batch("COMMIT").unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    // The -wal file's size, sampled while the traffic runs.
    let sampler = {
        let (db, stop) = (db.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut sizes = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                sizes.push(wal_size(&db));
                std::thread::sleep(Duration::from_millis(10));
            }
            sizes
        })
    };

    // Steady traffic: a few senders, one request at a time each.
    const SENDERS: usize = 4;
    const PER_SENDER: usize = 2_000;
    let mut tasks = Vec::new();
    for s in 0..SENDERS {
        let url = svc.url("/pipelines/p/run");
        tasks.push(tokio::spawn(async move {
            let http = client();
            let payload = "x".repeat(2_000);
            for i in 0..PER_SENDER {
                let resp = http
                    .post(&url)
                    .json(&json!({"sender": s, "i": i, "payload": payload}))
                    .send()
                    .await
                    .expect("POST");
                assert_eq!(resp.status().as_u16(), 202);
            }
        }));
    }
    for t in tasks {
        t.await.expect("sender");
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    reader.join().expect("reader");
    let sizes = sampler.join().expect("sampler");

    let max = sizes.iter().copied().max().unwrap_or(0);
    let bound = vectorstep::store::WAL_BOUND_BYTES;
    assert!(
        max <= bound,
        "the WAL reached {max} bytes, over the documented {bound}\n{}",
        svc.log_tail()
    );
    // The traffic was enough for the WAL to start over (and be cut back) at least
    // once, so the bound was exercised rather than never approached.
    let cut_back = sizes.windows(2).filter(|w| w[1] < w[0]).count();
    eprintln!(
        "WAL max {max}, cut back {cut_back} times, {} samples",
        sizes.len()
    );
    assert!(
        cut_back >= 1,
        "the WAL never shrank (max {max} bytes over {} samples): not enough traffic to test the bound",
        sizes.len()
    );
}
