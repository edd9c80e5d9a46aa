//! `store copy`: a SQLite store holding every kind of row copied into a fresh
//! PostgreSQL database (and back), compared table by table and row by row; the
//! refusals (a target that holds rows, the source itself, a source a `serve`
//! holds); and the command end to end through the binary, whose output never shows
//! a password.

mod common;

use std::path::Path;
use std::process::Command;

use common::postgres::{postgres_client, Postgres};
use vectorstep::domain::{
    ApprovalStatus, DelegationStatus, NotificationStatus, RunStatus, StepKind, StepStatus,
    ToolCallStatus, ToolEffect, TurnStatus,
};
use vectorstep::store::{
    copy_all, ApprovalRecord, CopyError, DelegationRecord, EventRecord, NotificationRecord,
    RunRecord, StepRecord, Store, ToolCallRecord, TurnRecord, Write,
};

const T0: i64 = 1_764_633_600_000;

/// More events than one page of the copy (1000), so paging is exercised.
const EVENTS: usize = 1_234;

fn run(id: &str, status: RunStatus, parent: Option<&str>) -> RunRecord {
    RunRecord {
        id: id.into(),
        pipeline_name: "p".into(),
        status,
        source: "alertmanager".into(),
        team: Some("sre".into()),
        stage: "production".into(),
        triggered_at: T0,
        completed_at: (status != RunStatus::Running).then_some(T0 + 9),
        resumed_at: None,
        resume_count: 0,
        config_fingerprint: "f".into(),
        parent_run_id: parent.map(str::to_string),
        parent_step_path: parent.map(|_| "fan/0".to_string()),
        dedup_fingerprint: Some(format!("fp-{id}")),
        context_json: r#"{"alert":"disk 'full' ✓"}"#.into(),
        payload_json: "{}".into(),
        tokens_used: 15,
        cost_usd: 0.0125,
        terminal_step: None,
        reason: None,
        final_output_json: None,
        replay_of: None,
    }
}

fn step(run_id: &str, path: &str, index: u32) -> StepRecord {
    StepRecord {
        run_id: run_id.into(),
        step_path: path.into(),
        step_index: index,
        kind: StepKind::Step,
        executor: "mock".into(),
        agent: None,
        status: StepStatus::Completed,
        attempts: 1,
        iteration: 1,
        idempotency_key: format!("{run_id}:{path}:1"),
        started_at: T0,
        finished_at: Some(T0 + 5),
        duration_ms: Some(5),
        primary_confidence: Some(0.9),
        effective_confidence: Some(0.875),
        output_json: Some(r#"{"summary":"ok"}"#.into()),
        error: None,
        input_tokens: 12,
        output_tokens: 3,
        cost_usd: Some(0.0125),
        items_json: None,
    }
}

fn event(run_id: &str, n: usize) -> EventRecord {
    EventRecord {
        id: 0,
        run_id: run_id.into(),
        ts: T0 + n as i64,
        level: "INFO".into(),
        event: "step_completed".into(),
        msg: format!("event {n}"),
        fields_json: "{}".into(),
    }
}

fn approval(token: &str, run_id: &str) -> ApprovalRecord {
    ApprovalRecord {
        token: token.into(),
        run_id: run_id.into(),
        step_path: "approve".into(),
        pipeline_name: "p".into(),
        message: "<b>go?</b>".into(),
        team: None,
        stage: "production".into(),
        channel: Some("telegram".into()),
        created_at: T0,
        deadline_at: T0 + 60_000,
        status: ApprovalStatus::Pending,
        decided_by: None,
        decided_at: None,
        delivery_json: None,
    }
}

fn notification(id: &str, run_id: &str) -> NotificationRecord {
    NotificationRecord {
        id: id.into(),
        run_id: run_id.into(),
        action: "notify".into(),
        channel: "telegram".into(),
        message: "done".into(),
        status: NotificationStatus::Pending,
        created_at: T0,
        sent_at: None,
        error: None,
    }
}

fn turn(run_id: &str, n: u32) -> TurnRecord {
    TurnRecord {
        run_id: run_id.into(),
        step_path: "triage".into(),
        iteration: 1,
        turn: n,
        status: TurnStatus::Completed,
        messages_json: "[]".into(),
        reply_json: Some(r#"{"role":"assistant"}"#.into()),
        tools_json: None,
        input_tokens: 100,
        output_tokens: 10,
        cost_usd: None,
        error: None,
        started_at: T0,
        finished_at: Some(T0 + 50),
    }
}

fn call(run_id: &str, index: u32) -> ToolCallRecord {
    ToolCallRecord {
        run_id: run_id.into(),
        step_path: "triage".into(),
        iteration: 1,
        turn: 1,
        call_index: index,
        call_id: format!("call_{index}"),
        tool: "restart".into(),
        arguments_json: r#"{"service":"api"}"#.into(),
        effect: ToolEffect::Write,
        effect_key: format!("{run_id}:triage:1:1:{index}"),
        status: ToolCallStatus::Started,
        attempt: 1,
        result_json: None,
        approval_token: None,
        approval_deadline: None,
        decided_by: None,
        started_at: T0,
        finished_at: None,
        duration_ms: None,
    }
}

/// Fills `store` with rows in every copied table (and the writer's probe key,
/// which is not copied).
fn fill(store: &Store) {
    let mut writes = vec![
        Write::InsertRun(run("r1", RunStatus::Completed, None)),
        Write::InsertRun(run("r2", RunStatus::Running, None)),
        Write::InsertRun(run("r3", RunStatus::Failed, Some("r1"))),
        Write::UpsertStep(step("r1", "a", 0)),
        Write::UpsertStep(step("r1", "b", 1)),
        Write::UpsertStep(StepRecord {
            status: StepStatus::Running,
            finished_at: None,
            duration_ms: None,
            primary_confidence: None,
            output_json: None,
            ..step("r2", "a", 0)
        }),
        Write::SetRunOwner {
            run_id: "r3".into(),
            owner: Some("cli-gone".into()),
        },
        Write::InsertApproval(approval("tok1", "r2")),
        Write::InsertApproval(approval("tok2", "r1")),
        Write::DecideApproval {
            token: "tok2".into(),
            status: ApprovalStatus::Approved,
            by: Some("@alice".into()),
            at: T0 + 3,
        },
        Write::InsertNotification(notification("n1", "r1")),
        Write::InsertNotification(notification("n2", "r2")),
        Write::MarkNotification {
            id: "n1".into(),
            status: NotificationStatus::Sent,
            at: T0 + 4,
            error: None,
        },
        Write::SetKv {
            key: "telegram_offset".into(),
            value: "8".into(),
        },
        Write::SetKv {
            key: "store_probe".into(),
            value: "1".into(),
        },
        Write::UpsertTurn(turn("r2", 1)),
        Write::UpsertTurn(turn("r2", 2)),
        Write::UpsertToolCall(call("r2", 1)),
        Write::UpsertToolCall(call("r2", 2)),
        Write::UpsertDelegation(DelegationRecord {
            run_id: "r2".into(),
            step_path: "triage".into(),
            key: "k".into(),
            agent: "helper".into(),
            question: "why?".into(),
            status: DelegationStatus::Completed,
            output_json: Some("{}".into()),
            journal_path: "triage/delegate/k".into(),
            started_at: T0,
            finished_at: Some(T0 + 1),
        }),
        Write::AcquireNamedLease {
            name: "telegram_poller".into(),
            owner: "node-1".into(),
            lease_ms: 30_000,
        },
        Write::AdvanceSchedule {
            pipeline: "nightly".into(),
            expected_due_at: None,
            next_due_at: T0 + 86_400_000,
        },
    ];
    store
        .commit_blocking(std::mem::take(&mut writes))
        .expect("fill");
    // Events in a few batches, over several runs, with a hole in the ids (a run
    // pruned away would leave one): the copy keeps them as they are.
    let events: Vec<Write> = (0..EVENTS)
        .map(|n| Write::AppendEvent(event(["r1", "r2", "r3"][n % 3], n)))
        .collect();
    for chunk in events.chunks(400) {
        store.commit_blocking(chunk.to_vec()).expect("events");
    }
}

/// The tables compared, with their key order and the rows left out of the copy.
const TABLES: [(&str, &str, &str); 11] = [
    ("pipeline_runs", "id", ""),
    ("pipeline_steps", "run_id, step_path", ""),
    ("run_events", "id", ""),
    ("pending_approvals", "token", ""),
    ("notifications", "id", ""),
    ("kv", "key", "WHERE key <> 'store_probe'"),
    ("agent_turns", "run_id, step_path, iteration, turn", ""),
    (
        "tool_calls",
        "run_id, step_path, iteration, turn, call_index",
        "",
    ),
    ("agent_delegations", "run_id, step_path, key", ""),
    ("named_leases", "name", ""),
    ("schedule_ticks", "pipeline_name", ""),
];

/// Every row of `table` as text, in key order (NULL as `∅`).
fn sqlite_rows(path: &Path, table: &str, order: &str, filter: &str) -> Vec<Vec<String>> {
    let conn = rusqlite::Connection::open(path).expect("open");
    let mut stmt = conn
        .prepare(&format!("SELECT * FROM {table} {filter} ORDER BY {order}"))
        .expect("select");
    let n = stmt.column_count();
    let rows = stmt
        .query_map([], |r| {
            (0..n)
                .map(|i| {
                    Ok(match r.get_ref(i)? {
                        rusqlite::types::ValueRef::Null => "∅".to_string(),
                        rusqlite::types::ValueRef::Integer(v) => v.to_string(),
                        rusqlite::types::ValueRef::Real(v) => v.to_string(),
                        rusqlite::types::ValueRef::Text(t) => String::from_utf8_lossy(t).into(),
                        rusqlite::types::ValueRef::Blob(_) => "blob".into(),
                    })
                })
                .collect()
        })
        .expect("rows");
    rows.collect::<Result<_, _>>().expect("rows")
}

fn postgres_rows(url: &str, table: &str, order: &str, filter: &str) -> Vec<Vec<String>> {
    use postgres::types::Type;
    let mut c = postgres_client(url).expect("connect");
    let rows = c
        .query(
            &format!("SELECT * FROM {table} {filter} ORDER BY {order}"),
            &[],
        )
        .expect("select");
    rows.iter()
        .map(|r| {
            (0..r.len())
                .map(|i| {
                    let ty = r.columns()[i].type_();
                    let text = if *ty == Type::INT8 {
                        r.get::<_, Option<i64>>(i).map(|v| v.to_string())
                    } else if *ty == Type::FLOAT8 {
                        r.get::<_, Option<f64>>(i).map(|v| v.to_string())
                    } else {
                        r.get::<_, Option<String>>(i)
                    };
                    text.unwrap_or_else(|| "∅".into())
                })
                .collect()
        })
        .collect()
}

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("vs-copy-{name}-"))
        .tempdir()
        .expect("tempdir")
}

/// The runs and their steps as the store reads them back.
fn runs_read_back(store: &Store) -> Vec<(RunRecord, Vec<StepRecord>)> {
    ["r1", "r2", "r3"]
        .iter()
        .map(|id| {
            let run = store.run(id).expect("read").expect("the run is there");
            (run, store.steps(id).expect("steps"))
        })
        .collect()
}

fn max_event_id(store: &Store) -> i64 {
    ["r1", "r2", "r3"]
        .iter()
        .flat_map(|id| store.events(id).expect("events"))
        .map(|e| e.id)
        .max()
        .expect("events were copied")
}

/// A new event appended to `store` gets an id above every copied one.
fn next_event_numbers_on(store: &Store, above: i64) {
    store
        .commit_blocking(vec![Write::AppendEvent(event("r2", 99_999))])
        .expect("append after the copy");
    let ids: Vec<i64> = store
        .events("r2")
        .expect("events")
        .iter()
        .map(|e| e.id)
        .collect();
    let last = *ids.last().expect("r2 has events");
    assert!(
        last > above,
        "the new event got id {last}, not above {above}"
    );
}

#[test]
fn sqlite_copied_to_postgres_holds_every_row_and_reads_back_the_same() {
    let dir = scratch("lite-pg");
    let path = dir.path().join("vs.db");
    let lite = Store::open(&path).expect("SQLite store");
    fill(&lite);
    let url = Postgres::shared().database();
    let pg = Store::open_postgres(&url, 2).expect("PostgreSQL store");

    let report = copy_all(&lite, &pg).expect("copy");

    for (table, order, filter) in TABLES {
        let want = sqlite_rows(&path, table, order, filter);
        assert!(
            !want.is_empty(),
            "{table} is filled, so the comparison compares rows"
        );
        let got = postgres_rows(&url, table, order, filter);
        assert_eq!(got, want, "rows of {table}");
        let counted = report
            .tables
            .iter()
            .find(|t| t.table == table)
            .unwrap_or_else(|| panic!("{table} is in the report: {report:?}"));
        assert_eq!(counted.rows, want.len() as u64, "rows of {table} reported");
    }
    assert_eq!(
        postgres_rows(&url, "run_events", "id", "").len(),
        EVENTS,
        "more than a page of events"
    );
    assert!(
        postgres_rows(&url, "kv", "key", "WHERE key = 'store_probe'").is_empty(),
        "the probe key stays behind"
    );
    assert!(
        postgres_rows(&url, "replicas", "id", "").is_empty(),
        "replicas are not copied"
    );
    assert_eq!(report.tables.len(), TABLES.len());
    assert_eq!(
        report.total(),
        report.tables.iter().map(|t| t.rows).sum::<u64>()
    );

    assert_eq!(runs_read_back(&pg), runs_read_back(&lite));
    assert_eq!(lite.events("r1").expect("r1"), pg.events("r1").expect("r1"));
    let top = max_event_id(&pg);
    assert_eq!(top, max_event_id(&lite));
    next_event_numbers_on(&pg, top);
}

#[test]
fn a_target_that_holds_rows_is_refused_and_left_as_it_was() {
    let dir = scratch("refuse");
    let path = dir.path().join("vs.db");
    let lite = Store::open(&path).expect("SQLite store");
    fill(&lite);
    let url = Postgres::shared().database();
    let pg = Store::open_postgres(&url, 2).expect("PostgreSQL store");
    pg.commit_blocking(vec![Write::InsertRun(run(
        "other",
        RunStatus::Completed,
        None,
    ))])
    .expect("a run already there");
    let before: Vec<_> = TABLES
        .iter()
        .map(|(t, o, f)| postgres_rows(&url, t, o, f))
        .collect();

    let e = copy_all(&lite, &pg).expect_err("a target with a run is refused");
    assert!(
        matches!(
            e,
            CopyError::TargetNotEmpty {
                table: "pipeline_runs",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("empty database"), "{e}");
    let after: Vec<_> = TABLES
        .iter()
        .map(|(t, o, f)| postgres_rows(&url, t, o, f))
        .collect();
    assert_eq!(after, before, "nothing was written");

    // A SQLite target holding only a kv row is refused as well: no merges.
    let other = Store::open(&dir.path().join("other.db")).expect("other");
    other
        .commit_blocking(vec![Write::SetKv {
            key: "telegram_offset".into(),
            value: "1".into(),
        }])
        .expect("kv");
    let e = copy_all(&lite, &other).expect_err("refused");
    assert!(
        matches!(e, CopyError::TargetNotEmpty { table: "kv", .. }),
        "{e:?}"
    );

    // The same file under another name is the same store.
    let again = Store::open(&dir.path().join(".").join("vs.db")).expect("same file");
    let e = copy_all(&lite, &again).expect_err("the source itself");
    assert!(matches!(e, CopyError::SameStore(_)), "{e:?}");
    let pg_again = Store::open_postgres(&url, 1).expect("same database");
    let e = copy_all(&pg, &pg_again).expect_err("the source itself");
    assert!(matches!(e, CopyError::SameStore(_)), "{e:?}");
}

#[test]
fn a_source_held_by_a_serve_is_refused() {
    let dir = scratch("serve");
    let path = dir.path().join("vs.db");
    let lite = Store::open(&path).expect("SQLite store");
    fill(&lite);
    let target = Store::open(&dir.path().join("target.db")).expect("target");
    let serving = vectorstep::store::lock::ServeLock::acquire(&path).expect("a serve's lock");
    let e = copy_all(&lite, &target).expect_err("a serve holds the source");
    assert!(matches!(e, CopyError::ServeRunning { .. }), "{e:?}");
    assert!(e.to_string().contains("stop it"), "{e}");
    assert!(target.run("r1").expect("read").is_none(), "nothing copied");
    drop(serving);
    copy_all(&lite, &target).expect("copies once the serve is gone");
    assert_eq!(runs_read_back(&target), runs_read_back(&lite));
}

#[test]
fn a_postgres_source_with_a_live_replica_is_refused() {
    let dir = scratch("replica");
    let url = Postgres::shared().database();
    let pg = Store::open_postgres(&url, 2).expect("PostgreSQL store");
    fill(&pg);
    let target = Store::open(&dir.path().join("target.db")).expect("target");
    // What every `serve` on PostgreSQL holds while it lives.
    let replica = vectorstep::store::lock_replica(&url, "replica-1")
        .expect("lock")
        .expect("free");
    let e = copy_all(&pg, &target).expect_err("a replica holds the source");
    assert!(matches!(e, CopyError::ServeRunning { .. }), "{e:?}");
    assert!(e.to_string().contains("replica"), "{e}");
    assert!(target.run("r1").expect("read").is_none(), "nothing copied");
    drop(replica);
    copy_all(&pg, &target).expect("copies once the replica is gone");
    assert_eq!(runs_read_back(&target), runs_read_back(&pg));
}

#[test]
fn postgres_copied_back_to_sqlite_round_trips() {
    let dir = scratch("round");
    let path = dir.path().join("vs.db");
    let lite = Store::open(&path).expect("SQLite store");
    fill(&lite);
    let url = Postgres::shared().database();
    let pg = Store::open_postgres(&url, 2).expect("PostgreSQL store");
    copy_all(&lite, &pg).expect("to PostgreSQL");
    let back_path = dir.path().join("back.db");
    let back = Store::open(&back_path).expect("SQLite target");
    let report = copy_all(&pg, &back).expect("back to SQLite");
    assert!(report.total() > EVENTS as u64, "{report:?}");

    for (table, order, filter) in TABLES {
        let want = sqlite_rows(&path, table, order, filter);
        assert!(!want.is_empty(), "{table} is filled");
        assert_eq!(
            sqlite_rows(&back_path, table, order, filter),
            want,
            "rows of {table} after the round trip"
        );
    }
    assert_eq!(runs_read_back(&back), runs_read_back(&lite));
    let top = max_event_id(&back);
    next_event_numbers_on(&back, top);
}

#[test]
fn the_command_copies_prints_a_summary_and_never_a_password() {
    let dir = scratch("cli");
    let path = dir.path().join("vs.db");
    {
        let lite = Store::open(&path).expect("SQLite store");
        fill(&lite);
    }
    let url = Postgres::shared()
        .database()
        .replacen("postgres@", "postgres:secret@", 1);
    assert!(url.contains(":secret@"), "{url}");
    let copy = |from: &str, to: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_vectorstep"))
            .current_dir(dir.path())
            .args(["store", "copy", "--from", from, "--to", to])
            .output()
            .expect("run vectorstep");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            !stdout.contains("secret") && !stderr.contains("secret"),
            "a password in the output:\n{stdout}\n{stderr}"
        );
        (out.status.code(), stdout, stderr)
    };

    let (code, stdout, stderr) = copy("sqlite:./vs.db", &url);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let runs_line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("pipeline_runs"))
        .unwrap_or_else(|| panic!("a line for pipeline_runs:\n{stdout}"));
    assert_eq!(runs_line.split_whitespace().last(), Some("3"), "{stdout}");
    let events_line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("run_events"))
        .unwrap_or_else(|| panic!("a line for run_events:\n{stdout}"));
    assert_eq!(
        events_line.split_whitespace().last(),
        Some(EVENTS.to_string().as_str()),
        "{stdout}"
    );
    assert!(stdout.contains("postgres://postgres:***@"), "{stdout}");
    let total: usize = TABLES
        .iter()
        .map(|(t, o, f)| sqlite_rows(&path, t, o, f).len())
        .sum();
    assert!(
        stdout.contains(&format!("Copied {total} rows in 11 tables")),
        "{stdout}"
    );
    assert_eq!(
        postgres_rows(&url, "pipeline_runs", "id", ""),
        sqlite_rows(&path, "pipeline_runs", "id", "")
    );

    // Again: the target holds rows now.
    let (code, stdout, stderr) = copy("./vs.db", &url.replacen("postgres://", "postgresql://", 1));
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("already holds rows"), "{stderr}");

    // Usage errors exit 64 (EX_USAGE).
    let (code, _, stderr) = copy("mysql://u:secret@db/x", &url);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("sqlite:PATH"), "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .args(["store", "copy", "--from", "x.db"])
        .output()
        .expect("run vectorstep");
    assert_eq!(out.status.code(), Some(64), "a missing --to");

    // A source that does not exist is not created.
    let (code, _, stderr) = copy("sqlite:./missing.db", &url);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no SQLite database"), "{stderr}");
    assert!(!dir.path().join("missing.db").exists());
}
