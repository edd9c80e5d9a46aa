//! Every kind of `Write` applied to SQLite (the store as the engine uses it) and to
//! a real, throwaway PostgreSQL server (`Store::open_postgres`, the store as the engine uses it) in the same
//! sequence: the two give the same outcome for every write, refuse the same
//! batches whole, end holding the same rows, table by table, and read runs and
//! steps back the same through the same read statements.

mod common;

use common::postgres::{postgres_client, Postgres};
use vectorstep::domain::{
    ApprovalStatus, DelegationStatus, NotificationStatus, RunStatus, StepKind, StepStatus,
    ToolCallStatus, ToolEffect, TurnStatus,
};
use vectorstep::store::{
    ApprovalRecord, DelegationRecord, EventRecord, NotificationRecord, Outcome, RunRecord,
    StepRecord, Store, ToolCallRecord, TurnRecord, Write,
};

const T0: i64 = 1_764_633_600_000;

fn run(id: &str, fingerprint: Option<&str>, at: i64) -> RunRecord {
    RunRecord {
        id: id.into(),
        pipeline_name: "p".into(),
        status: RunStatus::Running,
        source: "alertmanager".into(),
        team: Some("sre".into()),
        stage: "production".into(),
        triggered_at: at,
        completed_at: None,
        resumed_at: None,
        resume_count: 0,
        config_fingerprint: "f".into(),
        parent_run_id: None,
        parent_step_path: None,
        dedup_fingerprint: fingerprint.map(str::to_string),
        context_json: r#"{"alert":"disk 'full' ✓"}"#.into(),
        payload_json: "{}".into(),
        tokens_used: 0,
        cost_usd: 0.0,
        terminal_step: None,
        reason: None,
        final_output_json: None,
        replay_of: None,
    }
}

fn step(run_id: &str, path: &str, status: StepStatus) -> StepRecord {
    StepRecord {
        run_id: run_id.into(),
        step_path: path.into(),
        step_index: 0,
        kind: StepKind::Step,
        executor: "mock".into(),
        agent: None,
        status,
        attempts: 1,
        iteration: 1,
        idempotency_key: format!("{run_id}:{path}:1"),
        started_at: T0,
        finished_at: (status != StepStatus::Running).then_some(T0 + 5),
        duration_ms: (status != StepStatus::Running).then_some(5),
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

fn event(run_id: &str, name: &str) -> EventRecord {
    EventRecord {
        id: 0,
        run_id: run_id.into(),
        ts: T0,
        level: "INFO".into(),
        event: name.into(),
        msg: "m".into(),
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

fn turn(run_id: &str, n: u32, status: TurnStatus) -> TurnRecord {
    TurnRecord {
        run_id: run_id.into(),
        step_path: "triage".into(),
        iteration: 1,
        turn: n,
        status,
        messages_json: "[]".into(),
        reply_json: None,
        tools_json: None,
        input_tokens: 100,
        output_tokens: 10,
        cost_usd: None,
        error: None,
        started_at: T0,
        finished_at: None,
    }
}

fn call(run_id: &str, index: u32, key: &str) -> ToolCallRecord {
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
        effect_key: key.into(),
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

/// The batches, in order: every kind of write and every conditional answer.
fn batches() -> Vec<Vec<Write>> {
    let finished = |id: &str| Write::FinishRun {
        run_id: id.into(),
        status: RunStatus::Completed,
        completed_at: T0 + 10,
        terminal_step: Some("s".into()),
        reason: None,
        final_output_json: Some("{}".into()),
    };
    vec![
        // A run, its first step and log line in one commit.
        vec![
            Write::InsertRun(run("r1", Some("fp"), T0)),
            Write::UpsertStepIfInserted(step("r1", "s", StepStatus::Running)),
            Write::AppendEventIfInserted(event("r1", "run_started")),
        ],
        // A running duplicate: nothing of the batch's conditional writes applies.
        vec![
            Write::InsertRun(run("r2", Some("fp"), T0 + 1)),
            Write::AppendEventIfInserted(event("r2", "run_started")),
        ],
        vec![
            Write::UpsertStep(step("r1", "s", StepStatus::Completed)),
            Write::SetRunUsage {
                run_id: "r1".into(),
                tokens_used: 15,
                cost_usd: 0.0125,
            },
            Write::MarkResumed {
                run_id: "r1".into(),
                at: T0 + 2,
                counted: true,
            },
            Write::MarkResumed {
                run_id: "r1".into(),
                at: T0 + 3,
                counted: true,
            },
            // A clean handoff sets nothing new and is not counted.
            Write::MarkResumed {
                run_id: "r1".into(),
                at: 30,
                counted: false,
            },
            Write::SetRunOwner {
                run_id: "r1".into(),
                owner: Some("cli-1".into()),
            },
            finished("r1"),
            finished("r1"),
        ],
        // Inside the dedup window, a finished run still suppresses a new one.
        vec![Write::InsertRunDedup {
            run: run("r3", Some("fp"), T0 + 20),
            window_start: T0 - 1,
        }],
        vec![Write::InsertRunDedup {
            run: run("r4", Some("fp"), T0 + 20),
            window_start: T0 + 15,
        }],
        vec![
            Write::InsertApproval(approval("tok", "r4")),
            Write::SetApprovalDelivery {
                token: "tok".into(),
                delivery_json: r#"{"chat_id":1,"message_id":2}"#.into(),
            },
            Write::DecideApproval {
                token: "tok".into(),
                status: ApprovalStatus::Approved,
                by: Some("@alice".into()),
                at: T0 + 30,
            },
            Write::DecideApproval {
                token: "tok".into(),
                status: ApprovalStatus::Rejected,
                by: Some("@bob".into()),
                at: T0 + 31,
            },
            Write::DecideApproval {
                token: "nope".into(),
                status: ApprovalStatus::Approved,
                by: None,
                at: T0 + 31,
            },
            Write::InsertApproval(approval("tok2", "r4")),
            Write::CloseApprovalsOfRun {
                run_id: "r4".into(),
                at: T0 + 32,
            },
        ],
        vec![
            Write::InsertNotification(notification("n1", "r4")),
            // Recorded again: a no-op that keeps the first row.
            Write::InsertNotification(NotificationRecord {
                message: "other".into(),
                ..notification("n1", "r4")
            }),
            Write::MarkNotification {
                id: "n1".into(),
                status: NotificationStatus::Sent,
                at: T0 + 40,
                error: None,
            },
            Write::SetKv {
                key: "telegram_offset".into(),
                value: "7".into(),
            },
            Write::SetKv {
                key: "telegram_offset".into(),
                value: "8".into(),
            },
        ],
        vec![
            Write::UpsertTurn(turn("r4", 1, TurnStatus::Started)),
            Write::UpsertTurn(TurnRecord {
                reply_json: Some(r#"{"role":"assistant"}"#.into()),
                finished_at: Some(T0 + 50),
                ..turn("r4", 1, TurnStatus::Completed)
            }),
            Write::UpsertToolCall(call("r4", 1, "r4:triage:1:1:1")),
            Write::UpsertDelegation(DelegationRecord {
                run_id: "r4".into(),
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
        ],
        // A second call with the first one's effect key: refused whole, the event
        // before it included.
        vec![
            Write::AppendEvent(event("r4", "tool_call_started")),
            Write::UpsertToolCall(call("r4", 2, "r4:triage:1:1:1")),
        ],
        // A count no signed column holds: refused whole.
        vec![
            Write::AppendEvent(event("r4", "x")),
            Write::SetRunUsage {
                run_id: "r4".into(),
                tokens_used: u64::MAX,
                cost_usd: 0.0,
            },
        ],
        vec![
            finished("r4"),
            Write::PruneFinishedBefore { cutoff: T0 + 15 },
        ],
    ]
}

/// What a batch came to, comparable across backends: the outcomes, or which write
/// failed.
fn answer(result: Result<Vec<Outcome>, vectorstep::store::Error>) -> Result<Vec<Outcome>, String> {
    result.map_err(|e| match e {
        vectorstep::store::Error::Write { index, write, .. } => format!("write #{index} {write}"),
        other => format!("other: {other}"),
    })
}

const TABLES: [(&str, &str); 9] = [
    ("pipeline_runs", "id"),
    ("pipeline_steps", "run_id, step_path"),
    ("run_events", "id"),
    ("pending_approvals", "token"),
    ("notifications", "id"),
    ("kv", "key"),
    ("agent_turns", "run_id, step_path, iteration, turn"),
    (
        "tool_calls",
        "run_id, step_path, iteration, turn, call_index",
    ),
    ("agent_delegations", "run_id, step_path, key"),
];

/// Every row of `table` as text, in key order (NULL as `∅`).
fn sqlite_rows(conn: &rusqlite::Connection, table: &str, order: &str) -> Vec<Vec<String>> {
    let mut stmt = conn
        .prepare(&format!("SELECT * FROM {table} ORDER BY {order}"))
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

fn postgres_rows(c: &mut postgres::Client, table: &str, order: &str) -> Vec<Vec<String>> {
    use postgres::types::Type;
    let rows = c
        .query(&format!("SELECT * FROM {table} ORDER BY {order}"), &[])
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

/// The rows of every table on both backends are the same; with `full`, no table
/// is empty (so the comparison compares something).
fn compare_rows(path: &std::path::Path, pg: &mut postgres::Client, full: bool) {
    let conn = rusqlite::Connection::open(path).expect("open");
    for (table, order) in TABLES {
        let lite = sqlite_rows(&conn, table, order);
        let post = postgres_rows(pg, table, order);
        assert_eq!(post, lite, "rows of {table}");
        assert!(!full || !lite.is_empty(), "{table} is empty");
    }
}

#[test]
fn every_write_has_the_same_outcome_and_leaves_the_same_rows_on_both_backends() {
    let dir = std::env::temp_dir().join(format!("vs-writes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("vs.db");
    let store = Store::open(&path).expect("SQLite store");
    let url = Postgres::shared().database();
    let shared = Store::open_postgres(&url, 2).expect("PostgreSQL store");
    let mut pg = postgres_client(&url).expect("connect");

    let all = batches();
    let last = all.len() - 1;
    for (n, batch) in all.into_iter().enumerate() {
        if n == last {
            // Before the prune, when every table holds rows: compare them all, and
            // read the runs back through the store's own reads on both backends.
            compare_rows(&path, &mut pg, true);
            for id in ["r1", "r2", "r4"] {
                let lite = store
                    .run(id)
                    .expect("read")
                    .map(|r| (r, store.steps(id).expect("steps")));
                let post = shared
                    .run(id)
                    .expect("read on PostgreSQL")
                    .map(|r| (r, shared.steps(id).expect("steps on PostgreSQL")));
                assert_eq!(post, lite, "run {id} as read back");
            }
            let r1 = store.steps("r1").expect("steps");
            assert_eq!(r1.len(), 1, "the comparison reads something");
            assert_eq!(r1[0].cost_usd, Some(0.0125));
        }
        let lite = answer(store.commit_blocking(batch.clone()));
        let post = answer(shared.commit_blocking(batch.clone()));
        assert_eq!(post, lite, "batch {n}: {batch:?}");
    }
    drop(store);
    compare_rows(&path, &mut pg, false);
    // The sequence reached every answer (the check above is not comparing empties).
    let outcomes: Vec<Result<Vec<Outcome>, String>> = {
        let store = Store::open(&dir.join("again.db")).expect("store");
        batches()
            .into_iter()
            .map(|b| answer(store.commit_blocking(b)))
            .collect()
    };
    let flat = format!("{outcomes:?}");
    for want in [
        "RunInserted",
        "DuplicateRunning",
        "DuplicateRecent",
        "NotRunning",
        "ApprovalDecided",
        "ApprovalAlreadyDecided",
        "ApprovalUnknown",
        "Pruned { runs: 2 }",
        "write #1 UpsertToolCall",
        "write #1 SetRunUsage",
    ] {
        assert!(flat.contains(want), "{want} never happened: {flat}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
