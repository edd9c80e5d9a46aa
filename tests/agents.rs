//! Tool-using agents against real local peers: one fake OpenAI-compatible model
//! (`/v1/chat/completions`) and one declared webhook tool (`/restart`) on the same
//! counting peer, driven through the real `vectorstep serve`, killed with SIGKILL
//! while a tool call or a model call is in flight. The model answers from the
//! conversation it is sent (no tool result yet: call the tool; else: answer), so a
//! resumed step is answered exactly as a fresh one would be, and the peer's counts
//! say what was asked twice.

//!
//! The kill tests hold [`SERIAL`] for their whole body: the test harness runs this
//! binary's tests in parallel, and several `serve` processes restarting and
//! resuming at once on a 2-core machine make their waits flaky. A lock in this file
//! is the least disruptive way (no test moves; the tests that never kill still run
//! in parallel). The crash soak has a binary of its own (tests/agent_soak.rs), which
//! cargo never runs beside this one.

mod common;
use common::crash_support;

use crash_support::{event_names, events, step, Answer, HoldingPeer, Reply, Scratch, Service};
use serde_json::{json, Value};

/// Held by every test that kills `serve` (see the top of this file).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits for the other kill tests of this binary to finish. A test that panicked
/// while holding the lock released it (tokio's lock is never poisoned).
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

use common::tool_agent::{MODEL, TOOL};

/// The model's answer to a request: a tool call (`{"service": "api"}`) until the
/// conversation holds `calls` tool results, then a final step output.
fn model_reply(body: &Value, calls: usize) -> Reply {
    common::tool_agent::model_reply_with(body, calls, "{\"service\": \"api\"}")
}

/// A peer for both: `hold` decides which request (path, position) never answers.
async fn peer(hold: Option<(&'static str, usize)>) -> HoldingPeer {
    peer_calling(hold, 1).await
}

/// [`peer`] whose model calls the tool on its first `calls` turns.
async fn peer_calling(hold: Option<(&'static str, usize)>, calls: usize) -> HoldingPeer {
    HoldingPeer::start(move |r| {
        if hold == Some((r.path.as_str(), r.seq_path)) {
            return Answer::Never;
        }
        match r.path.as_str() {
            MODEL => Answer::Reply(model_reply(&r.json(), calls)),
            _ => Answer::Reply(Reply::text(200, "deployment api restarted")),
        }
    })
    .await
}

fn setup(peer: &HoldingPeer, durable: &str) -> Scratch {
    setup_with(peer, durable, "")
}

/// `tool_extra` is added to the tool's block (e.g. `approval: required`).
fn setup_with(peer: &HoldingPeer, durable: &str, tool_extra: &str) -> Scratch {
    setup_full(peer, durable, tool_extra, "")
}

/// `pipeline_extra` holds whole top-level pipeline keys (e.g. `budget`).
fn setup_full(
    peer: &HoldingPeer,
    durable: &str,
    tool_extra: &str,
    pipeline_extra: &str,
) -> Scratch {
    let dir = Scratch::new();
    let url = peer.url();
    dir.write_config(&format!(
        "providers:\n  fake: {{base_url: \"{url}/v1\"}}\n\
         agents:\n  investigator: {{provider: fake, model: m, system_prompt: \"You investigate.\", tools: [restart_service]}}\n\
         tools:\n  restart_service:\n    description: Restart one deployment\n    \
         parameters: {{type: object, properties: {{service: {{type: string}}}}, required: [service]}}\n    \
         webhook: {{url: \"{url}{TOOL}\"}}\n    {tool_extra}\n"
    ));
    dir.write_pipeline(
        "p",
        &format!(
            "name: p\nstage: production\ntrigger: {{}}\ndurable: {durable}\n{pipeline_extra}steps:\n  - name: triage\n    executor: agent\n    executor_config: {{agent: investigator}}\n    prompt_template: \"Investigate the alert.\"\n"
        ),
    );
    dir
}

/// Starts `serve` on `dir` and a run of `p`, kills `serve` with SIGKILL once `peer`
/// has seen `n` requests to `path`, starts it again and waits for the run to end.
async fn killed_at(
    dir: &Scratch,
    peer: &HoldingPeer,
    path: &str,
    n: usize,
) -> (Service, String, Value) {
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    peer.wait_for_path(path, n).await;
    svc.kill9();
    svc.restart().await;
    let run = svc.wait_terminal(&id).await;
    (svc, id, run)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_calls_its_tool_once_and_answers_from_the_result() {
    let peer = peer(None).await;
    let dir = setup(&peer, "true");
    let svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(
        step(&run, "triage")["output"]["summary"],
        "restarted api",
        "{run}"
    );
    assert_eq!(peer.count_path(MODEL), 2, "two turns, each asked once");
    let calls = peer.for_path(TOOL);
    assert_eq!(calls.len(), 1, "the tool ran once");
    assert_eq!(calls[0].key(), format!("{id}:triage:1:1:1"));
    assert_eq!(calls[0].attempt(), 1);
    assert_eq!(calls[0].json(), json!({"service": "api"}));
    // The second turn saw the tool's result.
    let second = peer.for_path(MODEL)[1].json();
    let tool_msg = second["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool").cloned())
        .expect("the second request carries the tool result");
    assert_eq!(tool_msg["content"], "deployment api restarted");
    assert_eq!(tool_msg["tool_call_id"], "call_a");
    assert_eq!(events(&run, "agent_turn_completed").len(), 2);
    assert_eq!(events(&run, "tool_call_started").len(), 1);
    assert_eq!(events(&run, "tool_call_completed").len(), 1);
    // The run JSON lists the step's turns and tool calls, counted from 1.
    let turns = step(&run, "triage")["turns"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(turns.len(), 2, "{run}");
    assert_eq!(turns[0]["turn"], 1);
    assert_eq!(turns[0]["status"], "completed");
    assert_eq!(turns[0]["input_tokens"], 100);
    let call = &turns[0]["tool_calls"][0];
    assert_eq!(call["call_index"], 1);
    assert_eq!(call["tool"], "restart_service");
    assert_eq!(call["arguments"], json!({"service": "api"}));
    assert_eq!(call["status"], "completed");
    assert_eq!(call["effect_key"], format!("{id}:triage:1:1:1"));
    assert_eq!(call["attempt"], 1);
    assert!(call["duration_ms"].is_u64(), "{call}");
    assert_eq!(turns[1]["tool_calls"], json!([]));
    // Both turns' usage is the step's.
    assert_eq!(step(&run, "triage")["input_tokens"], 200, "{run}");
    assert_eq!(step(&run, "triage")["output_tokens"], 20, "{run}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_during_the_tool_call_reruns_it_with_the_same_key_and_never_asks_turn_1_again() {
    let _serial = serial().await;
    let peer = peer(Some((TOOL, 0))).await;
    let dir = setup(&peer, "true");
    let (_svc, id, run) = killed_at(&dir, &peer, TOOL, 1).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    // Turn 1 was answered before the kill: its reply is reused, never asked again.
    assert_eq!(
        peer.count_path(MODEL),
        2,
        "turn 1 once before the kill, turn 2 once after"
    );
    // The write call in flight ran again (on_interrupted: rerun), same effect key,
    // attempt 2.
    let calls = peer.for_path(TOOL);
    assert_eq!(calls.len(), 2, "once before the kill, once after");
    let key = format!("{id}:triage:1:1:1");
    assert!(calls.iter().all(|c| c.key() == key), "{:?}", calls);
    assert_eq!(
        calls.iter().map(|c| c.attempt()).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert_eq!(
        events(&run, "agent_turn_reused").len(),
        1,
        "{:?}",
        event_names(&run)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_after_the_tool_result_was_recorded_never_runs_the_tool_again() {
    let _serial = serial().await;
    // The second model request (turn 2) is held: the tool's result is recorded in
    // the commit that started turn 2, before the model was asked.
    let peer = peer(Some((MODEL, 1))).await;
    let dir = setup(&peer, "true");
    let (_svc, _id, run) = killed_at(&dir, &peer, MODEL, 2).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(peer.count_path(TOOL), 1, "the tool's result was reused");
    // Turn 2 was in flight: asked again (billed twice); turn 1 never again.
    assert_eq!(peer.count_path(MODEL), 3);
    let keys: Vec<String> = peer
        .for_path(MODEL)
        .iter()
        .map(|r| r.key().to_string())
        .collect();
    assert_eq!(keys[1], keys[2], "the re-asked turn keeps its key");
    assert_ne!(keys[0], keys[1]);
    // After the restart: turn 1 reused, no tool call started again.
    let names = event_names(&run);
    let resumed = names
        .iter()
        .position(|n| n == "run_resumed")
        .expect("resumed");
    assert!(
        !names[resumed..].iter().any(|n| n == "tool_call_started"),
        "{names:?}"
    );
    assert_eq!(
        events(&run, "agent_turn_reused")[0]["turns"],
        1,
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_during_the_first_model_call_asks_it_again_and_runs_the_tool_once() {
    let _serial = serial().await;
    let peer = peer(Some((MODEL, 0))).await;
    let dir = setup(&peer, "true");
    let (svc, _id, run) = killed_at(&dir, &peer, MODEL, 1).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    // Turn 1 was in flight: asked again once (billed twice), then turn 2.
    assert_eq!(peer.count_path(MODEL), 3);
    assert_eq!(peer.count_path(TOOL), 1);
    assert!(
        events(&run, "agent_turn_reused").is_empty(),
        "nothing was reusable"
    );
    // The turn asked twice is counted as billed twice.
    let text = reqwest::get(svc.url("/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    let rebilled: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("vectorstep_agent_rebilled_calls_total{"))
        .collect();
    assert_eq!(rebilled.len(), 1, "{text}");
    assert!(
        rebilled[0].contains("agent=\"investigator\"") && rebilled[0].ends_with(" 1"),
        "{rebilled:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_escalate_a_write_call_in_flight_is_never_run_again_and_the_step_escalates() {
    let _serial = serial().await;
    let peer = peer(Some((TOOL, 0))).await;
    let dir = setup(&peer, "{on_interrupted: escalate}");
    let (_svc, _id, run) = killed_at(&dir, &peer, TOOL, 1).await;
    assert_eq!(run["status"], "escalated", "{:?}", event_names(&run));
    assert_eq!(peer.count_path(TOOL), 1, "the write call was not run again");
    assert_eq!(peer.count_path(MODEL), 1, "nothing more was asked");
    let triage = step(&run, "triage");
    assert_eq!(triage["status"], "escalated", "{triage}");
    let summary = triage["output"]["summary"].as_str().unwrap_or("");
    assert!(
        summary.contains("restart_service") && summary.contains("\"service\":\"api\""),
        "the escalation names the tool and its arguments: {summary}"
    );
}

/// Decides an approval through the JSON API; the HTTP status.
async fn decide(svc: &Service, token: &str, decision: &str) -> u16 {
    reqwest::Client::new()
        .post(svc.url(&format!("/approvals/{token}")))
        .json(&json!({"decision": decision, "by": "alice"}))
        .send()
        .await
        .expect("POST /approvals")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tool_call_waiting_for_approval_survives_a_kill_with_its_token_and_runs_once_approved() {
    let _serial = serial().await;
    let peer = peer(None).await;
    let dir = setup_with(&peer, "true", "approval: required");
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    let before = svc.wait_event(&id, "tool_approval_requested").await;
    let token = events(&before, "tool_approval_requested")[0]["token"]
        .as_str()
        .expect("a token")
        .to_string();
    assert_eq!(peer.count_path(TOOL), 0, "nothing runs before the decision");
    svc.kill9();
    svc.restart().await;
    // The same request is still open after the restart: deciding it works.
    assert_eq!(decide(&svc, &token, "approve").await, 200);
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(peer.count_path(TOOL), 1, "approved once, run once");
    assert_eq!(
        peer.count_path(MODEL),
        2,
        "the proposing turn was not asked again"
    );
    assert_eq!(
        events(&run, "tool_approval_requested").len(),
        1,
        "asked once: {:?}",
        event_names(&run)
    );
    assert_eq!(events(&run, "tool_approval_decided")[0]["approved"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rejected_tool_call_is_not_run_and_the_model_reads_the_rejection() {
    let peer = peer(None).await;
    let dir = setup_with(&peer, "true", "approval: required");
    let svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    let asked = svc.wait_event(&id, "tool_approval_requested").await;
    let token = events(&asked, "tool_approval_requested")[0]["token"]
        .as_str()
        .expect("a token")
        .to_string();
    assert_eq!(decide(&svc, &token, "reject").await, 200);
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(peer.count_path(TOOL), 0, "a rejected call never runs");
    let second = peer.for_path(MODEL)[1].json();
    let result = second["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool").cloned())
        .expect("the rejection goes back to the model");
    let text = result["content"].as_str().unwrap_or("");
    assert!(
        text.contains("rejected") && text.contains("alice"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_budget_counts_turns_spent_before_a_kill_and_stops_the_loop_before_the_next_turn() {
    let _serial = serial().await;
    // Each turn costs 110 tokens; the run may spend 100: turn 1 fits, turn 2 never
    // starts. The kill lands during turn 1's tool call, so the only record of turn
    // 1's usage is the journal.
    let peer = peer(Some((TOOL, 0))).await;
    let dir = setup_full(&peer, "true", "", "budget: {max_tokens: 100}\n");
    let (_svc, _id, run) = killed_at(&dir, &peer, TOOL, 1).await;
    assert_eq!(run["status"], "aborted", "{:?}", event_names(&run));
    assert_eq!(
        events(&run, "budget_exceeded").len(),
        1,
        "{:?}",
        event_names(&run)
    );
    assert_eq!(peer.count_path(MODEL), 1, "turn 2 was never asked");
    assert_eq!(
        step(&run, "triage")["input_tokens"],
        100,
        "turn 1 counted once"
    );
    assert_eq!(run["tokens_used"], 110);
}

/// Whether `pid` still runs; a zombie does not (it was killed and waits for a reaper).
fn running(pid: i64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// The records the fixture MCP server appended (one JSON object per line).
fn records(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(
            std::time::Instant::now() < limit,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_mcp_server_dies_with_a_killed_serve_and_its_read_call_in_flight_runs_again() {
    let _serial = serial().await;
    // The model asks the stdio MCP server's read-only `sleep` tool for 300 s; the
    // server's timeout (2 s) ends the rerun after the restart, and the model
    // answers from that result.
    let peer = HoldingPeer::start(|r| {
        let body = r.json();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let message = if messages.iter().any(|m| m["role"] == "tool") {
            let answer = json!({"confidence": 0.9, "summary": "waited", "next_step_context": ""});
            json!({"role": "assistant", "content": answer.to_string()})
        } else {
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_s", "type": "function",
                "function": {"name": "sleep", "arguments": "{\"seconds\": 300}"}}]})
        };
        Answer::Reply(Reply::json(
            200,
            json!({"choices": [{"index": 0, "message": message}],
                   "usage": {"prompt_tokens": 10, "completion_tokens": 1}}),
        ))
    })
    .await;
    let dir = Scratch::new();
    let record = dir.root.join("mcp-record.jsonl");
    let server =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp/stdio_server.py");
    dir.write_config(&format!(
        "providers:\n  fake: {{base_url: \"{url}/v1\"}}\n\
         agents:\n  investigator: {{provider: fake, model: m, tools: [{{mcp: k8s, only: [sleep]}}]}}\n\
         mcp_servers:\n  k8s: {{command: [python3, {server:?}], env: {{MCP_RECORD: {record:?}}}, timeout_seconds: 2}}\n",
        url = peer.url(),
        server = server.display().to_string(),
        record = record.display().to_string(),
    ));
    dir.write_pipeline(
        "p",
        "name: p\nstage: production\ntrigger: {}\ndurable: true\nsteps:\n  - name: triage\n    executor: agent\n    executor_config: {agent: investigator}\n    prompt_template: \"Wait.\"\n",
    );
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    until("the sleep call", || {
        records(&record).iter().any(|r| r["event"] == "call")
    })
    .await;
    let first = records(&record)
        .into_iter()
        .find(|r| r["event"] == "start")
        .expect("the server recorded its start");
    let pid = first["pid"].as_i64().expect("a pid");
    assert!(running(pid), "the server runs while its call is in flight");
    svc.kill9();
    until("the MCP server to die with serve", || !running(pid)).await;

    svc.restart().await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    let calls: Vec<Value> = records(&record)
        .into_iter()
        .filter(|r| r["event"] == "call")
        .collect();
    assert_eq!(
        calls.len(),
        2,
        "the read call ran again after the restart: {calls:?}"
    );
    let key = format!("{id}:triage:1:1:1");
    for (c, attempt) in calls.iter().zip([1, 2]) {
        assert_eq!(c["meta"]["vectorstep/effect_key"], key, "{c}");
        assert_eq!(c["meta"]["vectorstep/attempt"], attempt, "{c}");
    }
    assert_eq!(peer.count_path(MODEL), 2, "turn 1 was not asked again");
}

/// The streamable-HTTP fixture MCP server, started by the test (so it outlives a
/// killed `serve`) and killed when dropped.
struct HttpMcp {
    child: std::process::Child,
    url: String,
}

impl HttpMcp {
    /// `hold_attempt`: the attempt of a `restart` call the server never answers.
    fn start(record: &std::path::Path, hold_attempt: Option<u32>) -> HttpMcp {
        use std::io::BufRead;
        let server = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/mcp/http_server.py");
        let mut cmd = std::process::Command::new("python3");
        cmd.arg(server)
            .env("MCP_RECORD", record)
            .stdout(std::process::Stdio::piped());
        if let Some(n) = hold_attempt {
            cmd.env("MCP_HOLD_ATTEMPT", n.to_string());
        }
        let mut child = cmd.spawn().expect("python3 runs the HTTP MCP server");
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the server prints its port");
        let port: u16 = line.trim().parse().expect("a port");
        HttpMcp {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for HttpMcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A model that asks the MCP `restart` (a write: the server marks it destructive)
/// on turn 1 and answers once it has the result; `hold`: the request to the model
/// (by position) that never answers.
async fn restarting_model(hold: Option<usize>) -> HoldingPeer {
    HoldingPeer::start(move |r| {
        if hold == Some(r.seq_path) {
            return Answer::Never;
        }
        let body = r.json();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let message = if messages.iter().any(|m| m["role"] == "tool") {
            let answer =
                json!({"confidence": 0.9, "summary": "restarted", "next_step_context": ""});
            json!({"role": "assistant", "content": answer.to_string()})
        } else {
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_r", "type": "function",
                "function": {"name": "restart", "arguments": "{\"service\": \"api\"}"}}]})
        };
        Answer::Reply(Reply::json(
            200,
            json!({"choices": [{"index": 0, "message": message}],
                   "usage": {"prompt_tokens": 10, "completion_tokens": 1}}),
        ))
    })
    .await
}

fn http_mcp_setup(peer: &HoldingPeer, mcp: &HttpMcp) -> Scratch {
    let dir = Scratch::new();
    dir.write_config(&format!(
        "providers:\n  fake: {{base_url: \"{url}/v1\"}}\n\
         agents:\n  investigator: {{provider: fake, model: m, tools: [{{mcp: ops, only: [restart]}}]}}\n\
         mcp_servers:\n  ops: {{url: {mcp:?}, timeout_seconds: 10}}\n",
        url = peer.url(),
        mcp = mcp.url,
    ));
    dir.write_pipeline(
        "p",
        "name: p\nstage: production\ntrigger: {}\ndurable: true\nsteps:\n  - name: triage\n    executor: agent\n    executor_config: {agent: investigator}\n    prompt_template: \"Restart it.\"\n",
    );
    dir
}

/// The `restart` calls the MCP server recorded: (effect key, attempt).
fn restart_calls(record: &std::path::Path) -> Vec<(String, u64)> {
    records(record)
        .into_iter()
        .filter(|r| r["event"] == "call" && r["name"] == "restart")
        .map(|r| {
            let meta = &r["meta"];
            (
                meta["vectorstep/effect_key"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                meta["vectorstep/attempt"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_call_held_by_an_http_mcp_server_at_a_kill_runs_again_with_its_effect_key() {
    let _serial = serial().await;
    // The record is written before the config (which needs the server's port).
    let record_dir = Scratch::new();
    let record = record_dir.root.join("mcp-record.jsonl");
    let mcp = HttpMcp::start(&record, Some(1));
    let peer = restarting_model(None).await;
    let dir = http_mcp_setup(&peer, &mcp);
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    until("the restart call", || !restart_calls(&record).is_empty()).await;
    // The server holds attempt 1: the call is in flight when serve dies; the
    // server itself lives on (it is not serve's child).
    svc.kill9();
    svc.restart().await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    let key = format!("{id}:triage:1:1:1");
    assert_eq!(
        restart_calls(&record),
        vec![(key.clone(), 1), (key, 2)],
        "the write call in flight ran again (on_interrupted: rerun), same effect key, attempt 2"
    );
    assert_eq!(peer.count_path(MODEL), 2, "turn 1 was not asked again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_call_an_http_mcp_server_answered_before_a_kill_is_never_run_again() {
    let _serial = serial().await;
    // The record is written before the config (which needs the server's port).
    let record_dir = Scratch::new();
    let record = record_dir.root.join("mcp-record.jsonl");
    let mcp = HttpMcp::start(&record, None);
    // Turn 2 is held: the call's result was recorded in the commit that started it.
    let peer = restarting_model(Some(1)).await;
    let dir = http_mcp_setup(&peer, &mcp);
    let (_svc, id, run) = killed_at(&dir, &peer, MODEL, 2).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(
        restart_calls(&record),
        vec![(format!("{id}:triage:1:1:1"), 1)],
        "the write call ran once"
    );
    assert_eq!(peer.count_path(MODEL), 3, "turn 2 asked again, turn 1 not");
    let turns = step(&run, "triage")["turns"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(turns[0]["tool_calls"][0]["status"], "completed", "{run}");
    assert_eq!(turns[0]["tool_calls"][0]["attempt"], 1, "{run}");
}

#[test]
fn tools_list_connects_and_names_every_tool_with_its_class_and_what_a_server_lacks() {
    let dir = Scratch::new();
    let server =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp/stdio_server.py");
    dir.write_config(&format!(
        "providers:\n  fake: {{base_url: \"http://127.0.0.1:9/v1\"}}\n\
         agents:\n  investigator: {{provider: fake, model: m, tools: [restart_service, {{mcp: k8s, only: [echo, restart, nosuch]}}]}}\n  \
         plain: {{provider: fake, model: m}}\n\
         tools:\n  restart_service:\n    description: Restart\n    parameters: {{type: object}}\n    \
         webhook: {{url: \"http://127.0.0.1:9/restart\"}}\n    approval: required\n\
         mcp_servers:\n  k8s: {{command: [python3, {server:?}], timeout_seconds: 10}}\n",
        server = server.display().to_string(),
    ));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .arg("--config")
        .arg(dir.config_path())
        .args(["tools", "list"])
        .output()
        .expect("vectorstep tools list runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let row = |tool: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(tool))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("no row for {tool}:\n{stdout}"))
    };
    assert_eq!(
        row("restart_service"),
        [
            "investigator",
            "restart_service",
            "declared",
            "write",
            "required"
        ]
    );
    // The MCP server's annotations decide the class: `echo` is read-only.
    assert_eq!(
        row("echo"),
        ["investigator", "echo", "mcp:k8s", "read", "none"]
    );
    assert_eq!(
        row("restart"),
        ["investigator", "restart", "mcp:k8s", "write", "none"]
    );
    assert!(
        !stdout.contains("plain"),
        "an agent without tools is not listed:\n{stdout}"
    );
    assert!(stderr.contains("`k8s/nosuch`"), "{stderr}");
    assert_eq!(
        out.status.code(),
        Some(1),
        "a missing `only` tool fails the listing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_while_the_model_holds_turn_3_asks_only_turn_3_again_and_counts_turns_1_and_2_once()
{
    let _serial = serial().await;
    let peer = peer_calling(Some((MODEL, 2)), 2).await;
    let dir = setup(&peer, "true");
    let (_svc, _id, run) = killed_at(&dir, &peer, MODEL, 3).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    let keys: Vec<String> = peer
        .for_path(MODEL)
        .iter()
        .map(|r| r.key().to_string())
        .collect();
    assert_eq!(keys.len(), 4, "turns 1 and 2 once, turn 3 twice: {keys:?}");
    assert_eq!(keys[2], keys[3], "turn 3 was asked again with its key");
    assert_eq!(peer.count_path(TOOL), 2, "each turn's call ran once");
    assert_eq!(events(&run, "agent_turn_reused")[0]["turns"], 2);
    // Turns 1 and 2 once, and turn 3's answer: 3 x 110 tokens.
    assert_eq!(run["tokens_used"], 330, "{run}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kill_after_the_reply_was_recorded_and_before_the_tool_ran_runs_it_once_and_never_asks_again(
) {
    let _serial = serial().await;
    let peer = peer(None).await;
    let dir = setup(&peer, "true");
    // The first process stops at the pause point: turn 1's reply and the call's
    // start are committed, the tool has not run.
    let mut svc = Service::start_with_env(
        &dir.root,
        &[(vectorstep::runner::agent::PAUSE_BEFORE_TOOL_CALL, "1")],
    )
    .await;
    let id = svc.post_run("p", json!({})).await;
    svc.wait_event(&id, "tool_call_started").await;
    assert_eq!(peer.count_path(TOOL), 0, "paused before the tool");
    svc.kill9();
    svc.restart().await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(peer.count_path(MODEL), 2, "turn 1 was not asked again");
    let calls = peer.for_path(TOOL);
    assert_eq!(calls.len(), 1, "the tool ran once in all");
    assert_eq!(
        calls[0].attempt(),
        2,
        "its first start was recorded before the kill"
    );
}

/// A script for the scripted provider: for each agent, `n - 1` turns that call the
/// `probe` tool, then a final answer.
fn long_script(agents: &[(&str, usize)]) -> String {
    let mut s = String::from("agents:\n");
    for (name, n) in agents {
        s.push_str(&format!("  {name}:\n    turns:\n"));
        for i in 1..*n {
            s.push_str(&format!(
                "      - tool_calls: [{{name: probe, arguments: {{n: {i}}}}}]\n        usage: {{input_tokens: 10, output_tokens: 1}}\n"
            ));
        }
        s.push_str(
            "      - final: {confidence: 0.9, summary: done, next_step_context: \"\"}\n        usage: {input_tokens: 10, output_tokens: 1}\n",
        );
    }
    s
}

/// The bytes a step's journal holds: every turn's messages and reply, every
/// call's arguments and result.
fn journal_bytes(j: &vectorstep::store::StepJournal) -> usize {
    let turns: usize = j
        .turns
        .iter()
        .map(|t| t.messages_json.len() + t.reply_json.as_ref().map_or(0, String::len))
        .sum();
    let calls: usize = j
        .calls
        .iter()
        .map(|c| c.arguments_json.len() + c.result_json.as_ref().map_or(0, String::len))
        .sum();
    turns + calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_journal_grows_linearly_with_its_turns() {
    let dir = Scratch::new();
    let script = dir.root.join("script.yaml");
    std::fs::write(&script, long_script(&[("a100", 100), ("a200", 200)])).unwrap();
    dir.write_config(&format!(
        "providers:\n  demo: {{kind: scripted, script: {script:?}}}\n\
         agents:\n  a100: {{provider: demo, model: scripted, tools: [probe], max_turns: 300}}\n  \
         a200: {{provider: demo, model: scripted, tools: [probe], max_turns: 300}}\n\
         tools:\n  probe:\n    description: Probe\n    parameters: {{type: object}}\n    \
         shell: {{command: [echo, ok]}}\n    effect: read\n",
        script = script.display().to_string(),
    ));
    for (name, agent) in [("p100", "a100"), ("p200", "a200")] {
        dir.write_pipeline(
            name,
            &format!(
                "name: {name}\nstage: production\ntrigger: {{}}\ndurable: true\nsteps:\n  - name: s\n    executor: agent\n    executor_config: {{agent: {agent}}}\n    prompt_template: \"Probe.\"\n"
            ),
        );
    }
    let svc = Service::start(&dir.root).await;
    let short = svc.post_run("p100", json!({})).await;
    let long = svc.post_run("p200", json!({})).await;
    for id in [&short, &long] {
        let run = svc
            .wait_until(
                id,
                |r| r["status"] != "running",
                std::time::Duration::from_secs(120),
            )
            .await;
        assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    }
    let store = dir.open_store();
    let bytes = |id: &str| {
        let j = store.journal(id, "s").expect("the journal reads");
        assert!(!j.turns.is_empty());
        (j.turns.len(), journal_bytes(&j))
    };
    let (n100, b100) = bytes(&short);
    let (n200, b200) = bytes(&long);
    assert_eq!((n100, n200), (100, 200));
    let ratio = b200 as f64 / b100 as f64;
    // Twice the turns: about twice the bytes (the square would give 4).
    assert!(
        (1.8..2.3).contains(&ratio),
        "journal bytes {b100} for 100 turns, {b200} for 200: ratio {ratio:.2}"
    );
}

/// The user message of a model request (the question a helper is asked).
fn user_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_string()
}

/// The model of the four-delegation tests: the lead (system prompt `LEAD`) asks
/// the helper q1..q4 in one turn, then answers "all answered" (or "saw an error"
/// when a result it got is an error). While `first_process` is set, the helper
/// never answers q3 and q4, except that the question `failing` (if any) is answered
/// HTTP 500 instead: its sub-agent fails at once.
async fn delegating_peer(
    first_process: std::sync::Arc<std::sync::atomic::AtomicBool>,
    failing: Option<&'static str>,
) -> HoldingPeer {
    HoldingPeer::start(move |r| {
        let body = r.json();
        let system = body["messages"][0]["content"].as_str().unwrap_or("").to_string();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let results: Vec<&Value> = messages.iter().filter(|m| m["role"] == "tool").collect();
        let message = if system == "LEAD" && results.is_empty() {
            let calls: Vec<Value> = (1..=4)
                .map(|i| {
                    json!({"id": format!("call_{i}"), "type": "function", "function": {
                        "name": "delegate",
                        "arguments": json!({"agent": "helper", "question": format!("q{i}")}).to_string()}})
                })
                .collect();
            json!({"role": "assistant", "content": null, "tool_calls": calls})
        } else {
            let q = user_text(&body);
            let first = first_process.load(std::sync::atomic::Ordering::SeqCst);
            if system == "HELPER" && first && failing == Some(q.as_str()) {
                return Answer::Reply(Reply::text(500, "the helper's model is down"));
            }
            if system == "HELPER" && first && (q == "q3" || q == "q4") {
                return Answer::Never;
            }
            let errors = results
                .iter()
                .any(|m| m["content"].as_str().unwrap_or("").starts_with("error:"));
            let summary = match (system.as_str(), errors) {
                ("LEAD", false) => "all answered".to_string(),
                ("LEAD", true) => "saw an error".to_string(),
                _ => format!("answer to {q}"),
            };
            let answer = json!({"confidence": 0.9, "summary": summary, "next_step_context": ""});
            json!({"role": "assistant", "content": answer.to_string()})
        };
        Answer::Reply(Reply::json(
            200,
            json!({"choices": [{"index": 0, "message": message}],
                   "usage": {"prompt_tokens": 10, "completion_tokens": 1}}),
        ))
    })
    .await
}

fn delegating_setup(peer: &HoldingPeer) -> Scratch {
    let dir = Scratch::new();
    dir.write_config(&format!(
        "providers:\n  fake: {{base_url: \"{url}/v1\"}}\n\
         agents:\n  lead: {{provider: fake, model: m, system_prompt: LEAD, delegates: [helper]}}\n  \
         helper: {{provider: fake, model: m, system_prompt: HELPER}}\n",
        url = peer.url()
    ));
    dir.write_pipeline(
        "p",
        "name: p\nstage: production\ntrigger: {}\ndurable: true\nsteps:\n  - name: triage\n    executor: agent\n    executor_config: {agent: lead}\n    prompt_template: \"Ask around.\"\n",
    );
    dir
}

/// How many model requests asked the helper `q`.
fn asked(peer: &HoldingPeer, q: &str) -> usize {
    peer.for_path(MODEL)
        .iter()
        .filter(|r| user_text(&r.json()) == q)
        .count()
}

/// Waits until q3 and q4 were both asked (the four ran at once).
async fn wait_for_q3_and_q4(peer: &HoldingPeer) {
    peer.wait_for("q3 and q4 asked", |seen| {
        seen.iter()
            .filter(|r| r.path == MODEL && ["q3", "q4"].contains(&user_text(&r.json()).as_str()))
            .count()
            == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_delegations_run_at_once_and_a_kill_after_two_answered_asks_only_the_other_two_again()
{
    let _serial = serial().await;
    // The lead delegates four questions in one turn; the helper answers q1 and q2
    // and, in the first process, never answers q3 and q4.
    let first_process = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let peer = delegating_peer(first_process.clone(), None).await;
    let dir = delegating_setup(&peer);
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    svc.wait_until(
        &id,
        |r| events(r, "delegation_completed").len() == 2,
        std::time::Duration::from_secs(30),
    )
    .await;
    // All four were asked at once: q3 and q4 are held while q1 and q2 answered.
    wait_for_q3_and_q4(&peer).await;
    svc.kill9();
    first_process.store(false, std::sync::atomic::Ordering::SeqCst);
    svc.restart().await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(
        (asked(&peer, "q1"), asked(&peer, "q2")),
        (1, 1),
        "answered before the kill: never asked again"
    );
    assert_eq!(
        (asked(&peer, "q3"), asked(&peer, "q4")),
        (2, 2),
        "in flight at the kill: asked once more"
    );
    assert_eq!(
        events(&run, "delegation_reused").len(),
        2,
        "{:?}",
        event_names(&run)
    );
    assert_eq!(step(&run, "triage")["output"]["summary"], "all answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_four_delegations_killed_after_two_answered_and_one_failed_the_failed_one_runs_again() {
    let _serial = serial().await;
    // q1 and q2 answer, q3's sub-agent fails (its model answers 500), q4 is still
    // in flight when serve is killed. The failure was journaled (delegation
    // `failed`) but never handed to the lead: its turn waits for q4.
    let first_process = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let peer = delegating_peer(first_process.clone(), Some("q3")).await;
    let dir = delegating_setup(&peer);
    let mut svc = Service::start(&dir.root).await;
    let id = svc.post_run("p", json!({})).await;
    svc.wait_until(
        &id,
        |r| events(r, "delegation_completed").len() == 2,
        std::time::Duration::from_secs(30),
    )
    .await;
    wait_for_q3_and_q4(&peer).await;
    let store = dir.open_store();
    until("q3's delegation journaled failed", || {
        store.journal(&id, "triage").is_ok_and(|j| {
            j.delegations.iter().any(|d| {
                d.question == "q3" && d.status == vectorstep::domain::DelegationStatus::Failed
            })
        })
    })
    .await;
    drop(store);
    svc.kill9();
    first_process.store(false, std::sync::atomic::Ordering::SeqCst);
    svc.restart().await;
    let run = svc.wait_terminal(&id).await;
    assert_eq!(run["status"], "completed", "{:?}", event_names(&run));
    assert_eq!(
        (asked(&peer, "q1"), asked(&peer, "q2")),
        (1, 1),
        "completed before the kill: reused"
    );
    assert_eq!(
        asked(&peer, "q3"),
        2,
        "failed before the kill: its failure is not reused, it runs again"
    );
    assert_eq!(asked(&peer, "q4"), 2, "in flight at the kill: asked again");
    assert_eq!(
        events(&run, "delegation_reused").len(),
        2,
        "{:?}",
        event_names(&run)
    );
    // The lead's first turn was asked once; its second saw four answers, no error.
    let lead_turns = peer
        .for_path(MODEL)
        .iter()
        .filter(|r| r.json()["messages"][0]["content"] == "LEAD")
        .count();
    assert_eq!(lead_turns, 2, "turn 1 before the kill, turn 2 after");
    assert_eq!(step(&run, "triage")["output"]["summary"], "all answered");
    let j = dir
        .open_store()
        .journal(&id, "triage")
        .expect("the journal reads");
    let q3 = j
        .delegations
        .iter()
        .find(|d| d.step_path == "triage" && d.question == "q3")
        .expect("q3's delegation row");
    assert_eq!(q3.status, vectorstep::domain::DelegationStatus::Completed);
    let call = j
        .calls
        .iter()
        .find(|c| c.step_path == "triage" && c.arguments_json.contains("\"q3\""))
        .expect("q3's call row");
    assert_eq!(call.status, vectorstep::domain::ToolCallStatus::Completed);
    assert_eq!(call.attempt, 2, "the call in flight at the kill, run again");
}

#[test]
fn validate_reads_the_scripted_providers_script_and_names_what_is_wrong_with_it() {
    let dir = Scratch::new();
    let script = dir.root.join("script.yaml");
    std::fs::write(&script, "turns:\n  - final: {confidence: 0.9, summary: ok, next_step_context: \"\"}\n  - bogus: 1\n").unwrap();
    dir.write_config(&format!(
        "providers:\n  demo: {{kind: scripted, script: {script:?}}}\nagents:\n  a: {{provider: demo, model: scripted}}\n",
        script = script.display().to_string(),
    ));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .arg("--config")
        .arg(dir.config_path())
        .arg("validate")
        .output()
        .expect("vectorstep validate runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("provider `demo`"), "{stderr}");
    assert!(
        stderr.contains("script.yaml:3:"),
        "the problem's line: {stderr}"
    );
}
