//! Several `serve` replicas on one PostgreSQL database (docs/replicas.md): a
//! replica killed with its runs in flight has them adopted by another, and a
//! replica frozen past its lease (SIGSTOP) that wakes up finds its writes refused
//! and changes nothing any more.
//!
//! Real processes, a real throwaway PostgreSQL and a webhook peer on 127.0.0.1
//! that logs every request (idempotency key, attempt, when). The tests of this
//! binary run one at a time: each freezes or kills processes at chosen moments.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::crash_support::{events, Scratch, Service};
use common::peer::{Answer, HoldingPeer, Reply, Seen};
use serde_json::{json, Value};
use vectorstep::store::Store;

/// One test at a time: they kill and freeze processes by the clock.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `steps` durable webhook steps posting to `url`.
fn pipeline(url: &str, steps: usize) -> String {
    let mut yaml = "name: p\ntrigger: {match: {source: generic}}\nstage: production\ndurable: {on_interrupted: rerun}\nsteps:\n".to_string();
    for i in 0..steps {
        yaml.push_str(&format!(
            "  - name: s{i}\n    executor: webhook\n    executor_config: {{url: \"{url}/step\", timeout_seconds: 60}}\n    prompt_template: '{{\"step\": \"s{i}\"}}'\n"
        ));
    }
    yaml
}

/// Two scratch folders (own config and log each) on one fresh PostgreSQL database.
fn two_replicas(pipeline_yaml: &str) -> (Scratch, Scratch) {
    let first = Scratch::on_postgres();
    let second = Scratch::on(first.database.clone());
    for s in [&first, &second] {
        s.write_pipeline("p", pipeline_yaml);
    }
    (first, second)
}

/// The id of the one replica not in `known` that has not stopped.
fn new_replica(store: &Store, known: &[String]) -> String {
    let ids: Vec<String> = store
        .replicas()
        .expect("replicas")
        .into_iter()
        .filter(|r| r.stopped_at.is_none() && !known.contains(&r.id))
        .map(|r| r.id)
        .collect();
    assert_eq!(ids.len(), 1, "one new replica: {ids:?}");
    ids.into_iter().next().expect("one")
}

/// Starts replicas A and B, each ready, and returns them with their replica ids.
async fn start_pair(
    a_dir: &Scratch,
    b_dir: &Scratch,
    store: &Store,
) -> (Service, String, Service, String) {
    let a = Service::start(&a_dir.root).await;
    a.wait_ready().await;
    let a_id = new_replica(store, &[]);
    let b = Service::start(&b_dir.root).await;
    b.wait_ready().await;
    let b_id = new_replica(store, std::slice::from_ref(&a_id));
    (a, a_id, b, b_id)
}

/// The requests for each idempotency key.
fn by_key(peer: &HoldingPeer) -> BTreeMap<String, Vec<Seen>> {
    peer.for_path("/step")
        .into_iter()
        .fold(BTreeMap::new(), |mut m, r| {
            m.entry(r.key().to_string()).or_default().push(r);
            m
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_replicas_runs_are_adopted_by_another_and_no_finished_step_runs_again() {
    let _serial = SERIAL.lock().await;
    const RUNS: usize = 12;
    const STEPS: usize = 4;
    let peer = HoldingPeer::start(|r| {
        // 200-400 ms per request, by its key: long enough that a kill lands on
        // steps in flight.
        let ms = 200 + (r.seq % 5) as u64 * 50;
        Answer::Reply(
            Reply::output(1.0, &format!("attempt {}", r.attempt()))
                .delayed(Duration::from_millis(ms)),
        )
    })
    .await;
    let (a_dir, b_dir) = two_replicas(&pipeline(&peer.url(), STEPS));
    let store = a_dir.open_store();
    let mut a = Service::start(&a_dir.root).await;
    let a_id = new_replica(&store, &[]);
    let b = Service::start(&b_dir.root).await;
    let b_id = new_replica(&store, std::slice::from_ref(&a_id));

    let mut ids = Vec::new();
    for i in 0..RUNS {
        ids.push(a.post_run("p", json!({"n": i})).await);
    }
    // Kill A while its runs are between their first and last steps.
    peer.wait_for("a third of the steps requested", |seen| {
        seen.len() >= RUNS * STEPS / 3
    })
    .await;
    a.kill9();
    let killed_at = Instant::now();
    let in_flight: Vec<String> = peer
        .for_path("/step")
        .into_iter()
        .filter(|r| !r.answered)
        .map(|r| r.key().to_string())
        .collect();
    eprintln!(
        "failover: killed A with {} request(s) in flight",
        in_flight.len()
    );

    let mut adopted = 0;
    for id in &ids {
        let run = b
            .wait_until(id, |r| r["status"] != "running", Duration::from_secs(30))
            .await;
        assert_eq!(run["status"], "completed", "{id}: {run}");
        let resumed = events(&run, "run_resumed");
        if let Some(e) = resumed.first() {
            assert_eq!(resumed.len(), 1, "{id}: adopted once: {resumed:?}");
            assert_eq!(e["from_replica"], a_id.as_str(), "{id}: {e}");
            assert_eq!(e["replica"], b_id.as_str(), "{id}: {e}");
            adopted += 1;
        }
        let record = store.run(id).expect("read").expect("run");
        let lease = store.lease(id).expect("read lease");
        if !resumed.is_empty() {
            assert_eq!(
                lease.map(|l| l.owner),
                Some(b_id.clone()),
                "{id}: adopted under B's lease ({record:?})"
            );
        }
    }
    assert!(
        adopted > 0,
        "some runs were running at the kill and were adopted"
    );
    eprintln!(
        "failover: {adopted} run(s) adopted; all done {:?} after the kill",
        killed_at.elapsed()
    );

    // Each (run, step) was requested once, or twice only when the first request
    // was in flight at the kill; the second carries the next attempt.
    let seen = by_key(&peer);
    assert_eq!(
        seen.len(),
        RUNS * STEPS,
        "every step of every run requested"
    );
    for (key, copies) in &seen {
        match copies.len() {
            1 => {}
            2 => {
                assert!(
                    in_flight.contains(key),
                    "{key}: requested again though it was not in flight at the kill"
                );
                assert!(copies[1].attempt() > copies[0].attempt(), "{key}: attempts");
            }
            n => panic!("{key}: requested {n} times"),
        }
    }

    // B counts what it adopted.
    let metrics = reqwest::get(b.url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let line = metrics
        .lines()
        .find(|l| l.starts_with("vectorstep_runs_adopted_total{"))
        .unwrap_or_else(|| panic!("no runs_adopted_total in:\n{metrics}"));
    let n: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a count");
    assert_eq!(n as usize, adopted, "{line}");
}

/// Waits (on `b`) until run `id` ends, and checks that it completed, adopted once
/// by replica `to` from replica `from`; returns the run and its `run_resumed`.
async fn adopted_once(
    b: &Service,
    id: &str,
    from: &str,
    to: &str,
    within: Duration,
) -> (Value, Value) {
    let run = b.wait_until(id, |r| r["status"] != "running", within).await;
    assert_eq!(run["status"], "completed", "{run}");
    let resumed: Vec<Value> = events(&run, "run_resumed").into_iter().cloned().collect();
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0]["from_replica"], from);
    assert_eq!(resumed[0]["replica"], to);
    let first = resumed[0].clone();
    (run, first)
}

/// Sends `signal` to the service's process.
/// The tick (unix ms) a cron run fired for, checked against the run's id: every
/// replica names a tick's run alike.
fn tick_of(run: &vectorstep::store::RunRecord) -> i64 {
    let context: serde_json::Value = serde_json::from_str(&run.context_json).expect("context JSON");
    let at = context["metadata"]["scheduled_for"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.timestamp_millis())
        .unwrap_or_else(|| panic!("{}: no scheduled_for in {context}", run.id));
    assert_eq!(
        run.id,
        vectorstep::runner::schedule::tick_run_id(&run.pipeline_name, at),
        "a tick's run is named by its tick"
    );
    at
}

fn signal(svc: &Service, signal: libc::c_int) {
    // SAFETY: a signal to our own child, which has not been reaped.
    let rc = unsafe { libc::kill(svc.pid() as libc::pid_t, signal) };
    assert_eq!(rc, 0, "kill({signal})");
}

/// What the store holds of a run: its steps and its log, for before/after checks.
fn snapshot(store: &Store, id: &str) -> (String, Vec<String>) {
    let steps = format!("{:?}", store.steps(id).expect("steps"));
    let log: Vec<String> = store
        .events(id)
        .expect("events")
        .into_iter()
        .map(|e| format!("{e:?}"))
        .collect();
    (steps, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_replica_that_wakes_after_its_runs_were_adopted_changes_nothing() {
    let _serial = SERIAL.lock().await;
    // The first request of the run's one step is answered after 6 s (A is frozen
    // meanwhile); the adopter's is answered at once.
    let peer = HoldingPeer::start(|r| {
        let reply = Reply::output(1.0, &format!("attempt {}", r.attempt()));
        if r.attempt() <= 1 {
            Answer::Reply(reply.delayed(Duration::from_secs(6)))
        } else {
            Answer::Reply(reply)
        }
    })
    .await;
    let (a_dir, b_dir) = two_replicas(&pipeline(&peer.url(), 1));
    let store = a_dir.open_store();
    let a = Service::start(&a_dir.root).await;
    let a_id = new_replica(&store, &[]);
    let b = Service::start(&b_dir.root).await;
    let b_id = new_replica(&store, std::slice::from_ref(&a_id));

    let id = a.post_run("p", json!({})).await;
    peer.wait_for_path("/step", 1).await;
    // Frozen with its request in flight and its session open: the lease (3 s) runs
    // out, and B adopts the run by time.
    signal(&a, libc::SIGSTOP);
    let (run, _) = adopted_once(&b, &id, &a_id, &b_id, Duration::from_secs(30)).await;
    let lease = store.lease(&id).expect("lease").expect("leased");
    assert_eq!(lease.owner, b_id, "B holds it now: {lease:?}");
    let before = snapshot(&store, &id);

    // A wakes; its request's answer arrives and its commit is refused.
    signal(&a, libc::SIGCONT);
    peer.wait_for("A's request answered", |seen| {
        seen.iter().any(|r| r.attempt() <= 1 && r.answered)
    })
    .await;
    let said_stopped = || {
        std::fs::read_to_string(a_dir.root.join("serve.log"))
            .unwrap_or_default()
            .contains("another replica has taken it over")
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !said_stopped() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Give a zombie every chance to write something more.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        snapshot(&store, &id),
        before,
        "A changed nothing after it woke"
    );
    assert!(
        said_stopped(),
        "A said it stopped driving the run\n{}",
        a.log_tail()
    );
    let step = &store.steps(&id).expect("steps")[0];
    assert_eq!(
        step.attempts, 2,
        "B's attempt is the one recorded: {step:?}"
    );
    assert!(
        step.output_json
            .as_deref()
            .unwrap_or("")
            .contains("attempt 2"),
        "B's answer is the recorded output: {step:?}"
    );
    assert_eq!(events(&run, "step_completed").len(), 1);
    let record = store.run(&id).expect("read").expect("run");
    assert_eq!(record.resume_count, 1, "{record:?}");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cron_tick_fires_once_across_replicas() {
    let _serial = SERIAL.lock().await;
    let tick = "name: tick\ntrigger: {match: {source: scheduler}}\nstage: production\nschedule: {cron: \"* * * * * *\", summary: every second}\nsteps:\n  - {name: a, executor: mock}\n";
    let (a_dir, b_dir) = two_replicas(tick);
    let store = a_dir.open_store();
    let a = Service::start(&a_dir.root).await;
    let b = Service::start(&b_dir.root).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut ticks: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for run in a.list_runs().await {
        let id = run["id"].as_str().expect("id").to_string();
        let record = store.run(&id).expect("read").expect("run");
        ticks.entry(tick_of(&record)).or_default().push(id);
    }
    let twice: Vec<_> = ticks.iter().filter(|(_, ids)| ids.len() > 1).collect();
    assert!(twice.is_empty(), "ticks fired more than once: {twice:?}");
    assert!(
        ticks.len() >= 4,
        "a once-a-second schedule fired {} tick(s) in 6 s on two replicas",
        ticks.len()
    );
    let seconds: Vec<i64> = ticks.keys().map(|t| t / 1000).collect();
    assert!(
        seconds.windows(2).all(|w| w[1] == w[0] + 1),
        "every tick fired, none skipped: {seconds:?}"
    );
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_notification_retried_by_several_replicas_is_sent_once() {
    let _serial = SERIAL.lock().await;
    // The first attempt fails; the retry is answered after 1.5 s, longer than the
    // retry passes (1 s) of both replicas, which both find the row due meanwhile.
    let peer = HoldingPeer::start(|r| {
        if r.seq_key == 0 {
            Answer::Reply(Reply::json(503, json!({"down": true})))
        } else {
            Answer::Reply(
                Reply::json(200, json!({"ok": true})).delayed(Duration::from_millis(1_500)),
            )
        }
    })
    .await;
    let notifying = format!(
        "name: p\nstage: production\ntrigger: {{match: {{source: generic}}}}\nsteps:\n  - name: tell\n    executor: notify\n    executor_config: {{channel: webhook, url: \"{}/hook\"}}\n    prompt_template: \"ping {{{{ pipeline_run_id }}}}\"\n",
        peer.url()
    );
    let (a_dir, b_dir) = two_replicas(&notifying);
    let a = Service::start(&a_dir.root).await;
    let b = Service::start(&b_dir.root).await;
    let id = a.post_run("p", json!({})).await;
    b.wait_event(&id, "notification_sent").await;
    // Every pass of both replicas has seen it delivered by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let run = b.get_run(&id).await;
    let key = format!("{id}:tell:1:notify");
    let sent = peer.for_key(&key);
    assert_eq!(
        sent.len(),
        2,
        "one failed attempt and one delivery, not one per replica: {:?}",
        sent.iter().map(|r| r.seq).collect::<Vec<_>>()
    );
    assert_eq!(events(&run, "notification_sent").len(), 1, "{run}");
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_telegram_poller_moves_to_another_replica_and_a_press_made_meanwhile_applies_once() {
    let _serial = SERIAL.lock().await;
    let tg = common::telegram::FakeTelegram::start().await;
    let gate = common::approvals::gate("gate", "production", 120.0);
    let (a_dir, b_dir) = two_replicas(&gate);
    for dir in [&a_dir, &b_dir] {
        dir.write_config(&format!(
            "{}human_approval:\n  ui_base_url: \"http://vs.example/\"\n  approvers: [\"42\"]\n",
            tg.config()
        ));
    }
    let store = a_dir.open_store();
    let a = Service::start(&a_dir.root).await;
    let a_id = new_replica(&store, &[]);
    let b = Service::start(&b_dir.root).await;
    let b_id = new_replica(&store, std::slice::from_ref(&a_id));
    let poller = |store: &Store| {
        store
            .named_lease("telegram_poller")
            .expect("read the lease")
            .map(|l| l.owner)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(owner) = poller(&store) {
            break owner;
        }
        assert!(Instant::now() < deadline, "nobody took the poller lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Both replicas run for a while: only the holder polls.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(tg.conflicts(), 0, "two replicas polled at once");
    let (mut holder, survivor, survivor_id) = if first == a_id {
        (a, b, b_id)
    } else {
        (b, a, a_id)
    };

    // A run on the survivor waits for its approval message.
    let run = survivor.post_run("gate", json!({})).await;
    let approval = loop {
        if let Some(a) = store
            .approvals_of_run(&run)
            .expect("approvals")
            .into_iter()
            .find(|a| a.delivery_json.is_some())
        {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let delivery: serde_json::Value =
        serde_json::from_str(approval.delivery_json.as_deref().unwrap_or("{}")).expect("delivery");
    let (chat, msg) = (
        delivery["chat_id"].as_i64().expect("chat"),
        delivery["message_id"].as_i64().expect("message"),
    );

    // The poller dies; the button is pressed before anyone polls again.
    holder.kill9();
    let killed = Instant::now();
    let press = tg.press(42, chat, msg, &format!("approve:{}", approval.token));
    let deadline = Instant::now() + Duration::from_secs(3 + 5);
    while poller(&store).as_deref() != Some(survivor_id.as_str()) {
        assert!(
            Instant::now() < deadline,
            "the survivor did not take the poller lease within lease + 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("poller: taken over {:?} after the kill", killed.elapsed());
    assert_eq!(tg.answer_to(press).await, "Approved");
    let done = survivor.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(events(&done, "approval_decided").len(), 1, "{done}");
    assert_eq!(tg.conflicts(), 0, "Telegram never saw two pollers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_alert_sent_to_two_replicas_at_once_starts_one_run() {
    let _serial = SERIAL.lock().await;
    const KEYS: usize = 15;
    let p = "name: p\nstage: production\ntrigger:\n  match: {source: generic}\n  dedup: {enabled: true, window_seconds: 300}\nsteps:\n  - {name: a, executor: mock, executor_config: {delay_ms: 500}}\n";
    let (a_dir, b_dir) = two_replicas(p);
    let store = a_dir.open_store();
    let a = Service::start(&a_dir.root).await;
    let b = Service::start(&b_dir.root).await;
    let http = reqwest::Client::new();
    let post = |url: String, key: String| {
        let http = http.clone();
        async move {
            let resp = http
                .post(url)
                .json(&json!({"idempotency_key": key}))
                .send()
                .await
                .expect("POST");
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.expect("JSON");
            (status, body)
        }
    };
    for k in 0..KEYS {
        let key = format!("alert-{k}");
        let (x, y) = tokio::join!(
            post(a.url("/pipelines/p/run"), key.clone()),
            post(b.url("/pipelines/p/run"), key.clone())
        );
        let mut statuses = [x.1["status"].to_string(), y.1["status"].to_string()];
        statuses.sort();
        assert_eq!(
            statuses,
            ["\"accepted\"", "\"deduplicated\""],
            "{key}: one run, one duplicate: {x:?} {y:?}"
        );
        assert_eq!(x.1["run_id"], y.1["run_id"], "{key}: both name the one run");
    }
    let runs = store
        .runs(&vectorstep::store::RunFilter {
            limit: 1000,
            ..Default::default()
        })
        .expect("runs");
    assert_eq!(runs.len(), KEYS, "one run per alert");
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_stopped_with_sigterm_hands_its_runs_over_at_a_step_boundary() {
    let _serial = SERIAL.lock().await;
    let peer = HoldingPeer::start(|r| {
        Answer::Reply(
            Reply::output(1.0, &format!("attempt {}", r.attempt()))
                .delayed(Duration::from_millis(700)),
        )
    })
    .await;
    let (a_dir, b_dir) = two_replicas(&pipeline(&peer.url(), 3));
    // A sweep every 30 s: within the 20 s allowed below only the notice A sends as
    // it lets its runs go can wake B's.
    for d in [&a_dir, &b_dir] {
        let text = std::fs::read_to_string(d.config_path()).expect("config");
        let slow = text.replace(
            common::backend::TEST_REPLICA_YAML,
            "replica: {lease_seconds: 61, heartbeat_seconds: 30}",
        );
        assert_ne!(slow, text, "the replica settings are in the config");
        std::fs::write(d.config_path(), slow).expect("config");
    }
    let store = a_dir.open_store();
    let (mut a, a_id, b, b_id) = start_pair(&a_dir, &b_dir, &store).await;
    let id = a.post_run("p", json!({})).await;
    peer.wait_for_path("/step", 1).await;
    // The step in flight finishes and is recorded; then A lets the run go.
    let status = a.sigterm(Duration::from_secs(20)).await;
    assert!(status.success(), "{status:?}");
    let (_, resumed) = adopted_once(&b, &id, &a_id, &b_id, Duration::from_secs(20)).await;
    assert_eq!(resumed["in_flight"], json!([]), "nothing was in flight");
    let record = store.run(&id).expect("read").expect("run");
    assert_eq!(
        record.resume_count, 0,
        "a clean handoff is not a resume attempt: {record:?}"
    );
    for step in store.steps(&id).expect("steps") {
        assert_eq!(step.attempts, 1, "each step ran once: {step:?}");
    }
    assert_eq!(peer.count_path("/step"), 3);
    let log = std::fs::read_to_string(b_dir.root.join("serve.log")).expect("B's log");
    let adopting: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Adopting a run nobody drives any more"))
        .collect();
    assert!(
        adopting.len() == 1 && adopting[0].contains("notified"),
        "B's sweep was woken by A's notice: {adopting:?}"
    );
}

/// A delay in `range` ms, the same for the same seed and key.
fn seeded_delay(seed: u64, key: &str, range: std::ops::Range<u64>) -> Duration {
    use rand::{Rng, SeedableRng};
    let h = blake3::hash(format!("{seed}:{key}").as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from_le_bytes(b));
    Duration::from_millis(rng.gen_range(range))
}

/// A SIGKILL of the chaos test: when, and which replica (its boot's id) died.
struct Kill {
    at: Instant,
    replica: String,
}

/// The replica that sent a request (`X-Vectorstep-Replica`).
fn sender(copy: &Seen) -> &str {
    copy.headers
        .get("x-vectorstep-replica")
        .map(String::as_str)
        .unwrap_or_else(|| panic!("a request without its replica: {:?}", copy.headers))
}

/// Checks the copies of one effect (a step's request, a notification): each
/// repeat follows the kill of the replica that sent the copy before it, after
/// that copy was sent (it was in flight, or unrecorded, when its replica died),
/// comes from another replica, and carries a higher attempt where the effect has
/// one.
fn check_repeats(what: &str, copies: &[Seen], kills: &[Kill], attempts: bool) {
    assert!(!copies.is_empty(), "{what}: never sent");
    for w in copies.windows(2) {
        let (before, again) = (sender(&w[0]), sender(&w[1]));
        assert!(
            kills
                .iter()
                .any(|k| k.replica == before && w[0].at <= k.at && k.at <= w[1].at),
            "{what}: sent again by {again} although {before}, which sent it before, was not killed in between"
        );
        assert_ne!(before, again, "{what}: one replica sent it twice");
        if attempts {
            assert!(
                w[1].attempt() > w[0].attempt(),
                "{what}: attempts do not rise"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_lose_nothing_and_repeat_nothing_finished_through_a_kill_every_ten_seconds()
{
    use rand::{Rng, SeedableRng};
    let _serial = SERIAL.lock().await;
    const REPLICAS: usize = 3;
    // 18 rounds of 10 s: about 300 runs over 3 minutes, a kill every 10 s.
    const ROUNDS: usize = 18;
    const RUNS_PER_ROUND: usize = 17;
    const ROUND: Duration = Duration::from_secs(10);
    let seed = std::env::var("VECTORSTEP_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_millis() as u64)
        });
    eprintln!("chaos: seed {seed} (replay with VECTORSTEP_CHAOS_SEED={seed})");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let peer = HoldingPeer::start(move |r| {
        let d = seeded_delay(seed, r.key(), 50..500);
        Answer::Reply(Reply::output(1.0, "ok").delayed(d))
    })
    .await;
    // Four webhook steps, then a notification; and a 1 s cron beside them.
    let mut five = pipeline(&peer.url(), 4);
    five.push_str(&format!(
        "  - name: tell\n    executor: notify\n    executor_config: {{channel: webhook, url: \"{}/notify\"}}\n    prompt_template: \"done {{{{ pipeline_run_id }}}}\"\n",
        peer.url()
    ));
    let tick = "name: tick\ntrigger: {match: {source: scheduler}}\nstage: production\nschedule: {cron: \"* * * * * *\", summary: every second}\nsteps:\n  - {name: a, executor: mock}\n";
    let first = Scratch::on_postgres();
    let mut dirs = vec![first];
    for _ in 1..REPLICAS {
        dirs.push(Scratch::on(dirs[0].database.clone()));
    }
    for d in &dirs {
        d.write_pipeline("p", &five);
        d.write_pipeline("tick", tick);
    }
    let store = dirs[0].open_store();
    let mut svcs = Vec::new();
    // Every replica id seen so far, and the one each slot runs now.
    let mut known: Vec<String> = Vec::new();
    let mut running_as = Vec::new();
    for d in &dirs {
        let svc = Service::start(&d.root).await;
        svc.wait_ready().await;
        let id = new_replica(&store, &known);
        known.push(id.clone());
        running_as.push(id);
        svcs.push(svc);
    }
    let t0 = Instant::now();
    let mut ids = Vec::new();
    let mut kills = Vec::new();
    for round in 0..ROUNDS {
        // Runs keep arriving until the kill, so it lands on steps in flight.
        let gap = ROUND / RUNS_PER_ROUND as u32;
        for _ in 0..RUNS_PER_ROUND {
            let to = rng.gen_range(0..REPLICAS);
            ids.push(svcs[to].post_run("p", json!({})).await);
            let jitter = rng.gen_range(0..100);
            tokio::time::sleep(
                gap.saturating_sub(Duration::from_millis(50)) + Duration::from_millis(jitter),
            )
            .await;
        }
        let victim = rng.gen_range(0..REPLICAS);
        svcs[victim].kill9();
        kills.push(Kill {
            at: Instant::now(),
            replica: running_as[victim].clone(),
        });
        eprintln!(
            "chaos: round {round}: killed replica {victim} ({}) at t = {} ms",
            running_as[victim],
            t0.elapsed().as_millis()
        );
        svcs[victim].restart().await;
        let id = new_replica(&store, &known);
        known.push(id.clone());
        running_as[victim] = id;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    for id in &ids {
        loop {
            let run = store.run(id).expect("read").expect("run");
            if run.status != vectorstep::domain::RunStatus::Running {
                assert_eq!(
                    run.status,
                    vectorstep::domain::RunStatus::Completed,
                    "{id}: {run:?}"
                );
                break;
            }
            assert!(Instant::now() < deadline, "{id} still running: {run:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Notifications are sent after the run is recorded finished: give the last
    // ones (and any wrong repeat) time to arrive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    eprintln!(
        "chaos: {} runs done at t = {} ms, {} kills",
        ids.len(),
        t0.elapsed().as_millis(),
        kills.len()
    );

    let steps = by_key(&peer);
    let mut repeated = 0;
    for id in &ids {
        for s in 0..4 {
            let key = format!("{id}:s{s}:1");
            let copies = steps.get(&key).cloned().unwrap_or_default();
            repeated += copies.len().saturating_sub(1);
            check_repeats(&key, &copies, &kills, true);
        }
        let key = format!("{id}:tell:1:notify");
        let sent = peer.for_key(&key);
        check_repeats(&key, &sent, &kills, false);
        let record = store.steps(id).expect("steps");
        assert_eq!(
            record.len(),
            5,
            "{id}: every step recorded once: {record:?}"
        );
    }
    eprintln!("chaos: {repeated} step request(s) repeated after kills");
    assert!(
        repeated > 0,
        "no kill landed on a step in flight: the chaos tested nothing"
    );
    // The cron: every tick fired exactly once across the replicas, as the run
    // named by its tick.
    let mut ticks: BTreeMap<i64, usize> = BTreeMap::new();
    for run in store
        .runs(&vectorstep::store::RunFilter {
            pipeline: Some("tick".into()),
            limit: 10_000,
            ..Default::default()
        })
        .expect("runs")
    {
        let at = tick_of(&run);
        *ticks.entry(at / 1000).or_default() += 1;
    }
    let twice: Vec<_> = ticks.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "cron ticks fired twice: {twice:?}");
    let (first_tick, last_tick) = (
        *ticks.keys().next().expect("the cron fired"),
        *ticks.keys().last().expect("the cron fired"),
    );
    let missing: Vec<i64> = (first_tick..=last_tick)
        .filter(|t| !ticks.contains_key(t))
        .collect();
    eprintln!(
        "chaos: cron fired {} ticks, {} missing, none twice",
        ticks.len(),
        missing.len()
    );
    // The tick's advance and its run are one commit, so a kill loses neither
    // half alone: a gap would be a lost tick.
    assert!(missing.is_empty(), "cron ticks never fired: {missing:?}");
    drop(svcs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cli_run_on_postgres_is_a_replica_whose_run_serve_takes_over_once_it_is_killed() {
    let _serial = SERIAL.lock().await;
    // The first request of s1 is never answered: the CLI is mid-step when killed.
    let peer = HoldingPeer::start(|r| {
        if r.key().ends_with(":s1:1") && r.attempt() <= 1 {
            Answer::Never
        } else {
            Answer::Reply(Reply::output(1.0, "ok"))
        }
    })
    .await;
    let (cli_dir, serve_dir) = two_replicas(&pipeline(&peer.url(), 3));
    let store = cli_dir.open_store();
    let log = std::fs::File::create(cli_dir.root.join("cli.log")).expect("log");
    let mut cli = std::process::Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .arg("--config")
        .arg(cli_dir.config_path())
        .args(["run", "p"])
        .current_dir(&cli_dir.root)
        .env_remove("VECTORSTEP_CONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn vectorstep run");
    peer.wait_for("s1 requested", |seen| {
        seen.iter().any(|r| r.key().ends_with(":s1:1"))
    })
    .await;
    let cli_replica = store
        .replicas()
        .expect("replicas")
        .into_iter()
        .find(|r| r.kind == vectorstep::store::ReplicaKind::Run)
        .expect("the CLI registered as a replica of kind run");
    assert_eq!(
        cli_replica.runs.len(),
        1,
        "it leases its run: {cli_replica:?}"
    );
    let id = cli_replica.runs[0].clone();

    // serve leaves the live CLI's run alone, sweep after sweep.
    let svc = Service::start(&serve_dir.root).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let run = svc.get_run(&id).await;
    assert_eq!(run["status"], "running", "{run}");
    assert!(
        events(&run, "run_resumed").is_empty(),
        "taken from a live CLI: {run}"
    );

    // Killed mid-step: serve takes the run over and finishes it.
    cli.kill().expect("SIGKILL");
    cli.wait().expect("reap");
    let run = svc
        .wait_until(&id, |r| r["status"] != "running", Duration::from_secs(30))
        .await;
    assert_eq!(run["status"], "completed", "{run}");
    let resumed = events(&run, "run_resumed");
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0]["from_replica"], cli_replica.id.as_str());
    assert_eq!(resumed[0]["in_flight"], json!(["s1"]));
    assert_eq!(peer.count_path("/step"), 4, "s0 once, s1 twice, s2 once");
}

/// The token of run `id`'s approval once the run is parked with its lease parked
/// (held by nobody while it waits), from the store.
async fn parked_on(store: &Store, id: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lease = store.lease(id).expect("lease");
        let pending = store
            .approvals_of_run(id)
            .expect("approvals")
            .into_iter()
            .find(|a| a.status == vectorstep::domain::ApprovalStatus::Pending);
        if let (Some(l), Some(a)) = (&lease, pending) {
            if l.parked {
                return a.token;
            }
        }
        assert!(Instant::now() < deadline, "{id} never parked: {lease:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_waiting_on_a_human_holds_no_lease_and_any_replica_acts_on_its_decision_or_deadline()
{
    let _serial = SERIAL.lock().await;
    let (a_dir, b_dir) = two_replicas(&common::approvals::gate("p", "production", 8.0));
    let store = a_dir.open_store();
    let (mut a, a_id, b, b_id) = start_pair(&a_dir, &b_dir, &store).await;

    // Parked on A, decided on B: B claims the run and drives it on, while A,
    // alive, holds nothing and writes nothing more for it.
    let run = a.post_run("p", json!({})).await;
    let token = parked_on(&store, &run).await;
    let holding: Vec<(String, Vec<String>)> = store
        .replicas()
        .expect("replicas")
        .into_iter()
        .map(|r| (r.id, r.runs))
        .collect();
    assert!(
        holding.iter().all(|(_, runs)| runs.is_empty()),
        "a waiting run is nobody's: {holding:?}"
    );
    let decided = reqwest::Client::new()
        .post(b.url(&format!("/approvals/{token}")))
        .bearer_auth(b.bearer.clone().unwrap_or_default())
        .json(&json!({"decision": "approve", "by": "alice"}))
        .send()
        .await
        .expect("POST /approvals")
        .status();
    assert_eq!(decided, 200);
    let done = b.wait_terminal(&run).await;
    assert_eq!(done["status"], "completed", "{done}");
    let lease = store.lease(&run).expect("lease").expect("leased");
    assert_eq!(
        (lease.owner.as_str(), lease.epoch),
        (b_id.as_str(), 2),
        "claimed once, by the replica that saw the decision"
    );
    let after = store.steps(&run).expect("steps");
    assert!(
        after.iter().all(|s| s.attempts == 1),
        "each step once: {after:?}"
    );

    // Parked on A, and A killed: B adopts the run to re-arm its wait, and acts
    // on its deadline.
    let run = a.post_run("p", json!({})).await;
    parked_on(&store, &run).await;
    a.kill9();
    let done = b.wait_terminal(&run).await;
    assert_eq!(done["status"], "failed", "timed out: {done}");
    let resumed = events(&done, "run_resumed");
    assert_eq!(resumed.len(), 1, "{done}");
    assert_eq!(resumed[0]["from_replica"], a_id.as_str());
    assert_eq!(resumed[0]["replica"], b_id.as_str());
    assert_eq!(events(&done, "approval_rearmed").len(), 1, "{done}");
    let record = store.run(&run).expect("read").expect("run");
    assert_eq!(
        record.resume_count, 0,
        "a wait moved on is not a resume attempt"
    );
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_cancelled_through_another_replica_stops_where_it_is_driven() {
    let _serial = SERIAL.lock().await;
    let peer = HoldingPeer::start(|_| {
        Answer::Reply(Reply::output(1.0, "ok").delayed(Duration::from_millis(600)))
    })
    .await;
    let (a_dir, b_dir) = two_replicas(&pipeline(&peer.url(), 6));
    let store = a_dir.open_store();
    let a = Service::start(&a_dir.root).await;
    a.wait_ready().await;
    let b = Service::start(&b_dir.root).await;
    b.wait_ready().await;
    let id = a.post_run("p", json!({})).await;
    peer.wait_for_path("/step", 1).await;
    let answer = reqwest::Client::new()
        .post(b.url(&format!("/runs/{id}/cancel")))
        .bearer_auth(b.bearer.clone().unwrap_or_default())
        .json(&json!({"by": "alice"}))
        .send()
        .await
        .expect("POST /runs/{id}/cancel");
    assert_eq!(answer.status(), 200);
    let done = a.wait_terminal(&id).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert_eq!(event_by(&done, "run_cancelled"), "alice");
    let ran = peer.count_path("/step");
    assert!(
        ran < 6,
        "stopped at a step boundary on A: {ran} of 6 steps ran"
    );
    let lease = store.lease(&id).expect("lease").expect("leased");
    assert_eq!(lease.epoch, 1, "A drove it to its end; nobody took it over");
    drop(b);
}

/// The `by` of a run's one `name` event.
fn event_by(run: &Value, name: &str) -> String {
    let found = events(run, name);
    assert_eq!(found.len(), 1, "one {name}: {run}");
    found[0]["by"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_events_stream_of_one_replica_follows_a_run_another_drives() {
    let _serial = SERIAL.lock().await;
    let peer = HoldingPeer::start(|_| {
        Answer::Reply(Reply::output(1.0, "ok").delayed(Duration::from_millis(300)))
    })
    .await;
    let (a_dir, b_dir) = two_replicas(&pipeline(&peer.url(), 4));
    let a = Service::start(&a_dir.root).await;
    a.wait_ready().await;
    let b = Service::start(&b_dir.root).await;
    b.wait_ready().await;
    let id = a.post_run("p", json!({})).await;
    // B streams the log of A's run while A drives it, and ends when it ends.
    let mut resp = reqwest::Client::new()
        .get(b.url(&format!("/runs/{id}/events")))
        .bearer_auth(b.bearer.clone().unwrap_or_default())
        .send()
        .await
        .expect("GET /runs/{id}/events");
    assert_eq!(resp.status(), 200);
    let mut body = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !body.contains("event: end") {
        let chunk = tokio::time::timeout_at(deadline, resp.chunk())
            .await
            .expect("the stream ends with the run")
            .expect("chunk");
        let Some(chunk) = chunk else { break };
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(body.contains("event: end"), "{body}");
    let done = a.wait_terminal(&id).await;
    assert_eq!(done["status"], "completed", "{done}");
    let streamed = body.matches("\nid: ").count() + usize::from(body.starts_with("id: "));
    let logged = done["logs"].as_array().map_or(0, Vec::len);
    assert_eq!(streamed, logged, "every log entry once: {body}");
    assert!(body.contains("\"step_completed\""), "{body}");
    drop(b);
}
