//! One owner per store and per run, with the real binaries: a second `serve` on a
//! store refuses to start; a run of `vectorstep run` is left alone by `serve` while
//! that process lives and adopted once it is killed with SIGKILL; Ctrl-C (SIGINT)
//! cancels a CLI run for good. Also: `fingerprint FILE` and `run FILE` load that file,
//! not its siblings. Fake peers count every request, so "exactly once" and "never"
//! are assertions.

mod common;
use common::crash_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crash_support::{
    event, event_names, events, step, Answer, HoldingPeer, Reply, Scratch, Service,
};
use serde_json::Value;

const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);

/// A webhook step posting to `<base>/<name>`.
fn webhook(name: &str, base: &str) -> String {
    format!(
        "  - name: {name}\n    executor: webhook\n    executor_config: {{url: \"{base}/{name}\", timeout_seconds: 60}}\n    prompt_template: '{{\"step\": \"{name}\"}}'\n"
    )
}

/// A durable production pipeline `p` of webhook steps `a`, `b`, `c`.
fn durable_abc(base: &str) -> String {
    format!(
        "name: p\nstage: production\ndurable: true\ntrigger: {{match: {{source: generic}}}}\nsteps:\n{}{}{}",
        webhook("a", base),
        webhook("b", base),
        webhook("c", base)
    )
}

/// A peer answering everything except the first request to `/b`, which it holds
/// until released (or forever with `Answer::Never`).
async fn peer_holding_b(hold: fn() -> Answer) -> HoldingPeer {
    HoldingPeer::start(move |r| {
        if r.path == "/b" && r.seq_path == 0 {
            hold()
        } else {
            Answer::Reply(Reply::ok())
        }
    })
    .await
}

fn bin(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vectorstep"));
    c.arg("--config")
        .arg(dir.join("config.yaml"))
        .current_dir(dir)
        .env_remove("VECTORSTEP_CONFIG")
        .stdin(Stdio::null());
    c
}

/// `vectorstep run p` in the background, its output going to files in `dir`.
struct CliRun {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl CliRun {
    fn start(dir: &Path, pipeline: &str) -> CliRun {
        let stdout = dir.join("cli.out");
        let stderr = dir.join("cli.err");
        let child = bin(dir)
            .args(["run", pipeline])
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn vectorstep run");
        CliRun {
            child,
            stdout,
            stderr,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn output(&self) -> String {
        format!(
            "---- cli stdout ----\n{}\n---- cli stderr ----\n{}",
            std::fs::read_to_string(&self.stdout).unwrap_or_default(),
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: a signal to our own child, which has not been reaped yet.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({sig}) failed");
    }

    fn kill9(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the CLI run had already exited\n{}",
            self.output()
        );
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// Waits (bounded) for the process to exit.
    async fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the CLI run did not exit within {EXIT_TIMEOUT:?}\n{}",
                self.output()
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for CliRun {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.output());
        }
    }
}

/// A one-shot command, bounded.
fn oneshot(dir: &Path, args: &[&str]) -> Output {
    bin(dir).args(args).output().expect("run vectorstep")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The only run in the store, read through `serve`.
async fn the_run(svc: &Service) -> Value {
    let runs = svc.list_runs().await;
    assert_eq!(runs.len(), 1, "expected one run: {runs:?}");
    let id = runs[0]["run_id"]
        .as_str()
        .or_else(|| runs[0]["id"].as_str())
        .expect("run id")
        .to_string();
    svc.get_run(&id).await
}

fn run_id(run: &Value) -> String {
    run["run_id"]
        .as_str()
        .or_else(|| run["id"].as_str())
        .expect("run id")
        .to_string()
}

/// Lock files left under `<database>.runs/`.
fn owner_locks(dir: &Scratch) -> Vec<PathBuf> {
    let mut folder = dir.db_path().into_os_string();
    folder.push(".runs");
    std::fs::read_dir(PathBuf::from(folder))
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

/// Long enough for `serve`'s periodic owner check to have run twice: the only way
/// to see that something does *not* happen.
const TWO_OWNER_CHECKS: Duration = Duration::from_millis(
    2 * vectorstep::runner::sweep::OWNER_CHECK_INTERVAL.as_millis() as u64 + 1000,
);

// ---------------------------------------------------------------------------
// One serve per store.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_serve_on_the_store_exits_at_once_naming_the_pid_and_changes_nothing() {
    let dir = Scratch::new();
    let peer = peer_holding_b(|| Answer::Never).await;
    dir.write_pipeline("p", &durable_abc(&peer.url()));
    let svc = Service::start(&dir.root).await;
    let id = svc
        .post_run("p", serde_json::json!({"event": "second-serve"}))
        .await;
    peer.wait_for_path("/b", 1).await;
    let before = svc.get_run(&id).await;

    let second = oneshot(&dir.root, &["serve"]);
    let (out, err) = (text(&second.stdout), text(&second.stderr));
    assert_eq!(
        second.status.code(),
        Some(1),
        "stdout:\n{out}\nstderr:\n{err}"
    );
    assert!(
        err.contains(&format!("pid {}", svc.pid())),
        "the message names the pid holding the lock:\n{err}"
    );
    let mut lock = dir.db_path().into_os_string();
    lock.push(".lock");
    let lock = PathBuf::from(lock);
    assert!(
        err.contains(&lock.display().to_string()),
        "the message names the lock file:\n{err}"
    );
    assert!(!out.contains("listening"), "it never bound HTTP:\n{out}");

    // Nothing changed: the first serve's run is as it was, still driven by it.
    let after = svc.get_run(&id).await;
    assert_eq!(before["logs"], after["logs"], "the run log is unchanged");
    assert_eq!(after["status"], "running");
    assert_eq!(peer.count(), 2, "a once, b once (held)");
    let text = std::fs::read_to_string(&lock).unwrap();
    assert_eq!(
        text.trim(),
        svc.pid().to_string(),
        "the lock still names the first serve"
    );
    // Read commands keep working beside the server.
    let list = oneshot(&dir.root, &["runs", "list"]);
    assert_eq!(
        list.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    assert!(String::from_utf8_lossy(&list.stdout).contains(&id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_serve_leaves_no_lock_behind_and_the_next_one_starts() {
    let dir = Scratch::new();
    let mut svc = Service::start(&dir.root).await;
    let mut lock = dir.db_path().into_os_string();
    lock.push(".lock");
    let lock = PathBuf::from(lock);
    assert!(lock.exists(), "serve holds {}", lock.display());
    let status = svc.sigterm(EXIT_TIMEOUT).await;
    assert!(status.success(), "{status}");
    assert!(!lock.exists(), "the lock file is removed on exit");
    svc.restart().await;
}

// ---------------------------------------------------------------------------
// CLI runs belong to their process.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_leaves_a_live_cli_run_alone_and_adopts_it_once_the_cli_is_killed() {
    let dir = Scratch::new();
    let peer = peer_holding_b(|| Answer::Never).await;
    dir.write_pipeline("p", &durable_abc(&peer.url()));
    let mut cli = CliRun::start(&dir.root, "p");
    peer.wait_for_path("/b", 1).await;

    // serve starts while the CLI is mid-step: the start-up sweep leaves the run be.
    let svc = Service::start(&dir.root).await;
    let run = the_run(&svc).await;
    let id = run_id(&run);
    assert_eq!(run["status"], "running");
    let dry = oneshot(&dir.root, &["sweep", "--dry-run"]);
    let dry_out = text(&dry.stdout);
    assert!(
        dry_out.contains("left alone") && dry_out.contains(&format!("pid {}", cli.pid())),
        "sweep --dry-run names the live owner:\n{dry_out}\n{}",
        text(&dry.stderr)
    );
    // ... and so do the periodic checks while the CLI lives.
    tokio::time::sleep(TWO_OWNER_CHECKS).await;
    let run = svc.get_run(&id).await;
    assert!(
        events(&run, "run_resumed").is_empty() && events(&run, "run_interrupted").is_empty(),
        "serve touched a run whose owner lives: {:?}",
        event_names(&run)
    );
    assert_eq!(peer.count_path("/a"), 1);
    assert_eq!(
        peer.count_path("/b"),
        1,
        "b requested exactly once while the CLI lives"
    );
    assert_eq!(peer.count_path("/c"), 0);
    assert_eq!(owner_locks(&dir).len(), 1, "the CLI holds one owner lock");

    // The owner dies without ending its run: serve adopts it (durable: resumed).
    cli.kill9();
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    let resumed = event(&run, "run_resumed");
    assert_eq!(resumed["steps_skipped"], 1, "{resumed}");
    assert_eq!(resumed["in_flight"], serde_json::json!(["b"]), "{resumed}");
    assert_eq!(run["resume_count"], 1);
    assert_eq!(
        peer.count_path("/a"),
        1,
        "a, completed by the CLI, is not re-run"
    );
    let b = peer.for_path("/b");
    assert_eq!(b.len(), 2, "b: once by the CLI, once after the adoption");
    assert_eq!(b[0].key(), b[1].key(), "same idempotency key");
    assert_eq!((b[0].attempt(), b[1].attempt()), (1, 2));
    assert_eq!(peer.count_path("/c"), 1);
    assert_eq!(step(&run, "b")["attempts"], 2);
    assert!(
        owner_locks(&dir).is_empty(),
        "the dead owner's lock file is removed: {:?}",
        owner_locks(&dir)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cli_run_killed_before_serve_starts_is_adopted_by_the_start_up_sweep() {
    let dir = Scratch::new();
    let peer = peer_holding_b(|| Answer::Never).await;
    dir.write_pipeline("p", &durable_abc(&peer.url()));
    let mut cli = CliRun::start(&dir.root, "p");
    peer.wait_for_path("/b", 1).await;
    cli.kill9();
    let dry = oneshot(&dir.root, &["sweep", "--dry-run"]);
    let dry_out = text(&dry.stdout);
    assert!(
        dry_out.contains("adopt") && dry_out.contains("resume"),
        "sweep --dry-run says the run is adopted and resumed:\n{dry_out}"
    );
    assert_eq!(owner_locks(&dir).len(), 1, "the dry run removed nothing");

    let svc = Service::start(&dir.root).await;
    let id = run_id(&the_run(&svc).await);
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(events(&run, "run_resumed").len(), 1);
    assert_eq!(
        (
            peer.count_path("/a"),
            peer.count_path("/b"),
            peer.count_path("/c")
        ),
        (1, 2, 1)
    );
    assert!(owner_locks(&dir).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigint_cancels_a_cli_run_at_the_step_boundary_and_serve_never_resumes_it() {
    let dir = Scratch::new();
    let peer = peer_holding_b(|| Answer::Hold(Reply::ok())).await;
    dir.write_pipeline("p", &durable_abc(&peer.url()));
    let mut cli = CliRun::start(&dir.root, "p");
    peer.wait_for_path("/b", 1).await;
    cli.signal(libc::SIGINT);
    // The step in flight finishes within the grace period; nothing after it starts.
    let deadline = Instant::now() + EXIT_TIMEOUT;
    while !std::fs::read_to_string(&cli.stderr)
        .unwrap_or_default()
        .contains("cancelling run")
    {
        assert!(
            Instant::now() < deadline,
            "no cancel notice\n{}",
            cli.output()
        );
        tokio::time::sleep(POLL).await;
    }
    peer.release();
    let status = cli.wait().await;
    assert_eq!(
        status.code(),
        Some(2),
        "a cancelled run exits 2\n{}",
        cli.output()
    );
    assert!(
        cli.output().contains("finished: cancelled"),
        "{}",
        cli.output()
    );
    assert!(owner_locks(&dir).is_empty(), "the CLI removed its lock");

    let svc = Service::start(&dir.root).await;
    let run = the_run(&svc).await;
    assert_eq!(run["status"], "cancelled", "{:?}", event_names(&run));
    event(&run, "run_cancelled");
    assert_eq!(step(&run, "b")["status"], "completed");
    tokio::time::sleep(TWO_OWNER_CHECKS).await;
    let run = svc.get_run(&run_id(&run)).await;
    assert!(
        events(&run, "run_resumed").is_empty(),
        "{:?}",
        event_names(&run)
    );
    assert_eq!(
        (
            peer.count_path("/a"),
            peer.count_path("/b"),
            peer.count_path("/c")
        ),
        (1, 1, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigint_with_a_step_that_never_answers_cancels_after_the_grace_and_serve_never_resumes_it()
{
    let dir = Scratch::new();
    dir.write_config("durability: {shutdown_grace_seconds: 1}");
    let peer = peer_holding_b(|| Answer::Never).await;
    dir.write_pipeline("p", &durable_abc(&peer.url()));
    let mut cli = CliRun::start(&dir.root, "p");
    peer.wait_for_path("/b", 1).await;
    cli.signal(libc::SIGINT);
    let status = cli.wait().await;
    assert_eq!(status.code(), Some(2), "{}", cli.output());
    assert!(owner_locks(&dir).is_empty(), "the CLI removed its lock");

    let svc = Service::start(&dir.root).await;
    let run = the_run(&svc).await;
    assert_eq!(run["status"], "cancelled", "{:?}", event_names(&run));
    let cancelled = event(&run, "run_cancelled");
    assert_eq!(cancelled["signal"], "SIGINT", "{cancelled}");
    assert_eq!(
        cancelled["in_flight"],
        serde_json::json!(["b"]),
        "{cancelled}"
    );
    assert_eq!(step(&run, "b")["status"], "failed");
    tokio::time::sleep(TWO_OWNER_CHECKS).await;
    let run = svc.get_run(&run_id(&run)).await;
    assert!(
        events(&run, "run_resumed").is_empty(),
        "{:?}",
        event_names(&run)
    );
    assert_eq!(
        (
            peer.count_path("/a"),
            peer.count_path("/b"),
            peer.count_path("/c")
        ),
        (1, 1, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sub_pipeline_runs_of_a_cli_run_are_its_own_and_are_adopted_with_it() {
    let dir = Scratch::new();
    let peer = HoldingPeer::start(|r| {
        if r.path == "/x" && r.seq_path == 0 {
            Answer::Never
        } else {
            Answer::Reply(Reply::ok())
        }
    })
    .await;
    let base = peer.url();
    dir.write_pipeline(
        "child",
        &format!(
            "name: child\nstage: production\ndurable: true\ntrigger: {{}}\nsteps:\n{}{}",
            webhook("x", &base),
            webhook("y", &base)
        ),
    );
    dir.write_pipeline(
        "parent",
        &format!(
            "name: parent\nstage: production\ndurable: true\ntrigger: {{match: {{source: generic}}}}\nsteps:\n{}  - name: sub\n    executor: pipeline\n    executor_config: {{pipeline: child}}\n{}",
            webhook("a", &base),
            webhook("c", &base)
        ),
    );
    let mut cli = CliRun::start(&dir.root, "parent");
    peer.wait_for_path("/x", 1).await;
    let svc = Service::start(&dir.root).await;
    tokio::time::sleep(TWO_OWNER_CHECKS).await;
    let runs = svc.list_runs().await;
    assert_eq!(runs.len(), 2, "parent and child: {runs:#?}");
    for r in &runs {
        let run = svc.get_run(&run_id(r)).await;
        assert_eq!(run["status"], "running");
        assert!(
            events(&run, "run_resumed").is_empty(),
            "{} was touched: {:?}",
            run["pipeline_name"],
            event_names(&run)
        );
    }
    assert_eq!(peer.count_path("/x"), 1);

    cli.kill9();
    let parent = runs
        .iter()
        .find(|r| r["pipeline_name"] == "parent")
        .expect("parent");
    let run = svc.wait_terminal(&run_id(parent)).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    for (path, n) in [("/a", 1), ("/x", 2), ("/y", 1), ("/c", 1)] {
        assert_eq!(peer.count_path(path), n, "{path}");
    }
    let child = runs
        .iter()
        .find(|r| r["pipeline_name"] == "child")
        .expect("child");
    let child = svc.get_run(&run_id(child)).await;
    assert_eq!(child["status"], "completed");
    assert_eq!(
        events(&child, "run_resumed").len(),
        1,
        "{:?}",
        event_names(&child)
    );
    assert_eq!(step(&run, "sub")["output"]["sub_run_id"], child["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_sigint_stops_at_once_and_sigterm_cancels_too() {
    // A grace far longer than the test waits: only the second signal ends it in time.
    let dir = Scratch::new();
    dir.write_config("durability: {shutdown_grace_seconds: 600}");
    let peer = peer_holding_b(|| Answer::Never).await;
    dir.write_pipeline("p", &durable_abc(&peer.url()));
    let mut cli = CliRun::start(&dir.root, "p");
    peer.wait_for_path("/b", 1).await;
    cli.signal(libc::SIGTERM);
    let deadline = Instant::now() + EXIT_TIMEOUT;
    while !std::fs::read_to_string(&cli.stderr)
        .unwrap_or_default()
        .contains("cancelling run")
    {
        assert!(
            Instant::now() < deadline,
            "no cancel notice\n{}",
            cli.output()
        );
        tokio::time::sleep(POLL).await;
    }
    cli.signal(libc::SIGINT);
    let status = cli.wait().await;
    assert_eq!(status.code(), Some(2), "{}", cli.output());

    let svc = Service::start(&dir.root).await;
    let run = the_run(&svc).await;
    assert_eq!(run["status"], "cancelled", "{:?}", event_names(&run));
    assert_eq!(event(&run, "run_cancelled")["signal"], "SIGTERM");
    assert_eq!(run["reason"], "cancelled by SIGTERM");
    assert_eq!(
        (
            peer.count_path("/a"),
            peer.count_path("/b"),
            peer.count_path("/c")
        ),
        (1, 1, 0)
    );
}

// ---------------------------------------------------------------------------
// FILE loads only that file.
// ---------------------------------------------------------------------------

const CHILD: &str = "name: child\ntrigger: {}\nsteps:\n  - name: inner\n    executor: mock\n";

fn main_pipeline(extra_step: &str) -> String {
    format!(
        "name: main\ntrigger: {{}}\nsteps:\n  - name: call\n    executor: pipeline\n    executor_config: {{pipeline: child}}\n  - name: {extra_step}\n    executor: mock\n"
    )
}

#[test]
fn fingerprint_and_run_of_a_file_ignore_a_sibling_with_the_same_name() {
    let dir = Scratch::new();
    dir.write_pipeline("child", CHILD);
    // In the pipeline folder: `main` and a draft of it under the same name.
    dir.write_pipeline("main", &main_pipeline("after"));
    dir.write_pipeline("main-draft", &main_pipeline("draft_step"));
    // A half-written file that no run FILE here needs.
    dir.write_pipeline("wip", "name: wip\nsteps: [unclosed\n");
    // Outside it: another file with a draft beside it.
    let elsewhere = dir.root.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("main.yaml"), main_pipeline("after")).unwrap();
    std::fs::write(elsewhere.join("main-copy.yaml"), main_pipeline("other")).unwrap();
    std::fs::write(elsewhere.join("broken.yaml"), "name: [unclosed\n").unwrap();

    let fp = |file: &Path| {
        let o = oneshot(&dir.root, &["fingerprint", &file.display().to_string()]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "fingerprint {}: {}",
            file.display(),
            text(&o.stderr)
        );
        text(&o.stdout).trim().to_string()
    };
    let main = fp(&dir.root.join("pipelines/main.yaml"));
    let draft = fp(&dir.root.join("pipelines/main-draft.yaml"));
    assert_eq!(main.len(), 64, "{main}");
    assert_ne!(main, draft, "each file's own pipeline is fingerprinted");
    assert_eq!(
        fp(&elsewhere.join("main.yaml")),
        main,
        "same steps, same fingerprint"
    );
    assert_ne!(fp(&elsewhere.join("main-copy.yaml")), main);

    for file in [
        dir.root.join("pipelines/main.yaml"),
        elsewhere.join("main.yaml"),
    ] {
        let o = oneshot(&dir.root, &["run", &file.display().to_string(), "--json"]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "run {}: {}",
            file.display(),
            text(&o.stderr)
        );
        let run: Value = serde_json::from_slice(&o.stdout).expect("run JSON");
        assert_eq!(run["status"], "completed", "{run}");
        assert_eq!(run["pipeline_name"], "main", "{run}");
        // The sub-pipeline came from the configured folder and ran.
        let call = step(&run, "call");
        assert_eq!(call["status"], "completed", "{call}");
        assert!(step(&run, "after")["status"] == "completed", "{run}");
    }
}

#[test]
fn a_file_naming_an_unknown_sub_pipeline_says_so() {
    let dir = Scratch::new();
    let file = dir.root.join("lonely.yaml");
    std::fs::write(&file, main_pipeline("after").replace("child", "nowhere")).unwrap();
    let o = oneshot(&dir.root, &["fingerprint", &file.display().to_string()]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(err.contains("unknown pipeline `nowhere`"), "{err}");
}

#[test]
fn a_file_whose_sub_pipeline_is_invalid_reports_the_sub_pipeline_file() {
    let dir = Scratch::new();
    dir.write_pipeline(
        "child",
        "name: child\ntrigger: {}\nsteps:\n  - name: inner\n    executor: no_such_executor\n",
    );
    let file = dir.root.join("main.yaml");
    std::fs::write(&file, main_pipeline("after")).unwrap();
    let o = oneshot(&dir.root, &["fingerprint", &file.display().to_string()]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("child.yaml"),
        "the error points at the child's file:\n{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_through_serve_reaches_the_cli_that_drives_the_run() {
    let dir = Scratch::new();
    let peer = peer_holding_b(|| Answer::Hold(Reply::ok())).await;
    dir.write_pipeline("p", &durable_abc(&peer.url()));
    let mut cli = CliRun::start(&dir.root, "p");
    peer.wait_for_path("/b", 1).await;
    let svc = Service::start(&dir.root).await;
    let run = the_run(&svc).await;
    let id = run_id(&run);
    let answer = reqwest::Client::new()
        .post(svc.url(&format!("/runs/{id}/cancel")))
        .header("content-type", "application/json")
        .body(r#"{"by": "carol"}"#)
        .send()
        .await
        .expect("POST cancel");
    assert_eq!(answer.status().as_u16(), 200);
    // The CLI notices within its next poll; the step in flight finishes, c never starts.
    let deadline = Instant::now() + EXIT_TIMEOUT;
    while !std::fs::read_to_string(&cli.stderr)
        .unwrap_or_default()
        .contains("cancel requested through the server")
    {
        assert!(
            Instant::now() < deadline,
            "the CLI never saw the cancel\n{}",
            cli.output()
        );
        tokio::time::sleep(POLL).await;
    }
    peer.release();
    let status = cli.wait().await;
    assert_eq!(status.code(), Some(2), "{}", cli.output());
    let run = svc.get_run(&id).await;
    assert_eq!(run["status"], "cancelled", "{:?}", event_names(&run));
    assert_eq!(event(&run, "run_cancelled")["by"], "carol", "{run:#}");
    assert_eq!(
        (
            peer.count_path("/a"),
            peer.count_path("/b"),
            peer.count_path("/c")
        ),
        (1, 1, 0)
    );
}
