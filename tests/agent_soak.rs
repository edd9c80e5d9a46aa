//! The agents' crash soak: 20 runs at once of an agent that delegates (the built-in
//! `delegate` tool), reads over MCP (the stdio fixture server's `echo`) and writes
//! through a declared webhook tool, driven through the real `vectorstep serve`,
//! which is SIGKILLed at 10 random moments and restarted on the same store each
//! time. Then every run must be `completed`, and the journal must show that no
//! effect was repeated that the durability rules do not allow to repeat.
//!
//! One test in its own binary: cargo runs test binaries one after another, so the
//! soak never shares the machine with the kill tests of tests/agents.rs.
//!
//! The moments are drawn from a seeded RNG: `VECTORSTEP_SOAK_SEED=<n>` replays a
//! seed that the test printed (with every kill moment) on stderr.

mod common;
use common::crash_support::{
    event_names, events, step, Answer, HoldingPeer, Reply, Scratch, Service,
};

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use vectorstep::domain::{ToolCallStatus, TurnStatus};

const MODEL: &str = "/v1/chat/completions";
const TOOL: &str = "/restart";
const RUNS: usize = 20;
const KILLS: usize = 10;
/// A copy measured later than its record's `finished_at` by more than this is a
/// repeat after the record (the two clocks agree to about a millisecond; a real
/// repeat comes at least one restart later).
const CLOCK_SLACK_MS: i64 = 20;

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// One model request as the fake model identifies it: the run (from the prompt or
/// the delegated question), the agent (its system prompt) and the turn (1 + the
/// assistant messages the conversation holds already).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Ask {
    run: String,
    agent: String,
    turn: u32,
}

fn ask_of(body: &Value) -> Ask {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let text = |role: &str| {
        messages
            .iter()
            .find(|m| m["role"] == role)
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string()
    };
    let user = text("user");
    Ask {
        run: user.strip_prefix("run=").unwrap_or(&user).to_string(),
        agent: text("system"),
        turn: 1 + messages.iter().filter(|m| m["role"] == "assistant").count() as u32,
    }
}

fn call(id: &str, name: &str, arguments: Value) -> Value {
    json!({"id": id, "type": "function",
           "function": {"name": name, "arguments": arguments.to_string()}})
}

/// The fake model's answer, decided by the conversation only (so a resumed turn
/// is answered as the first ask was). The lead: turn 1 delegates to the helper and
/// reads (`echo`), turn 2 writes (`restart_service`), turn 3 answers. The helper:
/// turn 1 reads, turn 2 answers.
fn model_message(a: &Ask) -> Value {
    let id = &a.run;
    let calls = match (a.agent.as_str(), a.turn) {
        ("LEAD", 1) => vec![
            call(
                "d1",
                "delegate",
                json!({"agent": "helper", "question": format!("run={id}")}),
            ),
            call("e1", "echo", json!({"text": format!("lead {id}")})),
        ],
        ("LEAD", 2) => vec![call("w1", "restart_service", json!({"service": id}))],
        ("HELPER", 1) => vec![call("e2", "echo", json!({"text": format!("helper {id}")}))],
        _ => Vec::new(),
    };
    if calls.is_empty() {
        let answer =
            json!({"confidence": 0.9, "summary": format!("done {id}"), "next_step_context": ""});
        json!({"role": "assistant", "content": answer.to_string()})
    } else {
        json!({"role": "assistant", "content": null, "tool_calls": calls})
    }
}

/// A delay in `range` ms, the same for the same seed and request.
fn delay(seed: u64, what: &str, range: std::ops::Range<u64>) -> Duration {
    let h = blake3::hash(format!("{seed}:{what}").as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from_le_bytes(b));
    Duration::from_millis(rng.gen_range(range))
}

async fn peer(seed: u64) -> HoldingPeer {
    HoldingPeer::start(move |r| match r.path.as_str() {
        MODEL => {
            let a = ask_of(&r.json());
            let body = json!({"choices": [{"index": 0, "message": model_message(&a)}],
                              "usage": {"prompt_tokens": 10, "completion_tokens": 1}});
            let what = format!("{}:{}:{}", a.run, a.agent, a.turn);
            Answer::Reply(Reply::json(200, body).delayed(delay(seed, &what, 150..800)))
        }
        _ => Answer::Reply(Reply::text(200, "restarted").delayed(delay(seed, r.key(), 300..1200))),
    })
    .await
}

/// The scratch folder and the file the MCP server records its calls in.
fn setup(peer: &HoldingPeer) -> (Scratch, std::path::PathBuf) {
    let dir = Scratch::new();
    let record = dir.root.join("mcp-record.jsonl");
    let server =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp/stdio_server.py");
    let url = peer.url();
    // Every run may live through all the kills: each is a resume.
    dir.write_config(&format!(
        "durability: {{max_resume_attempts: 50}}\n\
         providers:\n  fake: {{base_url: \"{url}/v1\"}}\n\
         agents:\n  \
         lead: {{provider: fake, model: m, system_prompt: LEAD, delegates: [helper], tools: [restart_service, {{mcp: k8s, only: [echo]}}]}}\n  \
         helper: {{provider: fake, model: m, system_prompt: HELPER, tools: [{{mcp: k8s, only: [echo]}}]}}\n\
         tools:\n  restart_service:\n    description: Restart one deployment\n    \
         parameters: {{type: object, properties: {{service: {{type: string}}}}, required: [service]}}\n    \
         webhook: {{url: \"{url}{TOOL}\"}}\n\
         mcp_servers:\n  k8s: {{command: [python3, {server:?}], env: {{MCP_RECORD: {record:?}}}, timeout_seconds: 10}}\n",
        server = server.display().to_string(),
        record = record.display().to_string(),
    ));
    // `durable: true`: a write call in flight at a kill is run again (rerun).
    dir.write_pipeline(
        "p",
        "name: p\nstage: production\ntrigger: {}\ndurable: true\nsteps:\n  - name: triage\n    executor: agent\n    executor_config: {agent: lead}\n    prompt_template: \"run={{ pipeline_run_id }}\"\n",
    );
    (dir, record)
}

/// One request for an effect, wherever it was seen: when (wall ms) and with which
/// attempt (0 for a model request, which carries none).
#[derive(Debug, Clone, Copy)]
struct Copy {
    at_ms: i64,
    attempt: u64,
}

/// Checks the copies of one turn or call against its journal row (`finished_at`,
/// `attempt`) and the restarts: copy k+1 was sent by a later process than copy k
/// (a `serve` never repeats one by itself), no copy was sent after the row
/// recorded its final result, and (calls) the attempts rise to the recorded one.
/// A repeat after an earlier record rewrites the row; the completion events catch
/// that one.
///
/// A copy's process is judged by the restarts, not the kills: a request the
/// killed process wrote just before it died can reach the peer a moment after
/// the kill was sent, but never after the next process was started (the killed
/// one is reaped first, and a new one must boot before it asks anything).
fn check_copies(
    what: &str,
    copies: &[Copy],
    finished_at: Option<i64>,
    attempt: Option<u64>,
    starts_ms: &[i64],
) {
    let generation = |ms: i64| starts_ms.iter().filter(|k| **k < ms).count();
    assert!(!copies.is_empty(), "{what}: never requested");
    for w in copies.windows(2) {
        assert!(
            generation(w[0].at_ms) < generation(w[1].at_ms),
            "{what}: requested twice by one process: {copies:?} (restarts at {starts_ms:?})"
        );
        if attempt.is_some() {
            assert!(w[0].attempt < w[1].attempt, "{what}: attempts {copies:?}");
        }
    }
    let finished = finished_at.unwrap_or_else(|| panic!("{what}: no finished_at"));
    for c in copies {
        assert!(
            c.at_ms <= finished + CLOCK_SLACK_MS,
            "{what}: requested at {} after its result was recorded at {finished}: {copies:?}",
            c.at_ms
        );
    }
    if let (Some(a), Some(last)) = (attempt, copies.last()) {
        assert_eq!(last.attempt, a, "{what}: the last attempt is recorded");
    }
}

/// Asserts that `run` logged `event` exactly once for each distinct value of
/// `fields`, and `n` times in all.
fn once_each(id: &str, run: &Value, event: &str, fields: &[&str], n: usize) {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for e in events(run, event) {
        let key: Vec<String> = fields.iter().map(|f| e[*f].to_string()).collect();
        *seen.entry(key.join(" ")).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{id}: {event} more than once: {twice:?}");
    assert_eq!(seen.len(), n, "{id}: {event}: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_delegating_tool_using_runs_survive_ten_random_kills_without_a_repeated_effect() {
    let seed = std::env::var("VECTORSTEP_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| wall_ms() as u64);
    eprintln!("soak: seed {seed} (replay with VECTORSTEP_SOAK_SEED={seed})");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // Instants of the peer and the kills, as wall-clock ms (the journal's clock).
    let base = (Instant::now(), wall_ms());
    let to_ms = |t: Instant| base.1 + t.duration_since(base.0).as_millis() as i64;

    let peer = peer(seed).await;
    let (dir, record) = setup(&peer);

    let t0 = Instant::now();
    let mut svc = Service::start(&dir.root).await;
    let mut ids = Vec::new();
    for _ in 0..RUNS {
        ids.push(svc.post_run("p", json!({})).await);
    }
    for k in 1..=KILLS {
        let after = rng.gen_range(150..900u64);
        tokio::time::sleep(Duration::from_millis(after)).await;
        let running = svc
            .list_runs()
            .await
            .iter()
            .filter(|r| r["status"] == "running")
            .count();
        svc.kill9();
        eprintln!(
            "soak: kill {k} {after} ms after ready, at t = {} ms, {running} run(s) running",
            t0.elapsed().as_millis()
        );
        svc.restart().await;
    }
    let mut runs = Vec::new();
    for id in &ids {
        let run = svc
            .wait_until(id, |r| r["status"] != "running", Duration::from_secs(40))
            .await;
        assert_eq!(run["status"], "completed", "{id}: {:?}", event_names(&run));
        assert_eq!(
            step(&run, "triage")["output"]["summary"],
            format!("done {id}")
        );
        runs.push(run);
    }
    eprintln!(
        "soak: all {RUNS} runs completed at t = {} ms",
        t0.elapsed().as_millis()
    );

    let starts_ms: Vec<i64> = svc.starts.iter().map(|t| to_ms(*t)).collect();
    let mut asks: BTreeMap<Ask, Vec<Copy>> = BTreeMap::new();
    for r in peer.for_path(MODEL) {
        let copy = Copy {
            at_ms: to_ms(r.at),
            attempt: 0,
        };
        asks.entry(ask_of(&r.json())).or_default().push(copy);
    }
    let mut effects: BTreeMap<String, Vec<Copy>> = BTreeMap::new();
    for r in peer.for_path(TOOL) {
        let copy = Copy {
            at_ms: to_ms(r.at),
            attempt: u64::from(r.attempt()),
        };
        effects.entry(r.key().to_string()).or_default().push(copy);
    }
    let text = std::fs::read_to_string(&record).unwrap_or_default();
    for c in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["event"] == "call")
    {
        let key = c["meta"]["vectorstep/effect_key"].as_str().unwrap_or("");
        let copy = Copy {
            at_ms: c["at_ms"].as_i64().expect("the record's time"),
            attempt: c["meta"]["vectorstep/attempt"].as_u64().unwrap_or(0),
        };
        effects.entry(key.to_string()).or_default().push(copy);
    }

    // The rules (docs/agents.md, "The step journal"; docs/durability.md): a turn
    // recorded `completed` is never requested again, one in flight at a kill is
    // requested again; a call whose result was recorded is never run again, a read
    // call or (under `on_interrupted: rerun`) a write call in flight at a kill is
    // run again with the same effect key and attempt + 1. So every copy of a turn
    // or a call comes from a different process, and none after its row recorded
    // the result.
    //
    // A turn's `agent_turn_completed` event is committed with its `completed` row,
    // a call's `tool_call_completed` with its result: one of each per turn and per
    // call means none was asked or run again once recorded (rows are upserted, so
    // only the events keep every completion).
    for (id, run) in ids.iter().zip(&runs) {
        once_each(id, run, "agent_turn_completed", &["step", "turn"], 5);
        // Per run: the lead's delegate and echo, its restart, the helper's echo.
        once_each(
            id,
            run,
            "tool_call_completed",
            &["step", "turn", "call_index"],
            4,
        );
    }
    let store = dir.open_store();
    let (mut reasked, mut rerun) = (0, 0);
    for id in &ids {
        let j = store.journal(id, "triage").expect("the journal reads");
        assert_eq!(
            j.turns.len(),
            5,
            "{id}: 3 turns of the lead, 2 of the helper"
        );
        for t in &j.turns {
            assert_eq!(t.status, TurnStatus::Completed, "{id}: {t:?}");
            let agent = if t.step_path == "triage" {
                "LEAD"
            } else {
                "HELPER"
            };
            let ask = Ask {
                run: id.clone(),
                agent: agent.to_string(),
                turn: t.turn,
            };
            let copies = asks.remove(&ask).unwrap_or_default();
            reasked += copies.len().saturating_sub(1);
            check_copies(
                &format!("{ask:?}"),
                &copies,
                t.finished_at,
                None,
                &starts_ms,
            );
        }
        let calls: Vec<_> = j.calls.iter().filter(|c| c.tool != "delegate").collect();
        assert_eq!(
            calls.len(),
            3,
            "{id}: two reads and one write: {:?}",
            j.calls
        );
        for c in calls {
            assert_eq!(c.status, ToolCallStatus::Completed, "{id}: {c:?}");
            let copies = effects.remove(&c.effect_key).unwrap_or_default();
            rerun += copies.len().saturating_sub(1);
            let what = format!("{} {}", c.tool, c.effect_key);
            check_copies(
                &what,
                &copies,
                c.finished_at,
                Some(u64::from(c.attempt)),
                &starts_ms,
            );
        }
    }
    assert!(
        asks.is_empty(),
        "model requests of no journaled turn: {asks:?}"
    );
    assert!(
        effects.is_empty(),
        "tool requests of no journaled call: {effects:?}"
    );
    eprintln!(
        "soak: {} model requests ({reasked} asked again after a kill), {rerun} tool call(s) run again",
        peer.count_path(MODEL)
    );
    assert!(
        reasked > 0,
        "no kill landed while a model request was in flight: the soak tested nothing"
    );
}
