//! Crash tests (SPEC 6): the real `vectorstep serve` is killed with SIGKILL at a
//! chosen point (a fake peer holds the request of the step that must be in flight)
//! and started again on the same store. Fake peers count every request, so "never
//! executed again" and "exactly once" are assertions.

mod common;
use common::crash_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crash_support::{
    event, event_names, events, step, Answer, HoldingPeer, Reply, Scratch, Service,
};
use rand::Rng;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------
// Pipeline YAML builders.
// ---------------------------------------------------------------------------

/// A plain webhook step posting `{"step": NAME}` to `url`.
fn webhook(name: &str, url: &str) -> String {
    format!(
        "  - name: {name}\n    executor: webhook\n    executor_config: {{url: \"{url}\", timeout_seconds: 60}}\n    prompt_template: '{{\"step\": \"{name}\"}}'\n"
    )
}

/// A parallel group of webhook branches, each posting to `<base>/<branch>`.
fn parallel(name: &str, base: &str, branches: &[&str]) -> String {
    let mut s = format!("  - parallel:\n      name: {name}\n      steps:\n");
    for b in branches {
        s.push_str(&format!(
            "        - name: {b}\n          executor: webhook\n          executor_config: {{url: \"{base}/{b}\", timeout_seconds: 60}}\n          prompt_template: '{{\"branch\": \"{b}\"}}'\n"
        ));
    }
    s
}

/// A fan-out over `items` (a JSON list) posting each item to `<base>/item/<item>`.
fn fan_out(name: &str, base: &str, items: &str) -> String {
    format!(
        "  - fan_out:\n      name: {name}\n      over: '{items}'\n      executor: webhook\n      executor_config: {{url: \"{base}/item/{{{{ item }}}}\", timeout_seconds: 60}}\n      prompt_template: '{{\"item\": \"{{{{ item }}}}\"}}'\n"
    )
}

/// A production pipeline started by name; `head` holds extra top-level keys
/// (`durable`, `budget`), `tail` goes after the steps (`notifications`).
fn pipeline(name: &str, head: &str, steps: &str, tail: &str) -> String {
    format!(
        "name: {name}\nstage: production\n{head}\ntrigger: {{match: {{source: generic}}}}\nsteps:\n{steps}{tail}"
    )
}

/// An `escalate` notification POSTed to `url`.
fn escalate_to(url: &str) -> String {
    format!(
        "notifications:\n  escalate:\n    channel: webhook\n    template: \"{{{{ pipeline_name }}}} escalated at {{{{ current_step }}}}: {{{{ step_summary }}}}\"\n    config: {{url: \"{url}\"}}\n"
    )
}

fn three_steps(base: &str) -> String {
    [
        webhook("s1", &format!("{base}/s1")),
        webhook("s2", &format!("{base}/s2")),
        webhook("s3", &format!("{base}/s3")),
    ]
    .concat()
}

/// A peer that answers everything, except that the first request to `held` is
/// never answered.
async fn holding_first(held: &'static str) -> HoldingPeer {
    HoldingPeer::start(move |r| {
        if r.path == held && r.seq_path == 0 {
            Answer::Never
        } else {
            Answer::Reply(Reply::ok())
        }
    })
    .await
}

fn attempts(list: &[crash_support::Seen]) -> Vec<u32> {
    list.iter().map(|r| r.attempt()).collect()
}

fn keys(list: &[crash_support::Seen]) -> BTreeSet<String> {
    list.iter().map(|r| r.key().to_string()).collect()
}

/// Starts a run of `p`, waits until the peer holds the first request to `held`,
/// kills the service with SIGKILL and starts it again. Returns the run id.
async fn crash_while_held(svc: &mut Service, peer: &HoldingPeer, held: &str) -> String {
    let id = svc.post_run("p", json!({"event": "crash-test"})).await;
    peer.wait_for_path(held, 1).await;
    svc.kill9();
    svc.restart().await;
    id
}

// ---------------------------------------------------------------------------
// Resume with `rerun`.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_flight_step_is_requested_again_once_with_the_same_key_and_attempt_2() {
    let dir = Scratch::new();
    let peer = holding_first("/s2").await;
    dir.write_pipeline(
        "p",
        &pipeline("p", "durable: true", &three_steps(&peer.url()), ""),
    );
    let mut svc = Service::start(&dir.root).await;
    let id = crash_while_held(&mut svc, &peer, "/s2").await;

    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    // Completed before the kill: requested exactly once in total.
    assert_eq!(
        peer.count_path("/s1"),
        1,
        "s1 was completed before the kill"
    );
    // In flight at the kill: requested once more, same key, attempt 2.
    let s2 = peer.for_path("/s2");
    assert_eq!(s2.len(), 2, "s2: one request before the kill, one after");
    assert_eq!(keys(&s2), BTreeSet::from([format!("{id}:s2:1")]));
    assert_eq!(attempts(&s2), vec![1, 2]);
    assert_eq!(step(&run, "s2")["status"], "completed");
    assert_eq!(step(&run, "s2")["attempts"], 2);
    assert_eq!(step(&run, "s2")["idempotency_key"], format!("{id}:s2:1"));
    assert_eq!(step(&run, "s1")["attempts"], 1);

    assert_eq!(run["resume_count"], 1);
    assert!(run["resumed_at"].is_string(), "resumed_at is set: {run}");
    let resumed = event(&run, "run_resumed");
    assert_eq!(resumed["steps_skipped"], 1, "{resumed}");
    assert_eq!(resumed["in_flight"], json!(["s2"]), "{resumed}");
    assert_eq!(resumed["resume_count"], 1, "{resumed}");
    assert_eq!(resumed["on_interrupted"], "rerun", "{resumed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn step_not_started_at_the_kill_runs_normally_after_restart() {
    let dir = Scratch::new();
    let peer = holding_first("/s2").await;
    dir.write_pipeline(
        "p",
        &pipeline("p", "durable: true", &three_steps(&peer.url()), ""),
    );
    let mut svc = Service::start(&dir.root).await;
    let id = crash_while_held(&mut svc, &peer, "/s2").await;

    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    // s3 had no record at the kill: it runs once, as attempt 1, no policy applied.
    let s3 = peer.for_path("/s3");
    assert_eq!(s3.len(), 1);
    assert_eq!(s3[0].key(), format!("{id}:s3:1"));
    assert_eq!(s3[0].attempt(), 1);
    assert_eq!(step(&run, "s3")["attempts"], 1);
    let started: Vec<&Value> = events(&run, "step_started")
        .into_iter()
        .filter(|e| e["step"] == "s3")
        .collect();
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["attempt"], 1);
    assert_eq!(started[0]["rerun_after_restart"], false);
    assert!(
        events(&run, "resume_step_escalated").is_empty(),
        "no policy applies to a step that had not started"
    );
}

// ---------------------------------------------------------------------------
// Resume with `escalate`.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn escalate_policy_never_requests_the_in_flight_step_again() {
    let dir = Scratch::new();
    let peer = holding_first("/s2").await;
    let notify = HoldingPeer::answering(Reply::ok()).await;
    dir.write_pipeline(
        "p",
        &pipeline(
            "p",
            "durable: {on_interrupted: escalate}",
            &three_steps(&peer.url()),
            &escalate_to(&format!("{}/notify", notify.url())),
        ),
    );
    let mut svc = Service::start(&dir.root).await;
    let id = crash_while_held(&mut svc, &peer, "/s2").await;

    let run = svc.wait_event(&id, "notification_sent").await;
    assert_eq!(run["status"], "escalated", "{:?}", event_names(&run));
    assert_eq!(run["terminal_step"], "s2");
    assert_eq!(peer.count_path("/s1"), 1);
    assert_eq!(
        peer.count_path("/s2"),
        1,
        "the in-flight step is not re-run"
    );
    assert_eq!(peer.count_path("/s3"), 0, "the run does not go on");
    assert_eq!(step(&run, "s2")["status"], "escalated");
    let esc = event(&run, "resume_step_escalated");
    assert_eq!(esc["step"], "s2", "{esc}");
    let resumed = event(&run, "run_resumed");
    assert_eq!(resumed["on_interrupted"], "escalate");
    assert_eq!(resumed["in_flight"], json!(["s2"]));

    // Give a duplicate delivery a chance to show up before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sent = notify.requests();
    assert_eq!(sent.len(), 1, "the escalate notification is delivered once");
    assert_eq!(sent[0].key(), format!("{id}:escalate:0"));
    let body: Value = serde_json::from_str(&sent[0].body).expect("JSON notification");
    assert!(
        body["text"]
            .as_str()
            .unwrap_or("")
            .contains("escalated at s2"),
        "{body}"
    );
    assert_eq!(
        events(&svc.get_run(&id).await, "notification_sent").len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn escalate_policy_in_a_parallel_group_escalates_only_the_in_flight_branch() {
    let dir = Scratch::new();
    let peer = holding_first("/c").await;
    let notify = HoldingPeer::answering(Reply::ok()).await;
    let base = peer.url();
    let steps = [
        parallel("g", &base, &["a", "b", "c"]),
        webhook("after", &format!("{base}/after")),
    ]
    .concat();
    dir.write_pipeline(
        "p",
        &pipeline(
            "p",
            "durable: {on_interrupted: escalate}",
            &steps,
            &escalate_to(&format!("{}/notify", notify.url())),
        ),
    );
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_path("/c", 1).await;
    svc.wait_step(&id, "g/a", "completed").await;
    svc.wait_step(&id, "g/b", "completed").await;
    svc.kill9();
    svc.restart().await;

    let run = svc.wait_event(&id, "notification_sent").await;
    assert_eq!(run["status"], "escalated", "{:?}", event_names(&run));
    for path in ["/a", "/b", "/c"] {
        assert_eq!(peer.count_path(path), 1, "{path} is requested once in all");
    }
    assert_eq!(peer.count_path("/after"), 0);
    assert_eq!(step(&run, "g/a")["status"], "completed");
    assert_eq!(step(&run, "g/b")["status"], "completed");
    assert_eq!(step(&run, "g/c")["status"], "escalated");
    assert_eq!(step(&run, "g")["status"], "escalated");
    let esc = event(&run, "resume_step_escalated");
    assert_eq!(esc["branches"], json!(["g/c"]), "{esc}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(notify.count(), 1);
}

// ---------------------------------------------------------------------------
// Groups: only what is missing runs again.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_group_resumes_only_the_held_branch() {
    let dir = Scratch::new();
    let peer = holding_first("/c").await;
    let base = peer.url();
    let steps = [
        parallel("g", &base, &["a", "b", "c"]),
        webhook("after", &format!("{base}/after")),
    ]
    .concat();
    dir.write_pipeline("p", &pipeline("p", "durable: true", &steps, ""));
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_path("/c", 1).await;
    // a and b answered at once; wait until their records say so.
    svc.wait_until(
        &id,
        |r| {
            ["g/a", "g/b"]
                .iter()
                .all(|p| crash_support::step_of(r, p).is_some_and(|s| s["status"] == "completed"))
        },
        crash_support::RUN_TIMEOUT,
    )
    .await;
    svc.kill9();
    svc.restart().await;

    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(peer.count_path("/a"), 1, "completed branch a is not re-run");
    assert_eq!(peer.count_path("/b"), 1, "completed branch b is not re-run");
    let c = peer.for_path("/c");
    assert_eq!(
        attempts(&c),
        vec![1, 2],
        "only the held branch is re-requested"
    );
    assert_eq!(keys(&c), BTreeSet::from([format!("{id}:g/c:1")]));
    assert_eq!(peer.count_path("/after"), 1);
    assert_eq!(step(&run, "g")["status"], "completed");
    assert_eq!(step(&run, "g/c")["attempts"], 2);
    let resumed = event(&run, "run_resumed");
    assert_eq!(resumed["branches_skipped"], 2, "{resumed}");
    assert_eq!(resumed["in_flight"], json!(["g/c"]), "{resumed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fan_out_resumes_only_the_missing_items() {
    let dir = Scratch::new();
    let peer = HoldingPeer::start(|r| {
        if (r.path == "/item/c" || r.path == "/item/d") && r.seq_path == 0 {
            Answer::Never
        } else {
            Answer::Reply(Reply::ok())
        }
    })
    .await;
    let steps = fan_out("fo", &peer.url(), r#"["a","b","c","d"]"#);
    dir.write_pipeline("p", &pipeline("p", "durable: true", &steps, ""));
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_request(4).await;
    svc.wait_until(
        &id,
        |r| {
            ["fo/0", "fo/1"]
                .iter()
                .all(|p| crash_support::step_of(r, p).is_some_and(|s| s["status"] == "completed"))
        },
        crash_support::RUN_TIMEOUT,
    )
    .await;
    svc.kill9();
    svc.restart().await;

    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(peer.count_path("/item/a"), 1);
    assert_eq!(peer.count_path("/item/b"), 1);
    for (item, idx) in [("c", 2), ("d", 3)] {
        let list = peer.for_path(&format!("/item/{item}"));
        assert_eq!(attempts(&list), vec![1, 2], "item {item}");
        assert_eq!(keys(&list), BTreeSet::from([format!("{id}:fo/{idx}:1")]));
    }
    assert_eq!(peer.count(), 6, "4 before the kill, 2 after");
    let resumed = event(&run, "run_resumed");
    assert_eq!(resumed["branches_skipped"], 2, "{resumed}");
    let mut in_flight: Vec<String> = resumed["in_flight"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    in_flight.sort();
    assert_eq!(in_flight, vec!["fo/2", "fo/3"]);
    assert_eq!(step(&run, "fo")["items"], json!(["a", "b", "c", "d"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn loop_in_flight_restarts_at_iteration_1() {
    let dir = Scratch::new();
    // Iteration 1 is not confident enough, iteration 2 is held, after the restart
    // the loop converges.
    let peer = HoldingPeer::start(|r| match r.seq {
        0 => Answer::Reply(Reply::output(0.5, "not sure yet")),
        1 => Answer::Never,
        _ => Answer::Reply(Reply::output(0.95, "sure now")),
    })
    .await;
    let steps = format!(
        "  - name: lp\n    executor: webhook\n    executor_config: {{url: \"{}/lp\", timeout_seconds: 60}}\n    prompt_template: '{{\"iteration\": {{{{ loop.iteration }}}}}}'\n    loop_until: {{confidence: 0.9, max_iterations: 3}}\n",
        peer.url()
    );
    dir.write_pipeline("p", &pipeline("p", "durable: true", &steps, ""));
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_request(2).await;
    assert_eq!(
        peer.requests()[1].key(),
        format!("{id}:lp:2"),
        "held in iteration 2"
    );
    svc.kill9();
    svc.restart().await;

    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    let all = peer.requests();
    assert_eq!(all.len(), 3, "one request after the restart");
    assert_eq!(
        all[2].key(),
        format!("{id}:lp:1"),
        "the loop restarts at iteration 1"
    );
    assert_eq!(all[2].attempt(), 2);
    assert_eq!(all[2].body, r#"{"iteration": 1}"#);
    assert!(!events(&run, "loop_converged").is_empty());
}

// ---------------------------------------------------------------------------
// The startup sweep: when a run is not resumed.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changed_step_sequence_interrupts_instead_of_resuming() {
    let dir = Scratch::new();
    let peer = holding_first("/s2").await;
    let base = peer.url();
    let two = [
        webhook("s1", &format!("{base}/s1")),
        webhook("s2", &format!("{base}/s2")),
    ]
    .concat();
    dir.write_pipeline("p", &pipeline("p", "durable: true", &two, ""));
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_path("/s2", 1).await;
    svc.kill9();
    // A step is added while the service is down.
    dir.write_pipeline(
        "p",
        &pipeline("p", "durable: true", &three_steps(&base), ""),
    );
    svc.restart().await;

    let run = svc.get_run(&id).await;
    assert_eq!(run["status"], "interrupted", "{:?}", event_names(&run));
    let changed = event(&run, "resume_skipped_config_changed");
    assert!(changed["stored_fingerprint"].is_string(), "{changed}");
    assert!(changed["current_fingerprint"].is_string(), "{changed}");
    assert_ne!(
        changed["stored_fingerprint"],
        changed["current_fingerprint"]
    );
    assert!(events(&run, "run_resumed").is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(peer.count_path("/s2"), 1, "nothing is re-run");
    assert_eq!(peer.count_path("/s3"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prompt_only_edit_still_resumes() {
    let dir = Scratch::new();
    let peer = holding_first("/s2").await;
    let base = peer.url();
    dir.write_pipeline(
        "p",
        &pipeline("p", "durable: true", &three_steps(&base), ""),
    );
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_path("/s2", 1).await;
    svc.kill9();
    // Only a prompt changes: the fingerprint (path, executor, agent) does not.
    let edited =
        three_steps(&base).replace(r#"{"step": "s2"}"#, r#"{"step": "s2", "edited": true}"#);
    dir.write_pipeline("p", &pipeline("p", "durable: true", &edited, ""));
    svc.restart().await;

    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    let s2 = peer.for_path("/s2");
    assert_eq!(attempts(&s2), vec![1, 2]);
    assert!(
        s2[1].body.contains("edited"),
        "the rerun uses the current prompt"
    );
    assert!(events(&run, "resume_skipped_config_changed").is_empty());
    assert_eq!(run["resume_count"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_older_than_max_resume_age_is_interrupted() {
    let dir = Scratch::new();
    let peer = holding_first("/s1").await;
    dir.write_pipeline(
        "p",
        &pipeline(
            "p",
            "durable: {on_interrupted: rerun, max_resume_age_seconds: 1}",
            &three_steps(&peer.url()),
            "",
        ),
    );
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_path("/s1", 1).await;
    svc.kill9();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    svc.restart().await;

    let run = svc.get_run(&id).await;
    assert_eq!(run["status"], "interrupted", "{:?}", event_names(&run));
    let old = event(&run, "resume_skipped_max_age_exceeded");
    assert_eq!(old["max_resume_age_seconds"], 1, "{old}");
    assert!(old["age_seconds"].as_f64().unwrap() > 1.0, "{old}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(peer.count_path("/s1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn non_durable_run_is_interrupted() {
    let dir = Scratch::new();
    let peer = holding_first("/s1").await;
    dir.write_pipeline("p", &pipeline("p", "", &three_steps(&peer.url()), ""));
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_path("/s1", 1).await;
    svc.kill9();
    svc.restart().await;

    let run = svc.get_run(&id).await;
    assert_eq!(run["status"], "interrupted", "{:?}", event_names(&run));
    let ev = event(&run, "run_interrupted");
    assert_eq!(ev["reason"], "not_durable", "{ev}");
    assert!(events(&run, "run_resumed").is_empty());
    assert_eq!(run["resume_count"], 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(peer.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn third_crash_in_the_same_step_exhausts_resume_attempts() {
    let dir = Scratch::new();
    dir.write_config("durability: {max_resume_attempts: 2}");
    // s1 never answers, in any process.
    let peer = HoldingPeer::start(|_| Answer::Never).await;
    dir.write_pipeline(
        "p",
        &pipeline("p", "durable: true", &three_steps(&peer.url()), ""),
    );
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    for crash in 1..=3 {
        peer.wait_for_request(crash).await;
        svc.kill9();
        svc.restart().await;
    }

    let run = svc.get_run(&id).await;
    assert_eq!(run["status"], "interrupted", "{:?}", event_names(&run));
    let ev = event(&run, "resume_attempts_exhausted");
    assert_eq!(ev["resume_count"], 2, "{ev}");
    assert_eq!(ev["max_resume_attempts"], 2, "{ev}");
    assert_eq!(run["resume_count"], 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s1 = peer.requests();
    assert_eq!(
        attempts(&s1),
        vec![1, 2, 3],
        "one request per process, none after"
    );
    assert_eq!(keys(&s1), BTreeSet::from([format!("{id}:s1:1")]));
}

// ---------------------------------------------------------------------------
// Budgets and notifications across a crash.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn budget_spent_before_the_kill_counts_after_it() {
    let dir = Scratch::new();
    // 600 tokens per call; the second step's first call is held.
    let llm = HoldingPeer::start(|r| {
        if r.key().contains(":a2:") && r.seq_key == 0 {
            Answer::Never
        } else {
            Answer::Reply(Reply::completion(400, 200))
        }
    })
    .await;
    dir.write_config(&format!(
        "providers:\n  fake: {{base_url: \"{}/v1\", timeout_seconds: 60}}\n\
         agents:\n  triage: {{provider: fake, model: fake-model, system_prompt: \"Answer in JSON.\"}}\n",
        llm.url()
    ));
    let agent = |name: &str| {
        format!(
            "  - name: {name}\n    executor: agent\n    executor_config: {{agent: triage}}\n    prompt_template: \"look at {name}\"\n"
        )
    };
    let steps = [agent("a1"), agent("a2"), agent("a3")].concat();
    dir.write_pipeline(
        "p",
        &pipeline("p", "durable: true\nbudget: {max_tokens: 1000}", &steps, ""),
    );
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    llm.wait_for(":a2: request", |all| {
        all.iter().any(|r| r.key().contains(":a2:"))
    })
    .await;
    let before = svc.get_run(&id).await;
    assert_eq!(before["tokens_used"], 600, "a1 spent 600 before the kill");
    svc.kill9();
    svc.restart().await;

    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "aborted", "{:?}", event_names(&run));
    let ev = event(&run, "budget_exceeded");
    assert_eq!(ev["tokens_used"], 1200, "{ev}");
    assert_eq!(run["tokens_used"], 1200);
    assert_eq!(llm.for_key(&format!("{id}:a1:1")).len(), 1);
    assert_eq!(attempts(&llm.for_key(&format!("{id}:a2:1"))), vec![1, 2]);
    assert!(
        llm.for_key(&format!("{id}:a3:1")).is_empty(),
        "the run stops at the budget"
    );
    assert_eq!(llm.for_path("/v1/chat/completions").len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_after_an_escalation_neither_continues_nor_repeats_nor_loses_the_notification() {
    let dir = Scratch::new();
    let peer = HoldingPeer::start(|r| {
        if r.path == "/s1" {
            Answer::Reply(Reply::output(0.1, "bad"))
        } else {
            Answer::Reply(Reply::ok())
        }
    })
    .await;
    // The first delivery is held until the process dies; later ones are answered.
    let notify = HoldingPeer::start(|r| {
        if r.seq == 0 {
            Answer::Never
        } else {
            Answer::Reply(Reply::ok())
        }
    })
    .await;
    let base = peer.url();
    let steps = [
        webhook("s1", &format!("{base}/s1")),
        webhook("s2", &format!("{base}/s2")),
    ]
    .concat();
    dir.write_pipeline(
        "p",
        &pipeline(
            "p",
            "durable: true",
            &steps,
            &escalate_to(&format!("{}/notify", notify.url())),
        ),
    );
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    notify.wait_for_request(1).await;
    let before = svc.get_run(&id).await;
    assert_eq!(
        before["status"], "escalated",
        "finished before the notification is sent"
    );
    svc.kill9();
    svc.restart().await;

    let run = svc.wait_event(&id, "notification_sent").await;
    assert_eq!(run["status"], "escalated", "{:?}", event_names(&run));
    assert_eq!(run["resume_count"], 0, "a finished run is not resumed");
    assert!(events(&run, "run_resumed").is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(peer.count_path("/s1"), 1);
    assert_eq!(
        peer.count_path("/s2"),
        0,
        "the run never went on past the escalation"
    );
    let sent = notify.requests();
    assert_eq!(
        sent.len(),
        2,
        "the held attempt, then one delivery after the restart"
    );
    assert_eq!(keys(&sent), BTreeSet::from([format!("{id}:escalate:0")]));
    assert!(!sent[0].answered);
    assert!(sent[1].answered);
    assert_eq!(
        events(&svc.get_run(&id).await, "notification_sent").len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_notification_peer_does_not_hold_up_the_restart() {
    let dir = Scratch::new();
    let peer = HoldingPeer::start(|r| match r.path.as_str() {
        "/low" => Answer::Reply(Reply::output(0.1, "bad")),
        "/s2" if r.seq_path == 0 => Answer::Never,
        _ => Answer::Reply(Reply::ok()),
    })
    .await;
    // The notification receiver hangs on every request, before and after the kill.
    let notify = HoldingPeer::start(|_| Answer::Never).await;
    let base = peer.url();
    dir.write_pipeline(
        "esc",
        &pipeline(
            "esc",
            "durable: true",
            &webhook("low", &format!("{base}/low")),
            &escalate_to(&format!("{}/notify", notify.url())),
        ),
    );
    dir.write_pipeline(
        "p",
        &pipeline("p", "durable: true", &three_steps(&base), ""),
    );
    let mut svc = Service::start(&dir.root).await;
    let escalated = svc.post_run("esc", json!({})).await;
    notify.wait_for_request(1).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_path("/s2", 1).await;
    svc.kill9();

    // The pending notification is retried, but a peer that does not answer must
    // not keep the service from becoming ready and resuming durable runs.
    let restarted = Instant::now();
    svc.restart_within(Duration::from_secs(5)).await;
    let run = svc
        .wait_until(&id, |r| r["status"] != "running", Duration::from_secs(5))
        .await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert!(restarted.elapsed() < Duration::from_secs(10));
    notify.wait_for_request(2).await;
    let esc = svc.get_run(&escalated).await;
    assert_eq!(esc["status"], "escalated");
    assert_eq!(
        keys(&notify.requests()),
        BTreeSet::from([format!("{escalated}:escalate:0")])
    );
}

// ---------------------------------------------------------------------------
// Graceful shutdown.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_lets_the_in_flight_step_finish_and_the_run_resumes_with_nothing_in_flight() {
    let dir = Scratch::new();
    dir.write_config("durability: {shutdown_grace_seconds: 10}");
    let peer = HoldingPeer::start(|r| {
        if r.path == "/s2" {
            Answer::Hold(Reply::ok())
        } else {
            Answer::Reply(Reply::ok())
        }
    })
    .await;
    dir.write_pipeline(
        "p",
        &pipeline("p", "durable: true", &three_steps(&peer.url()), ""),
    );
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_path("/s2", 1).await;
    let asked = Instant::now();
    // The peer answers about a second after SIGTERM; the drain must wait for it.
    let (exit, ()) = tokio::join!(svc.sigterm(Duration::from_secs(15)), async {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        peer.release();
    });
    assert!(exit.success(), "SIGTERM exits 0, got {exit}");
    assert!(
        asked.elapsed() >= Duration::from_millis(1000),
        "it waited for the step"
    );

    {
        let store = dir.open_store();
        let run = store.run(&id).unwrap().expect("run");
        assert_eq!(run.status, "running", "left at a step boundary");
        let steps = store.steps(&id).unwrap();
        let s2 = steps
            .iter()
            .find(|s| s.step_path == "s2")
            .expect("s2 record");
        assert_eq!(s2.status, "completed", "the in-flight step was recorded");
        assert!(
            steps.iter().all(|s| s.step_path != "s3"),
            "s3 did not start"
        );
    }

    svc.restart().await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    let resumed = event(&run, "run_resumed");
    assert_eq!(resumed["in_flight"], json!([]), "{resumed}");
    assert_eq!(resumed["steps_skipped"], 2, "{resumed}");
    assert_eq!(peer.count_path("/s2"), 1);
    let s3 = peer.for_path("/s3");
    assert_eq!(attempts(&s3), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_past_the_grace_period_leaves_the_step_in_flight_for_the_next_start() {
    let dir = Scratch::new();
    dir.write_config("durability: {shutdown_grace_seconds: 1}");
    let peer = holding_first("/s2").await;
    dir.write_pipeline(
        "p",
        &pipeline("p", "durable: true", &three_steps(&peer.url()), ""),
    );
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_path("/s2", 1).await;
    let exit = svc.sigterm(Duration::from_secs(10)).await;
    assert!(
        exit.success(),
        "SIGTERM exits 0 after the grace period, got {exit}"
    );

    svc.restart().await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    let resumed = event(&run, "run_resumed");
    assert_eq!(resumed["in_flight"], json!(["s2"]), "{resumed}");
    assert_eq!(attempts(&peer.for_path("/s2")), vec![1, 2]);
    assert_eq!(peer.count_path("/s3"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sub_pipeline_in_flight_resumes_the_same_child_run() {
    let dir = Scratch::new();
    let peer = holding_first("/c2").await;
    let base = peer.url();
    let child = [
        webhook("c1", &format!("{base}/c1")),
        webhook("c2", &format!("{base}/c2")),
        webhook("c3", &format!("{base}/c3")),
    ]
    .concat();
    dir.write_pipeline("child", &pipeline("child", "durable: true", &child, ""));
    let parent = [
        webhook("p1", &format!("{base}/p1")),
        "  - name: sub\n    executor: pipeline\n    executor_config: {pipeline: child}\n"
            .to_string(),
        webhook("p3", &format!("{base}/p3")),
    ]
    .concat();
    dir.write_pipeline("parent", &pipeline("parent", "durable: true", &parent, ""));
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("parent", json!({})).await;
    peer.wait_for_path("/c2", 1).await;
    svc.kill9();
    svc.restart().await;

    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    for (path, n) in [("/p1", 1), ("/c1", 1), ("/c2", 2), ("/c3", 1), ("/p3", 1)] {
        assert_eq!(peer.count_path(path), n, "{path}");
    }
    let runs = svc.list_runs().await;
    assert_eq!(runs.len(), 2, "one parent, one child: {runs:#?}");
    let child_run = runs.iter().find(|r| r["pipeline_name"] == "child").unwrap();
    assert_eq!(child_run["status"], "completed");
    assert_eq!(child_run["parent_run_id"], json!(id));
    assert_eq!(step(&run, "sub")["output"]["sub_run_id"], child_run["id"]);
}

// ---------------------------------------------------------------------------
// Soak: many runs, many kills.
// ---------------------------------------------------------------------------

const SOAK_RUNS: usize = 50;
const SOAK_KILLS: usize = 10;

fn soak_pipelines(dir: &Scratch, base: &str) {
    let plain: String = (0..30)
        .map(|i| webhook(&format!("s{i}"), &format!("{base}/plain/s{i}")))
        .collect();
    dir.write_pipeline("plain", &pipeline("plain", "durable: true", &plain, ""));
    let groups: String = (0..8)
        .map(|i| {
            [
                webhook(&format!("s{i}"), &format!("{base}/par/s{i}")),
                parallel(
                    &format!("g{i}"),
                    &format!("{base}/par/g{i}"),
                    &["a", "b", "c"],
                ),
            ]
            .concat()
        })
        .collect();
    dir.write_pipeline("par", &pipeline("par", "durable: true", &groups, ""));
    let fans: String = (0..8)
        .map(|i| {
            [
                webhook(&format!("s{i}"), &format!("{base}/fan/s{i}")),
                fan_out(
                    &format!("f{i}"),
                    &format!("{base}/fan/f{i}"),
                    r#"["w","x","y","z"]"#,
                ),
            ]
            .concat()
        })
        .collect();
    dir.write_pipeline("fan", &pipeline("fan", "durable: true", &fans, ""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_fifty_runs_survive_ten_random_kills() {
    let started = Instant::now();
    let dir = Scratch::new();
    dir.write_config("durability: {max_resume_attempts: 100, shutdown_grace_seconds: 10}\nconcurrency: {max_runs: 200}");
    let peer = HoldingPeer::start(|_| {
        let ms = rand::thread_rng().gen_range(20..=200);
        Answer::Reply(Reply::ok().delayed(Duration::from_millis(ms)))
    })
    .await;
    soak_pipelines(&dir, &peer.url());
    let mut svc = Service::start(&dir.root).await;

    let mut ids = Vec::new();
    for n in 0..SOAK_RUNS {
        let name = ["plain", "par", "fan"][n % 3];
        ids.push(
            svc.post_run(name, json!({"event": format!("soak-{n}")}))
                .await,
        );
    }
    for _ in 0..SOAK_KILLS {
        let ms = rand::thread_rng().gen_range(300..=1500);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        svc.kill9();
        svc.restart().await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let runs = svc.list_runs().await;
        let running = runs.iter().filter(|r| r["status"] == "running").count();
        if runs.len() == SOAK_RUNS && running == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{running} run(s) still running after the last restart\n{}",
            svc.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let kills = svc.kills.clone();
    let by_key = peer.by_key();
    let mut recorded_keys = BTreeSet::new();
    let mut resumed_runs = 0;
    let mut rerequested = 0;
    for id in &ids {
        let run = svc.get_run(id).await;
        assert_eq!(
            run["status"],
            "completed",
            "run {id}: {:?}",
            event_names(&run)
        );
        if run["resume_count"].as_u64().unwrap_or(0) > 0 {
            resumed_runs += 1;
        }
        // Every unit has exactly one record, and all of them completed:
        // plain 30 steps; par 8 x (step + group + 3 branches); fan 8 x (step + fan-out + 4).
        let expected = match run["pipeline_name"].as_str().unwrap() {
            "plain" => 30,
            "par" => 40,
            _ => 48,
        };
        let steps = run["steps"].as_array().unwrap();
        assert_eq!(steps.len(), expected, "run {id}");
        assert!(
            steps.iter().all(|s| s["status"] == "completed"),
            "run {id}: {steps:#?}"
        );
        for s in run["steps"].as_array().unwrap() {
            if s["executor"] != "webhook" || s["kind"] == "fan_out" {
                continue;
            }
            let key = s["idempotency_key"].as_str().unwrap().to_string();
            assert_eq!(s["status"], "completed", "{s}");
            let seen = by_key.get(&key).cloned().unwrap_or_default();
            assert!(!seen.is_empty(), "completed step {key} was never requested");
            assert!(
                seen.len() <= 1 + kills.len(),
                "{key}: {} requests for {} kills",
                seen.len(),
                kills.len()
            );
            let att = attempts(&seen);
            for (i, r) in seen.iter().enumerate() {
                if i > 0 {
                    assert!(
                        r.attempt() > 1,
                        "{key}: repeat request with attempt 1: {att:?}"
                    );
                    assert!(
                        att[i] > att[i - 1],
                        "{key}: attempts not increasing: {att:?}"
                    );
                }
                // Attempt k is only ever sent by the k-th process or a later one.
                let k = r.attempt() as usize;
                assert!(k >= 1, "{key}: no attempt header");
                if k > 1 {
                    assert!(
                        k - 1 <= kills.len() && r.at > kills[k - 2],
                        "{key}: attempt {k} sent before kill #{}",
                        k - 1
                    );
                }
            }
            // The request whose answer was recorded is the last one, and it was answered.
            let last = seen.last().unwrap();
            assert_eq!(
                s["attempts"].as_u64().unwrap() as u32,
                last.attempt(),
                "{key}: the recorded attempt is the last request's: {att:?}"
            );
            assert!(last.answered, "{key}: the recorded request was answered");
            if seen.len() > 1 {
                rerequested += 1;
            }
            recorded_keys.insert(key);
        }
    }
    let stray: Vec<&String> = by_key
        .keys()
        .filter(|k| !recorded_keys.contains(*k))
        .collect();
    assert!(
        stray.is_empty(),
        "requests for keys no step recorded: {stray:?}"
    );

    let exit = svc.sigterm(Duration::from_secs(15)).await;
    assert!(exit.success(), "{exit}");
    let store = dir.open_store();
    assert_eq!(store.integrity_check().unwrap(), "ok");
    eprintln!(
        "soak: {SOAK_RUNS} runs, {} kills, {resumed_runs} run(s) resumed, {rerequested} step(s) re-requested, {} requests, {:.1}s",
        kills.len(),
        peer.count(),
        started.elapsed().as_secs_f64()
    );
}
