//! `GET /replicas` and `vectorstep replicas list` against the real `serve` on
//! PostgreSQL: replicas seeded through a store of the test's own (one live that
//! holds a run, one whose heartbeat is older than the lease, one stopped) are
//! listed with the right `live` and `runs`; the CLI shows the same; the route
//! needs an operator token. Replicas are found by id: the serve under test may
//! register itself too.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::backend::Database;
use common::postgres::Postgres;
use common::service::{Scratch, Service};
use serde_json::Value;
use vectorstep::domain::RunStatus;
use vectorstep::store::{ReplicaKind, RunRecord, Store, Write};

const OPERATOR: &str = "operator-secret-0123456789";
const TEAM: &str = "team-secret-0123456789";
const LEASE_MS: u64 = 3_000;

fn heartbeat(id: &str, kind: ReplicaKind) -> Write {
    Write::Heartbeat {
        replica: id.into(),
        kind,
        fingerprints_json: r#"["fp-1"]"#.into(),
        host: Some("host-a".into()),
        lease_ms: LEASE_MS,
    }
}

fn running_run(id: &str) -> RunRecord {
    RunRecord {
        id: id.into(),
        pipeline_name: "p".into(),
        status: RunStatus::Running,
        source: "generic".into(),
        team: None,
        stage: "production".into(),
        triggered_at: chrono::Utc::now().timestamp_millis(),
        completed_at: None,
        resumed_at: None,
        resume_count: 0,
        config_fingerprint: "fp-1".into(),
        parent_run_id: None,
        parent_step_path: None,
        dedup_fingerprint: None,
        context_json: "{}".into(),
        payload_json: "{}".into(),
        tokens_used: 0,
        cost_usd: 0.0,
        terminal_step: None,
        reason: None,
        final_output_json: None,
        replay_of: None,
    }
}

fn replica<'a>(body: &'a Value, id: &str) -> &'a Value {
    body["replicas"]
        .as_array()
        .and_then(|l| l.iter().find(|r| r["id"] == id))
        .unwrap_or_else(|| panic!("no replica {id} in {body}"))
}

async fn get(service: &Service, token: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new().get(service.url("/replicas"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("GET /replicas");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn cli(scratch: &Scratch, service: &Service, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .arg("--config")
        .arg(scratch.config_path())
        .arg("replicas")
        .arg("list")
        .args(args)
        .args(["--url", &service.url("")])
        .env("VECTORSTEP_TOKEN", OPERATOR)
        .env_remove("VECTORSTEP_CONFIG")
        .output()
        .expect("run vectorstep replicas list")
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_are_listed_live_or_dead_with_the_runs_they_hold() {
    // PostgreSQL whatever VECTORSTEP_TEST_BACKEND says: replicas live there.
    let mut scratch = Scratch::new();
    let url = Postgres::shared().database();
    scratch.database = Database::Postgres(url.clone());
    scratch.write_config(&format!(
        "auth:\n  teams: [{{name: sre, token: {TEAM}}}]\n  operators: [{{name: alice, token: {OPERATOR}}}]\n"
    ));
    let service = Service::start(&scratch.root).await;
    let store = Store::open_postgres(&url, 2).expect("open the test's own store");

    // r-old heartbeat once, longer than a lease (3 s) ago; r-stopped stopped.
    store
        .commit(vec![heartbeat("r-old", ReplicaKind::Serve)])
        .await
        .expect("heartbeat r-old");
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 500)).await;
    store
        .commit(vec![
            heartbeat("r-stopped", ReplicaKind::Run),
            Write::StopReplica {
                replica: "r-stopped".into(),
            },
        ])
        .await
        .expect("a stopped replica");
    store
        .commit(vec![
            heartbeat("r-live", ReplicaKind::Serve),
            Write::InsertRun(running_run("run-held")),
            Write::LeaseNewRun {
                run_id: "run-held".into(),
                replica: "r-live".into(),
                lease_ms: 60_000,
            },
        ])
        .await
        .expect("a live replica holding a run");

    let (status, body) = get(&service, Some(OPERATOR)).await;
    assert_eq!(status, 200, "{body}");
    let live = replica(&body, "r-live");
    assert_eq!(live["live"], true, "{body}");
    assert_eq!(live["kind"], "serve");
    assert_eq!(live["host"], "host-a");
    assert_eq!(live["runs"], serde_json::json!(["run-held"]), "{body}");
    assert_eq!(live["fingerprints"], serde_json::json!(["fp-1"]));
    assert_eq!(live["stopped_at"], Value::Null);
    for key in ["started_at", "heartbeat_at"] {
        let t = live[key].as_str().expect("a time");
        assert!(
            chrono::DateTime::parse_from_rfc3339(t).is_ok(),
            "{key}: {t}"
        );
    }
    let old = replica(&body, "r-old");
    assert_eq!(
        old["live"], false,
        "a heartbeat older than the lease: {body}"
    );
    assert_eq!(old["runs"], serde_json::json!([]));
    assert_eq!(old["stopped_at"], Value::Null);
    let stopped = replica(&body, "r-stopped");
    assert_eq!(stopped["live"], false, "stopped: {body}");
    assert_eq!(stopped["kind"], "run");
    assert!(stopped["stopped_at"].is_string(), "{body}");
    let now = body["now"].as_str().expect("the database clock");
    assert!(chrono::DateTime::parse_from_rfc3339(now).is_ok(), "{now}");

    // The CLI: the same body with --json, a table naming each replica otherwise.
    // r-live heartbeats again before each call, as a serve would, so a slow
    // machine cannot let its 3 s lease pass.
    let renew = || async {
        store
            .commit(vec![heartbeat("r-live", ReplicaKind::Serve)])
            .await
            .expect("heartbeat r-live");
    };
    renew().await;
    let out = cli(&scratch, &service, &["--json"]);
    assert!(out.status.success(), "{out:?}");
    let printed: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
    assert_eq!(keys(&printed), keys(&body));
    for id in ["r-old", "r-stopped"] {
        assert_eq!(replica(&printed, id), replica(&body, id), "{id}");
    }
    let live_printed = replica(&printed, "r-live");
    assert_eq!(live_printed["runs"], live["runs"]);
    assert_eq!(live_printed["live"], true);
    assert_eq!(live_printed["started_at"], live["started_at"]);

    renew().await;
    let out = cli(&scratch, &service, &[]);
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let row = |id: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("no row for {id}:\n{table}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert!(table.starts_with("ID"), "{table}");
    let r = row("r-live");
    assert_eq!(&r[1..3], ["serve", "yes"], "{table}");
    assert_eq!(r[5], "1", "runs held: {table}");
    let r = row("r-old");
    assert_eq!(&r[1..3], ["serve", "no"], "{table}");
    assert_eq!(r[5], "0", "{table}");
    assert_eq!(&row("r-stopped")[1..3], ["run", "ended"], "{table}");

    // Operator only.
    let (status, _) = get(&service, None).await;
    assert_eq!(status, 401);
    let (status, _) = get(&service, Some(TEAM)).await;
    assert_eq!(status, 403);
    let out = Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .arg("--config")
        .arg(scratch.config_path())
        .args(["replicas", "list", "--url", &service.url("")])
        .env_remove("VECTORSTEP_TOKEN")
        .env_remove("VECTORSTEP_CONFIG")
        .output()
        .expect("run vectorstep replicas list");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs a token"),
        "{out:?}"
    );
}
