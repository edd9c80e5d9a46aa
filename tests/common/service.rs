//! Harness for crash tests: the real `vectorstep serve` binary in a scratch folder,
//! killed and restarted on the same store, and fake HTTP peers that count every
//! request and can hold one so that a step is provably in flight when the process
//! dies.
//!
//! Every wait is bounded; a timeout panics with what was last seen. A [`Service`]
//! kills its process when dropped, and prints the tail of the service log when the
//! test is panicking.

// Each test uses a different subset of these helpers.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a service may take to print its address and pass `/readyz`.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a run may take to reach what a test waits for.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);

// ---------------------------------------------------------------------------
// Scratch folder: config.yaml, pipelines/, an empty step library, the database.
// ---------------------------------------------------------------------------

/// A temporary service folder. Removed when dropped.
pub struct Scratch {
    _tmp: tempfile::TempDir,
    pub root: PathBuf,
    /// The store: the SQLite file at [`Scratch::db_path`], or a PostgreSQL
    /// database (`common::backend`).
    pub database: super::backend::Database,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new()
    }
}

impl Scratch {
    /// A folder with `pipelines/`, an empty `steps/` and a `config.yaml` with no
    /// extra settings.
    pub fn new() -> Scratch {
        let tmp = tempfile::Builder::new()
            .prefix("vectorstep-crash-")
            .tempdir()
            .expect("temp dir");
        let database =
            super::backend::Database::new(&tmp.path().join("data").join("vectorstep.db"));
        Scratch::with(tmp, database)
    }

    /// A scratch folder on PostgreSQL whatever `VECTORSTEP_TEST_BACKEND` says, for
    /// the tests of several replicas.
    pub fn on_postgres() -> Scratch {
        let tmp = tempfile::Builder::new()
            .prefix("vectorstep-replica-")
            .tempdir()
            .expect("temp dir");
        let database =
            super::backend::Database::Postgres(super::postgres::Postgres::shared().database());
        Scratch::with(tmp, database)
    }

    /// A scratch folder on the given store.
    pub fn on(database: super::backend::Database) -> Scratch {
        let tmp = tempfile::Builder::new()
            .prefix("vectorstep-replica-")
            .tempdir()
            .expect("temp dir");
        Scratch::with(tmp, database)
    }

    fn with(tmp: tempfile::TempDir, database: super::backend::Database) -> Scratch {
        let root = tmp.path().to_path_buf();
        std::fs::create_dir_all(root.join("pipelines")).unwrap();
        std::fs::create_dir_all(root.join("steps")).unwrap();
        let s = Scratch {
            _tmp: tmp,
            root,
            database,
        };
        s.write_config("");
        s
    }

    pub fn config_path(&self) -> PathBuf {
        self.root.join("config.yaml")
    }

    pub fn db_path(&self) -> PathBuf {
        self.root.join("data").join("vectorstep.db")
    }

    /// Writes `config.yaml`: the fixed keys (server on port 0, absolute folders, the
    /// database, `logging: warn`, dedup off so equal payloads start separate runs)
    /// followed by `extra`, which holds whole top-level keys (`durability`,
    /// `providers`, `agents`, ...).
    pub fn write_config(&self, extra: &str) {
        let text = format!(
            "server: {{host: 127.0.0.1, port: 0}}\n\
             pipeline_config_dir: {pipelines:?}\n\
             step_library_dir: {steps:?}\n\
             {db}\n\
             dedup: {{enabled: false, window_seconds: 300}}\n\
             logging: {{level: warn}}\n\
             {extra}\n",
            pipelines = self.root.join("pipelines").display().to_string(),
            steps = self.root.join("steps").display().to_string(),
            db = self.database.yaml(),
        );
        std::fs::write(self.config_path(), text).unwrap();
    }

    /// Writes `pipelines/<name>.yaml`.
    pub fn write_pipeline(&self, name: &str, yaml: &str) {
        std::fs::write(
            self.root.join("pipelines").join(format!("{name}.yaml")),
            yaml,
        )
        .unwrap();
    }

    /// Opens the store the service uses (only while no service runs on it, or for
    /// reading).
    pub fn open_store(&self) -> vectorstep::store::Store {
        self.database.open()
    }
}

// ---------------------------------------------------------------------------
// The service process.
// ---------------------------------------------------------------------------

/// One `vectorstep serve` process (replaced in place by [`Service::restart`]).
pub struct Service {
    pub port: u16,
    pub child: Child,
    dir: PathBuf,
    log: PathBuf,
    /// 1 for the first process, +1 per restart.
    pub generation: u32,
    /// When each SIGKILL was sent, oldest first.
    pub kills: Vec<Instant>,
    /// When each restart began (the previous process already reaped), oldest
    /// first: anything a peer receives before `starts[k]` was sent by a process
    /// of generation k+1 or earlier.
    pub starts: Vec<Instant>,
    http: reqwest::Client,
    /// Sent on the run routes when the service under test has auth configured.
    pub bearer: Option<String>,
}

impl Service {
    fn authed(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.bearer {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Starts `vectorstep serve` on `dir/config.yaml` and waits until it is ready.
    pub async fn start(dir: &Path) -> Service {
        Service::start_with_env(dir, &[]).await
    }

    /// [`Service::start`] with `env` set for this first process only (a restart
    /// starts without it), e.g. a pause point that the kill must land in.
    pub async fn start_with_env(dir: &Path, env: &[(&str, &str)]) -> Service {
        let log = dir.join("serve.log");
        let (child, port) = spawn(dir, &log, 1, env).await;
        let s = Service {
            port,
            child,
            dir: dir.to_path_buf(),
            log,
            generation: 1,
            kills: Vec::new(),
            starts: Vec::new(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            bearer: None,
        };
        s.wait_ready().await;
        s
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Polls `/readyz` until it answers 200 (the startup sweep has finished).
    pub async fn wait_ready(&self) {
        self.wait_ready_within(START_TIMEOUT).await;
    }

    pub async fn wait_ready_within(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(r) = self.http.get(self.url("/readyz")).send().await {
                if r.status() == reqwest::StatusCode::OK {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "service (generation {}) not ready after {timeout:?}\n{}",
                self.generation,
                self.log_tail()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGKILL, then reap the process.
    pub fn kill9(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            panic!(
                "kill9: the service (generation {}) had already exited\n{}",
                self.generation,
                self.log_tail()
            );
        }
        self.child.kill().expect("SIGKILL");
        self.kills.push(Instant::now());
        self.child.wait().expect("reap");
        note(
            &self.log,
            &format!("---- SIGKILL generation {}", self.generation),
        );
    }

    /// SIGTERM, then wait (bounded) for the process to exit; returns its status.
    pub async fn sigterm(&mut self, timeout: Duration) -> ExitStatus {
        // SAFETY: sends a signal to our own child, which has not been reaped yet.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0, "SIGTERM failed");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                note(
                    &self.log,
                    &format!(
                        "---- SIGTERM generation {} exited: {status}",
                        self.generation
                    ),
                );
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "service did not exit within {timeout:?} of SIGTERM\n{}",
                self.log_tail()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Starts a new process on the same folder and store (the previous one must have
    /// exited) and waits until it is ready.
    pub async fn restart(&mut self) {
        self.restart_within(START_TIMEOUT).await;
    }

    /// [`Service::restart`], but `/readyz` must answer 200 within `ready_within`.
    pub async fn restart_within(&mut self, ready_within: Duration) {
        assert!(
            self.child.try_wait().ok().flatten().is_some(),
            "restart: the previous process is still running; kill it first"
        );
        self.generation += 1;
        self.starts.push(Instant::now());
        let (child, port) = spawn(&self.dir, &self.log, self.generation, &[]).await;
        self.child = child;
        self.port = port;
        self.wait_ready_within(ready_within).await;
    }

    /// `POST /pipelines/{pipeline}/run`; asserts 202 accepted and returns the run id.
    /// Starts a run if the service acknowledges it (202 `accepted`): its id, or what
    /// it answered instead (a 503 while the store cannot write, a refused
    /// connection, ...).
    pub async fn try_post_run(&self, pipeline: &str, body: Value) -> Result<String, String> {
        let resp = self
            .authed(
                self.http
                    .post(self.url(&format!("/pipelines/{pipeline}/run"))),
            )
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let v: Value = resp.json().await.map_err(|e| e.to_string())?;
        match (status.as_u16(), v["run_id"].as_str()) {
            (202, Some(id)) if v["status"] == "accepted" => Ok(id.to_string()),
            _ => Err(format!("{status}: {v}")),
        }
    }

    pub async fn post_run(&self, pipeline: &str, body: Value) -> String {
        let resp = self
            .authed(
                self.http
                    .post(self.url(&format!("/pipelines/{pipeline}/run"))),
            )
            .json(&body)
            .send()
            .await
            .expect("POST run");
        let status = resp.status();
        let v: Value = resp.json().await.expect("JSON answer");
        assert_eq!(status.as_u16(), 202, "POST /pipelines/{pipeline}/run: {v}");
        assert_eq!(v["status"], "accepted", "{v}");
        v["run_id"].as_str().expect("run_id").to_string()
    }

    /// `GET /runs/{id}`.
    pub async fn get_run(&self, id: &str) -> Value {
        let resp = self
            .authed(self.http.get(self.url(&format!("/runs/{id}"))))
            .send()
            .await
            .expect("GET run");
        assert_eq!(resp.status().as_u16(), 200, "GET /runs/{id}");
        resp.json().await.expect("run JSON")
    }

    /// Polls `GET /runs/{id}` until `pred` holds; panics with the last answer after
    /// `timeout`.
    pub async fn wait_until(
        &self,
        id: &str,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let run = self.get_run(id).await;
            if pred(&run) {
                return run;
            }
            if Instant::now() >= deadline {
                panic!(
                    "run {id}: condition not reached within {timeout:?}; last seen:\n{}\n{}",
                    serde_json::to_string_pretty(&run).unwrap(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the run is no longer `running`.
    pub async fn wait_terminal(&self, id: &str) -> Value {
        self.wait_until(id, |r| r["status"] != "running", RUN_TIMEOUT)
            .await
    }

    /// Waits until the run log holds `event`.
    pub async fn wait_event(&self, id: &str, event: &str) -> Value {
        self.wait_until(id, |r| !events(r, event).is_empty(), RUN_TIMEOUT)
            .await
    }

    /// Waits until step `path` has status `status`.
    pub async fn wait_step(&self, id: &str, path: &str, status: &str) -> Value {
        self.wait_until(
            id,
            |r| step_of(r, path).is_some_and(|s| s["status"] == status),
            RUN_TIMEOUT,
        )
        .await
    }

    /// `GET /runs?limit=500`.
    pub async fn list_runs(&self) -> Vec<Value> {
        let v: Value = self
            .authed(self.http.get(self.url("/runs?limit=500")))
            .send()
            .await
            .expect("GET runs")
            .json()
            .await
            .expect("runs JSON");
        v["runs"].as_array().cloned().unwrap_or_default()
    }

    /// The whole service log (stderr of every generation).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the service log (stderr of every generation).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(60);
        format!("---- service log (tail) ----\n{}", lines[from..].join("\n"))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
    }
}

fn note(log: &Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Spawns `serve` with stderr appended to `log`, and reads the bound port from the
/// `vectorstep listening on http://...` line on stdout. `RUST_LOG` passes through.
async fn spawn(dir: &Path, log: &Path, generation: u32, env: &[(&str, &str)]) -> (Child, u16) {
    note(log, &format!("---- start generation {generation}"));
    let stderr = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .expect("open log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .arg("serve")
        .current_dir(dir)
        .env_remove("VECTORSTEP_CONFIG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .spawn()
        .expect("spawn vectorstep serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = tokio::sync::oneshot::channel::<u16>();
    // Reads stdout to the end so the pipe never fills, after handing over the port.
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // Text, or with `logging.format: json` an object with `fields.address`.
            let json: Option<serde_json::Value> = serde_json::from_str(&line).ok();
            let addr = match &json {
                Some(v) => v["fields"]["address"].as_str(),
                None => line.strip_prefix("vectorstep listening on http://"),
            };
            if let Some(addr) = addr {
                if let Some(port) = addr.rsplit(':').next().and_then(|p| p.trim().parse().ok()) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(port);
                    }
                }
            }
        }
    });
    match tokio::time::timeout(START_TIMEOUT, rx).await {
        Ok(Ok(port)) => (child, port),
        other => {
            let _ = child.kill();
            let _ = child.wait();
            let text = std::fs::read_to_string(log).unwrap_or_default();
            panic!(
                "vectorstep serve (generation {generation}) did not print its address ({}):\n{text}",
                if other.is_err() { "timed out" } else { "exited" }
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Reading a run.
// ---------------------------------------------------------------------------

/// The step record with `step_name == path`.
pub fn step_of<'a>(run: &'a Value, path: &str) -> Option<&'a Value> {
    run["steps"]
        .as_array()?
        .iter()
        .find(|s| s["step_name"] == path)
}

/// The step record with `step_name == path`; panics with the run when missing.
pub fn step<'a>(run: &'a Value, path: &str) -> &'a Value {
    step_of(run, path).unwrap_or_else(|| {
        panic!(
            "run has no step `{path}`:\n{}",
            serde_json::to_string_pretty(run).unwrap()
        )
    })
}

/// Every run-log entry named `event`.
pub fn events<'a>(run: &'a Value, event: &str) -> Vec<&'a Value> {
    run["logs"]
        .as_array()
        .map(|l| l.iter().filter(|e| e["event"] == event).collect())
        .unwrap_or_default()
}

/// The one run-log entry named `event`; panics when there is not exactly one.
pub fn event<'a>(run: &'a Value, name: &str) -> &'a Value {
    let found = events(run, name);
    assert_eq!(
        found.len(),
        1,
        "expected exactly one `{name}` event; run log:\n{}",
        serde_json::to_string_pretty(&run["logs"]).unwrap()
    );
    found[0]
}

/// The run-log event names in order (for assertion messages).
pub fn event_names(run: &Value) -> Vec<String> {
    run["logs"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|e| e["event"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}
