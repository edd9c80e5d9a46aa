//! Reloading pipelines while serving, through the real server: SIGHUP (the
//! signal systemd's `ExecReload` sends) and `POST /-/reload`. A new pipeline file
//! becomes runnable without a restart; a folder with errors keeps the old set and
//! keeps serving; a run parked before a reload finishes on the definition it
//! started with.

mod common;
use common::crash_support;

use std::time::{Duration, Instant};

use crash_support::{step_of, Scratch, Service};
use serde_json::{json, Value};

const FIRST: &str = "name: first\ntrigger: {match: {source: generic}}\nstage: production\nsteps:\n  - {name: a, executor: mock}\n";
const SECOND: &str = "name: second\ntrigger: {match: {source: generic}}\nstage: production\nsteps:\n  - {name: b, executor: mock}\n";
/// An unknown key: an error at load.
const BROKEN: &str = "name: broken\ntrigger: {match: {source: generic}}\nstage: production\nsteps:\n  - {name: c, executor: mock, retyr: 3}\n";

/// A pipeline that waits for a human, then runs `then`.
fn gate(then: &str) -> String {
    format!(
        "name: gate\nstage: production\ndurable: true\ntrigger: {{match: {{source: generic}}}}\nsteps:\n\
         \x20 - {{name: approve, executor: human, timeout_seconds: 300, prompt_template: \"Go on?\"}}\n\
         \x20 - {{name: {then}, executor: mock}}\n"
    )
}

fn sighup(svc: &Service) {
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &svc.pid().to_string()])
        .status()
        .expect("kill -HUP")
        .success();
    assert!(ok, "kill -HUP {} failed", svc.pid());
}

async fn post_reload(svc: &Service) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(svc.url("/-/reload"))
        .send()
        .await
        .expect("POST /-/reload");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("JSON answer"))
}

/// Waits until `pipeline` takes runs (it is loaded), or fails after 15 s.
async fn wait_runnable(svc: &Service, pipeline: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match svc.try_post_run(pipeline, json!({})).await {
            Ok(id) => return id,
            Err(answer) if Instant::now() > deadline => {
                panic!(
                    "`{pipeline}` never became runnable: {answer}\n{}",
                    svc.log_tail()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn wait_log(svc: &Service, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !svc.log_text().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "the log never said `{needle}`:\n{}",
            svc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn still_running(svc: &mut Service) {
    assert!(
        svc.child.try_wait().expect("try_wait").is_none(),
        "the service exited:\n{}",
        svc.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_a_new_pipeline_makes_it_runnable_without_a_restart() {
    let s = Scratch::new();
    s.write_pipeline("first", FIRST);
    let mut svc = Service::start(&s.root).await;
    let pid = svc.pid();
    let before = svc.try_post_run("second", json!({})).await;
    assert!(
        before.as_ref().is_err_and(|e| e.starts_with("404")),
        "an unknown pipeline is 404: {before:?}"
    );

    s.write_pipeline("second", SECOND);
    sighup(&svc);
    let run = wait_runnable(&svc, "second").await;
    let done = svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(step_of(&done, "b").is_some(), "{done}");
    still_running(&mut svc);
    assert_eq!(svc.pid(), pid, "the same process serves");
    // The old set's pipeline is still there.
    let old = svc.post_run("first", json!({})).await;
    assert_eq!(svc.wait_terminal(&old).await["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_folder_keeps_the_old_set_and_serving() {
    let s = Scratch::new();
    s.write_pipeline("first", FIRST);
    let mut svc = Service::start(&s.root).await;

    // SIGHUP with a broken file next to a good new one: nothing changes.
    s.write_pipeline("second", SECOND);
    s.write_pipeline("broken", BROKEN);
    sighup(&svc);
    wait_log(&svc, "Reload refused").await;
    let log = svc.log_text();
    assert!(
        log.contains("broken.yaml:5:") && log.contains("retyr"),
        "every diagnostic is logged, at its file and line:\n{log}"
    );
    still_running(&mut svc);
    let second = svc.try_post_run("second", json!({})).await;
    assert!(
        second.as_ref().is_err_and(|e| e.starts_with("404")),
        "a refused reload loads nothing: {second:?}"
    );
    let first = svc.post_run("first", json!({})).await;
    assert_eq!(svc.wait_terminal(&first).await["status"], "completed");
    let ready = reqwest::get(svc.url("/readyz")).await.expect("GET /readyz");
    assert_eq!(ready.status().as_u16(), 200);

    // The API says why, with every diagnostic.
    let (status, body) = post_reload(&svc).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"], "invalid pipelines", "{body}");
    let detail = body["detail"].as_array().expect("detail is a list");
    assert!(
        detail.iter().any(|d| d["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("broken.yaml"))
            && d["line"] == 5
            && d["severity"] == "error"
            && d["message"].as_str().is_some_and(|m| m.contains("retyr"))),
        "{body}"
    );

    // Fixed: the next reload takes the whole folder.
    std::fs::remove_file(s.root.join("pipelines").join("broken.yaml")).unwrap();
    let (status, body) = post_reload(&svc).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "reloaded", "{body}");
    assert_eq!(body["added"], json!(["second"]), "{body}");
    assert_eq!(body["pipelines"], 2, "{body}");
    let run = svc.post_run("second", json!({})).await;
    assert_eq!(svc.wait_terminal(&run).await["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_parked_before_a_reload_finishes_on_its_own_definition() {
    let s = Scratch::new();
    s.write_pipeline("gate", &gate("old_after"));
    let svc = Service::start(&s.root).await;
    let run = svc.post_run("gate", json!({})).await;
    svc.wait_step(&run, "approve", "waiting").await;

    s.write_pipeline("gate", &gate("new_after"));
    let (status, body) = post_reload(&svc).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["changed"], json!(["gate"]), "{body}");

    let approvals: Value = reqwest::get(svc.url("/approvals"))
        .await
        .expect("GET /approvals")
        .json()
        .await
        .expect("JSON");
    let token = approvals["approvals"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["run_id"] == run.as_str()))
        .and_then(|x| x["token"].as_str())
        .unwrap_or_else(|| panic!("the parked run's approval is listed: {approvals}"))
        .to_string();
    let decided = reqwest::Client::new()
        .post(svc.url(&format!("/approvals/{token}")))
        .json(&json!({"decision": "approve", "by": "alice"}))
        .send()
        .await
        .expect("POST approval");
    assert_eq!(decided.status().as_u16(), 200);

    let done = svc.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(
        step_of(&done, "old_after").is_some() && step_of(&done, "new_after").is_none(),
        "the run finished on the steps it started with: {done}"
    );
    // New runs take the new definition.
    let next = svc.post_run("gate", json!({})).await;
    svc.wait_step(&next, "approve", "waiting").await;
    let next_run = svc.get_run(&next).await;
    assert_ne!(
        next_run["config_fingerprint"], done["config_fingerprint"],
        "a new run records the new fingerprint"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_added_by_a_reload_fires() {
    let s = Scratch::new();
    s.write_pipeline("first", FIRST);
    let svc = Service::start(&s.root).await;
    s.write_pipeline(
        "tick",
        "name: tick\ntrigger: {match: {source: scheduler}}\nstage: production\nschedule: {cron: \"* * * * * *\", summary: every second}\nsteps:\n  - {name: a, executor: mock}\n",
    );
    let (status, body) = post_reload(&svc).await;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ticks = svc
            .list_runs()
            .await
            .into_iter()
            .filter(|r| r["pipeline_name"] == "tick" && r["source"] == "scheduler")
            .count();
        if ticks >= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the reloaded schedule never fired:\n{}",
            svc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
