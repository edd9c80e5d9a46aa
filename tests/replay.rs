//! Replay of a run from a step (SPEC 12) against the real `serve` binary: the
//! copied steps are never requested again, the rest run with the new run's own
//! idempotency keys; the refusals (changed fingerprint, a human step in the copy,
//! a run still running, an unknown step); and the `runs cancel` / `runs replay`
//! commands, which go through the server's HTTP API.

mod common;

use std::process::{Command, Output, Stdio};

use common::crash_support::*;
use serde_json::{json, Value};

/// A plain webhook step posting `{"step": NAME}` to `<base>/<name>`.
fn webhook(name: &str, base: &str) -> String {
    format!(
        "  - name: {name}\n    executor: webhook\n    executor_config: {{url: \"{base}/{name}\", timeout_seconds: 60}}\n    prompt_template: '{{\"step\": \"{name}\"}}'\n"
    )
}

fn pipeline(steps: &str) -> String {
    format!("name: p\nstage: production\ntrigger: {{match: {{source: generic}}}}\nsteps:\n{steps}")
}

fn three_steps(base: &str) -> String {
    pipeline(
        &[
            webhook("s1", base),
            webhook("s2", base),
            webhook("s3", base),
        ]
        .concat(),
    )
}

/// `POST /runs/{id}/replay` with `body`: the status and the JSON answer.
async fn replay(svc: &Service, id: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(svc.url(&format!("/runs/{id}/replay")))
        .json(&body)
        .send()
        .await
        .expect("POST replay");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("JSON answer"))
}

/// A 409 (or `status`) whose detail contains `want`.
async fn refused(svc: &Service, id: &str, from_step: &str, status: u16, want: &str) {
    let (got, body) = replay(svc, id, json!({"from_step": from_step})).await;
    assert_eq!(got, status, "{body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(want), "{detail:?} lacks {want:?}: {body}");
    assert!(body["error"].is_string(), "{body}");
}

fn vectorstep(svc: &Service, dir: &Scratch, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .arg("--config")
        .arg(dir.config_path())
        .args(args)
        .args(["--url", &svc.url("")])
        .env_remove("VECTORSTEP_URL")
        .env_remove("VECTORSTEP_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("vectorstep runs")
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_from_step_two_reuses_step_one_and_runs_the_rest_with_new_keys() {
    let dir = Scratch::new();
    let peer = HoldingPeer::answering(Reply::ok()).await;
    dir.write_pipeline("p", &three_steps(&peer.url()));
    let svc = Service::start(&dir.root).await;
    let old = svc.post_run("p", json!({"service": "web"})).await;
    let old_run = svc.wait_terminal(&old).await;
    assert_eq!(
        old_run["status"],
        "completed",
        "{:?}",
        event_names(&old_run)
    );

    let (status, body) = replay(&svc, &old, json!({"from_step": "s2", "by": "carol"})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["replay_of"], old.as_str());
    let new = body["run_id"].as_str().expect("run_id").to_string();
    assert_ne!(new, old);
    let run = svc.wait_terminal(&new).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));

    // Step 1 was requested once in all; steps 2 and 3 once more each, under new keys.
    assert_eq!(peer.count_path("/s1"), 1);
    for path in ["/s2", "/s3"] {
        let seen = peer.for_path(path);
        assert_eq!(seen.len(), 2, "{path}");
        assert_ne!(seen[0].key(), seen[1].key(), "{path}");
        assert!(seen[0].key().contains(&old), "{}", seen[0].key());
        assert!(seen[1].key().contains(&new), "{}", seen[1].key());
    }
    // The copied record is the old one, field for field.
    assert_eq!(step(&run, "s1"), step(&old_run, "s1"));
    assert_ne!(
        step(&run, "s2")["idempotency_key"],
        step(&old_run, "s2")["idempotency_key"]
    );
    let reused = event(&run, "step_reused");
    assert_eq!(reused["step"], "s1");
    assert_eq!(reused["from_run"], old.as_str());
    let started = event(&run, "run_started");
    assert_eq!(started["replay_of"], old.as_str());
    assert_eq!(started["by"], "carol");
    assert!(event_names(&old_run).iter().all(|e| e != "step_reused"));
    assert!(
        old_run["logs"][0].get("replay_of").is_none(),
        "{}",
        old_run["logs"][0]
    );
    // A replay is a new run, never a resumed one.
    assert!(
        events(&run, "run_resumed").is_empty(),
        "{:?}",
        event_names(&run)
    );
    assert_eq!(run["resume_count"], 0);
    assert_eq!(run["resumed_at"], Value::Null);
    assert_eq!(run["replay_of"], old.as_str());
    assert_eq!(old_run["replay_of"], Value::Null);
    // The same pipeline and trigger.
    for key in [
        "pipeline_name",
        "source",
        "team",
        "stage",
        "config_fingerprint",
    ] {
        assert_eq!(run[key], old_run[key], "{key}");
    }
    let listed = svc.list_runs().await;
    let summary = listed
        .iter()
        .find(|r| r["id"] == new.as_str())
        .expect("listed");
    assert_eq!(summary["replay_of"], old.as_str());

    // A replay from the first step copies nothing and runs everything again.
    let (status, body) = replay(&svc, &old, json!({"from_step": "s1"})).await;
    assert_eq!(status, 202, "{body}");
    let again = svc.wait_terminal(body["run_id"].as_str().unwrap()).await;
    assert_eq!(again["status"], "completed");
    assert!(events(&again, "step_reused").is_empty());
    assert_eq!(peer.count_path("/s1"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replays_are_refused_while_running_for_an_unknown_step_and_after_a_change() {
    let dir = Scratch::new();
    // The first request to /s2 is held until released: the run is still running.
    let peer = HoldingPeer::start(|r| {
        if r.path == "/s2" && r.seq_path == 0 {
            Answer::Hold(Reply::ok())
        } else {
            Answer::Reply(Reply::ok())
        }
    })
    .await;
    dir.write_pipeline("p", &three_steps(&peer.url()));
    let mut svc = Service::start(&dir.root).await;
    let old = svc.post_run("p", json!({})).await;
    peer.wait_for_path("/s2", 1).await;
    refused(&svc, &old, "s2", 409, "still running").await;
    peer.release();
    assert_eq!(svc.wait_terminal(&old).await["status"], "completed");

    refused(&svc, &old, "nope", 400, "replay from one of: s1, s2, s3").await;
    refused(&svc, "no-such-run", "s2", 404, "").await;
    let (status, body) = replay(&svc, &old, json!({})).await;
    assert_eq!(status, 400, "{body}");
    let runs = svc.list_runs().await.len();

    // Another executor for s3: another fingerprint once the service reloads.
    let changed = three_steps(&peer.url()).replace(
        "  - name: s3\n    executor: webhook\n",
        "  - name: s3\n    executor: mock\n",
    );
    assert_ne!(changed, three_steps(&peer.url()));
    dir.write_pipeline("p", &changed);
    svc.sigterm(RUN_TIMEOUT).await;
    svc.restart().await;
    refused(&svc, &old, "s2", 409, "changed since run").await;
    assert_eq!(
        svc.list_runs().await.len(),
        runs,
        "a refusal stores nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_with_a_human_step_is_refused_and_the_cli_cancels_and_replays() {
    let dir = Scratch::new();
    let peer = HoldingPeer::answering(Reply::ok()).await;
    let steps = [
        webhook("s1", &peer.url()),
        "  - name: approve\n    executor: human\n    timeout_seconds: 600\n    prompt_template: \"go?\"\n".to_string(),
        webhook("s3", &peer.url()),
    ]
    .concat();
    dir.write_pipeline("p", &pipeline(&steps));
    let svc = Service::start(&dir.root).await;
    let old = svc.post_run("p", json!({})).await;
    svc.wait_step(&old, "approve", "waiting").await;

    // `runs cancel` of a running run records who cancelled.
    let out = vectorstep(&svc, &dir, &["runs", "cancel", &old, "--by", "dave"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("cancelling run {old}")),
        "{}",
        text(&out.stdout)
    );
    let cancelled = svc.wait_terminal(&old).await;
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(event(&cancelled, "run_cancelled")["by"], "dave");
    // A second cancel is the server's refusal, exit 1 with its message.
    let out = vectorstep(&svc, &dir, &["runs", "cancel", &old]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("already cancelled"),
        "{}",
        text(&out.stderr)
    );

    // Past the human step: refused, since approvals are never copied.
    refused(&svc, &old, "s3", 409, "include the human step `approve`").await;
    let out = vectorstep(&svc, &dir, &["runs", "replay", &old, "--from", "s3"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("replay from `approve` or an earlier step"),
        "{}",
        text(&out.stderr)
    );
    // From the human step itself: allowed, and it asks again.
    let out = vectorstep(
        &svc,
        &dir,
        &["runs", "replay", &old, "--from", "approve", "--by", "erin"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let new = stdout
        .split_whitespace()
        .nth(2)
        .map(|w| w.trim_end_matches(':').to_string())
        .expect("the new run id");
    assert!(
        stdout.contains(&format!("a replay of run {old} from step approve")),
        "{stdout}"
    );
    let run = svc.wait_step(&new, "approve", "waiting").await;
    assert_eq!(run["replay_of"], old.as_str());
    assert_eq!(event(&run, "run_started")["by"], "erin");
    assert_eq!(event(&run, "step_reused")["step"], "s1");
    assert_eq!(events(&run, "approval_requested").len(), 1);
    assert_eq!(peer.count_path("/s1"), 1);

    // Usage errors exit 64.
    let out = vectorstep(&svc, &dir, &["runs", "replay", &old]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    let out = vectorstep(&svc, &dir, &["runs", "cancel"]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    let out = vectorstep(&svc, &dir, &["runs", "cancel", &new]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(svc.wait_terminal(&new).await["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copied_group_rebuilds_the_context_the_next_step_renders() {
    let dir = Scratch::new();
    let peer =
        HoldingPeer::start(|r| Answer::Reply(Reply::output(0.9, &format!("from {}", r.path))))
            .await;
    let base = peer.url();
    let steps = format!(
        "  - parallel:\n      name: g\n      steps:\n\
         \x20       - {{name: x, executor: webhook, executor_config: {{url: \"{base}/x\"}}, prompt_template: '{{}}'}}\n\
         \x20       - {{name: y, executor: webhook, executor_config: {{url: \"{base}/y\"}}, prompt_template: '{{}}'}}\n\
         \x20 - fan_out: {{name: fo, over: '[1, 2]', executor: webhook, executor_config: {{url: \"{base}/item\"}}, prompt_template: '{{}}'}}\n\
         \x20 - name: s3\n    executor: webhook\n    executor_config: {{url: \"{base}/s3\"}}\n\
         \x20   prompt_template: '{{\"x\": \"{{{{ steps.x.summary }}}}\", \"g\": \"{{{{ steps.g.summary }}}}\", \"fo\": \"{{{{ steps.fo.summary }}}}\"}}'\n"
    );
    dir.write_pipeline("p", &pipeline(&steps));
    let svc = Service::start(&dir.root).await;
    let old = svc.post_run("p", json!({})).await;
    let old_run = svc.wait_terminal(&old).await;
    assert_eq!(
        old_run["status"],
        "completed",
        "{:?}",
        event_names(&old_run)
    );

    let (status, body) = replay(&svc, &old, json!({"from_step": "s3"})).await;
    assert_eq!(status, 202, "{body}");
    let run = svc.wait_terminal(body["run_id"].as_str().unwrap()).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    // Branches and items were copied, never requested again.
    assert_eq!(
        (
            peer.count_path("/x"),
            peer.count_path("/y"),
            peer.count_path("/item")
        ),
        (1, 1, 2)
    );
    for path in ["g", "g/x", "g/y", "fo", "fo/0", "fo/1"] {
        assert_eq!(step(&run, path), step(&old_run, path), "{path}");
    }
    let reused: Vec<&Value> = events(&run, "step_reused")
        .iter()
        .map(|e| &e["step"])
        .collect();
    assert_eq!(reused, [&json!("g"), &json!("fo")]);
    // s3 rendered from the copied outputs exactly as it did from the live ones.
    let s3 = peer.for_path("/s3");
    assert_eq!(s3.len(), 2);
    assert_eq!(s3[0].json()["x"], "from /x", "{}", s3[0].body);
    assert_eq!(s3[1].json(), s3[0].json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copied_agent_step_keeps_its_journal_and_calls_neither_model_nor_tool() {
    use common::tool_agent;
    let dir = Scratch::new();
    let peer = tool_agent::peer().await;
    // The same agent and tool, without the approval (it would not be copied anyway).
    dir.write_config(&tool_agent::config(&peer.url()).replace("    approval: required\n", ""));
    let steps = format!(
        "  - name: triage\n    executor: agent\n    executor_config: {{agent: investigator}}\n    prompt_template: \"Investigate the alert.\"\n{}",
        webhook("s2", &peer.url())
    );
    dir.write_pipeline("p", &pipeline(&steps));
    let svc = Service::start(&dir.root).await;
    let old = svc.post_run("p", json!({})).await;
    let old_run = svc.wait_terminal(&old).await;
    assert_eq!(
        old_run["status"],
        "completed",
        "{:?}",
        event_names(&old_run)
    );
    let (model, tool) = (
        peer.count_path(tool_agent::MODEL),
        peer.count_path(tool_agent::TOOL),
    );
    assert_eq!(tool, 1);

    let (status, body) = replay(&svc, &old, json!({"from_step": "s2"})).await;
    assert_eq!(status, 202, "{body}");
    let new = body["run_id"].as_str().unwrap().to_string();
    let run = svc.wait_terminal(&new).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(
        peer.count_path(tool_agent::MODEL),
        model,
        "the model is not asked again"
    );
    assert_eq!(
        peer.count_path(tool_agent::TOOL),
        1,
        "the tool is not called again"
    );
    assert_eq!(peer.count_path("/s2"), 2);
    // The step and its turns as they were; the copied call holds the new run's key.
    let (was, is) = (step(&old_run, "triage"), step(&run, "triage"));
    let without_turns = |s: &Value| {
        let mut s = s.clone();
        s.as_object_mut().unwrap().remove("turns");
        s
    };
    assert_eq!(without_turns(is), without_turns(was));
    let mut turns = was["turns"].clone();
    assert!(!turns.as_array().unwrap().is_empty(), "{was}");
    let key = &mut turns[0]["tool_calls"][0]["effect_key"];
    *key = Value::from(key.as_str().unwrap().replace(&old, &new));
    assert_eq!(is["turns"], turns);
    assert_eq!(
        run["tokens_used"], old_run["tokens_used"],
        "the copy's usage"
    );
}
