//! The agent step journal: migration 0006 on an existing database, batches of turns
//! and calls, the unique effect key, reading a step with its delegations, retention.

use super::*;
use crate::domain::{DelegationStatus, ToolCallStatus, ToolEffect, TurnStatus};
use crate::store::migrations::{apply_list, MIGRATIONS};
use crate::store::{DelegationRecord, Error, StepJournal, ToolCallRecord, TurnRecord};

/// The migrations before the journal: what a database in the field has today.
const BEFORE_JOURNAL: &[(&str, &str)] = MIGRATIONS.split_at(5).0;

fn turn(run_id: &str, path: &str, n: u32, status: TurnStatus) -> TurnRecord {
    TurnRecord {
        run_id: run_id.into(),
        step_path: path.into(),
        iteration: 1,
        turn: n,
        status,
        messages_json: format!(r#"[{{"role":"user","content":"m{n}"}}]"#),
        reply_json: None,
        tools_json: None,
        input_tokens: 0,
        output_tokens: 0,
        cost_usd: None,
        error: None,
        started_at: 1_700_000_001_000,
        finished_at: None,
    }
}

fn call(run_id: &str, path: &str, n: u32, index: u32, status: ToolCallStatus) -> ToolCallRecord {
    ToolCallRecord {
        run_id: run_id.into(),
        step_path: path.into(),
        iteration: 1,
        turn: n,
        call_index: index,
        call_id: format!("call_{index}"),
        tool: "disk_usage".into(),
        arguments_json: r#"{"host":"db1"}"#.into(),
        effect: ToolEffect::Read,
        effect_key: format!("{run_id}:{path}:1:{n}:{index}"),
        status,
        attempt: 1,
        result_json: None,
        approval_token: None,
        approval_deadline: None,
        decided_by: None,
        started_at: 1_700_000_001_100,
        finished_at: None,
        duration_ms: None,
    }
}

fn delegation(run_id: &str, path: &str, key: &str, status: DelegationStatus) -> DelegationRecord {
    DelegationRecord {
        run_id: run_id.into(),
        step_path: path.into(),
        key: key.into(),
        agent: "db-expert".into(),
        question: "Why is the disk full?".into(),
        status,
        output_json: None,
        journal_path: format!("{path}/delegate/{key}"),
        started_at: 1_700_000_001_200,
        finished_at: None,
    }
}

fn paths(j: &StepJournal) -> (Vec<String>, Vec<String>, Vec<String>) {
    (
        j.turns
            .iter()
            .map(|t| format!("{}#{}", t.step_path, t.turn))
            .collect(),
        j.calls
            .iter()
            .map(|c| format!("{}#{}.{}", c.step_path, c.turn, c.call_index))
            .collect(),
        j.delegations
            .iter()
            .map(|d| format!("{}#{}", d.step_path, d.key))
            .collect(),
    )
}

#[test]
fn migration_0006_upgrades_a_database_of_the_previous_schema() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    {
        let mut conn = raw(&path);
        apply_list(&mut conn, BEFORE_JOURNAL).expect("the previous schema");
        conn.execute_batch(
            "INSERT INTO pipeline_runs (id, pipeline_name, status, source, stage, triggered_at,
                 config_fingerprint, context_json, payload_json)
             VALUES ('old', 'disk-full', 'running', 'webhook', 'prod', 1, 'f1', '{}', '{}');
             INSERT INTO pipeline_steps (run_id, step_path, step_index, kind, executor, status,
                 attempts, iteration, idempotency_key, started_at)
             VALUES ('old', 'triage', 0, 'step', 'agent', 'running', 1, 1, 'old:triage:1', 2);",
        )
        .expect("rows of the previous schema");
        let tables: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = 'agent_turns'",
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(tables, 0, "the previous schema has no journal");
    }
    let store = Store::open(&path).expect("open upgrades");
    let versions: Vec<i64> = raw(&path)
        .prepare("SELECT version FROM schema_migrations ORDER BY version")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("versions");
    assert_eq!(versions, (1..=MIGRATIONS.len() as i64).collect::<Vec<_>>());
    assert_eq!(MIGRATIONS[5].0, "0006_agent_journal");
    // The old rows are untouched and the journal is usable at once.
    assert_eq!(
        store.run("old").unwrap().map(|r| r.status),
        Some(RunStatus::Running)
    );
    assert_eq!(store.steps("old").unwrap().len(), 1);
    commit(
        &store,
        vec![
            Write::UpsertTurn(turn("old", "triage", 1, TurnStatus::Started)),
            Write::UpsertToolCall(call("old", "triage", 1, 1, ToolCallStatus::Started)),
            Write::UpsertDelegation(delegation("old", "triage", "k1", DelegationStatus::Started)),
        ],
    );
    let j = store.journal("old", "triage").unwrap();
    assert_eq!(
        (j.turns.len(), j.calls.len(), j.delegations.len()),
        (1, 1, 1)
    );
    drop(store);
    // Opening again applies nothing twice.
    let store = Store::open(&path).expect("reopen");
    assert_eq!(store.journal("old", "triage").unwrap().turns.len(), 1);
}

#[test]
fn every_journal_column_round_trips_and_an_upsert_replaces_the_row() {
    let (_dir, store) = open_temp();
    let full_turn = TurnRecord {
        reply_json: Some(r#"{"role":"assistant","tool_calls":[]}"#.into()),
        tools_json: Some(r#"[{"name":"disk_usage"}]"#.into()),
        input_tokens: 120,
        output_tokens: 30,
        cost_usd: Some(0.0125),
        error: Some("late".into()),
        finished_at: Some(1_700_000_001_900),
        ..turn("r1", "triage", 1, TurnStatus::Completed)
    };
    let full_call = ToolCallRecord {
        effect: ToolEffect::Write,
        attempt: 3,
        result_json: Some(r#"{"freed_gb":4}"#.into()),
        approval_token: Some("tok-1".into()),
        approval_deadline: Some(1_700_000_900_000),
        decided_by: Some("alice".into()),
        finished_at: Some(1_700_000_002_000),
        duration_ms: Some(900),
        ..call("r1", "triage", 1, 1, ToolCallStatus::TimedOut)
    };
    let full_delegation = DelegationRecord {
        output_json: Some(r#"{"answer":"logs"}"#.into()),
        finished_at: Some(1_700_000_003_000),
        ..delegation("r1", "triage", "k1", DelegationStatus::Completed)
    };
    commit(
        &store,
        vec![
            Write::InsertRun(run("r1")),
            Write::UpsertTurn(turn("r1", "triage", 1, TurnStatus::Started)),
            Write::UpsertToolCall(call("r1", "triage", 1, 1, ToolCallStatus::Started)),
            Write::UpsertDelegation(delegation("r1", "triage", "k1", DelegationStatus::Started)),
        ],
    );
    let out = commit(
        &store,
        vec![
            Write::UpsertTurn(full_turn.clone()),
            Write::UpsertToolCall(full_call.clone()),
            Write::UpsertDelegation(full_delegation.clone()),
        ],
    );
    assert_eq!(out, vec![Outcome::Done, Outcome::Done, Outcome::Done]);
    let j = store.journal("r1", "triage").unwrap();
    assert_eq!(j.turns, vec![full_turn]);
    assert_eq!(j.calls, vec![full_call]);
    assert_eq!(j.delegations, vec![full_delegation]);
    assert_eq!((j.run_id.as_str(), j.step_path.as_str()), ("r1", "triage"));
}

#[test]
fn a_completed_turn_and_its_first_call_share_one_commit() {
    let (_dir, store) = open_temp();
    commit(
        &store,
        vec![
            Write::InsertRun(run("r1")),
            Write::UpsertTurn(turn("r1", "triage", 1, TurnStatus::Started)),
        ],
    );
    let before = store.stats();
    let completed = TurnRecord {
        reply_json: Some(r#"{"role":"assistant","tool_calls":[{"id":"call_1"}]}"#.into()),
        ..turn("r1", "triage", 1, TurnStatus::Completed)
    };
    commit(
        &store,
        vec![
            Write::UpsertTurn(completed.clone()),
            Write::UpsertToolCall(call("r1", "triage", 1, 1, ToolCallStatus::Started)),
        ],
    );
    let after = store.stats();
    assert_eq!(
        after.transactions_committed - before.transactions_committed,
        1
    );
    assert_eq!(after.batches_committed - before.batches_committed, 1);
    let j = store.journal("r1", "triage").unwrap();
    assert_eq!(j.turns, vec![completed.clone()]);
    assert_eq!(j.calls.len(), 1);

    // All or nothing: a batch whose second write fails leaves the turn as it was.
    let mut bad = call("r1", "triage", 2, 1, ToolCallStatus::Started);
    bad.effect = ToolEffect::Write;
    let broken = store.commit_blocking(vec![
        Write::UpsertTurn(turn("r1", "triage", 2, TurnStatus::Completed)),
        Write::UpsertToolCall(ToolCallRecord {
            // Another call's key: the batch must fail as a whole.
            effect_key: "r1:triage:1:1:1".into(),
            ..bad
        }),
    ]);
    match broken {
        Err(Error::Write { index, write, .. }) => assert_eq!((index, write), (1, "UpsertToolCall")),
        other => panic!("expected the second write to fail, got {other:?}"),
    }
    let j = store.journal("r1", "triage").unwrap();
    assert_eq!(
        j.turns,
        vec![completed],
        "turn 2 was rolled back with its call"
    );
    assert_eq!(j.calls.len(), 1);
}

#[test]
fn two_calls_never_share_an_effect_key() {
    let (_dir, store) = open_temp();
    commit(
        &store,
        vec![Write::UpsertToolCall(call(
            "r1",
            "triage",
            1,
            1,
            ToolCallStatus::Started,
        ))],
    );
    let twin = ToolCallRecord {
        effect_key: "r1:triage:1:1:1".into(),
        ..call("r1", "triage", 1, 2, ToolCallStatus::Started)
    };
    let e = store
        .commit_blocking(vec![Write::UpsertToolCall(twin)])
        .expect_err("a duplicate effect key");
    assert!(
        matches!(
            e,
            Error::Write {
                write: "UpsertToolCall",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!e.is_retriable(), "a constraint never succeeds later");
    assert!(e.to_string().contains("UNIQUE"), "{e}");
    // The same call written again (its next state) is an update, not a duplicate.
    commit(
        &store,
        vec![Write::UpsertToolCall(call(
            "r1",
            "triage",
            1,
            1,
            ToolCallStatus::Completed,
        ))],
    );
    let calls = store.journal("r1", "triage").unwrap().calls;
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].status, ToolCallStatus::Completed);
}

#[test]
fn a_steps_journal_has_its_delegations_and_nothing_else() {
    let (_dir, store) = open_temp();
    let mut writes = Vec::new();
    // Written out of order, to see the read order.
    for (run_id, path) in [
        ("r1", "triage/delegate/bbb"),
        ("r1", "triage"),
        ("r1", "triage/delegate/aaa/delegate/ccc"),
        ("r1", "triage/delegate/aaa"),
        // Not the step's: neighbours in the key order, another step, another run.
        ("r1", "triage-2"),
        ("r1", "triage/alpha"),
        ("r1", "triage2/delegate/x"),
        ("r1", "triagf"),
        ("r1", "other"),
        ("r2", "triage"),
    ] {
        writes.push(Write::UpsertTurn(turn(
            run_id,
            path,
            2,
            TurnStatus::Started,
        )));
        writes.push(Write::UpsertTurn(turn(
            run_id,
            path,
            1,
            TurnStatus::Completed,
        )));
        writes.push(Write::UpsertToolCall(call(
            run_id,
            path,
            1,
            2,
            ToolCallStatus::Started,
        )));
        writes.push(Write::UpsertToolCall(call(
            run_id,
            path,
            1,
            1,
            ToolCallStatus::Completed,
        )));
        writes.push(Write::UpsertDelegation(delegation(
            run_id,
            path,
            "k2",
            DelegationStatus::Started,
        )));
        writes.push(Write::UpsertDelegation(delegation(
            run_id,
            path,
            "k1",
            DelegationStatus::Failed,
        )));
    }
    commit(&store, writes);
    let j = store.journal("r1", "triage").unwrap();
    let ordered = [
        "triage",
        "triage/delegate/aaa",
        "triage/delegate/aaa/delegate/ccc",
        "triage/delegate/bbb",
    ];
    let (turns, calls, delegations) = paths(&j);
    let each = |suffixes: &[&str]| -> Vec<String> {
        ordered
            .iter()
            .flat_map(|p| suffixes.iter().map(move |s| format!("{p}#{s}")))
            .collect()
    };
    assert_eq!(turns, each(&["1", "2"]));
    assert_eq!(calls, each(&["1.1", "1.2"]));
    assert_eq!(delegations, each(&["k1", "k2"]));
    // A step nobody journaled has an empty journal.
    assert!(store.journal("r1", "missing").unwrap().is_empty());
    assert!(!j.is_empty());
    // A sub-agent's part, from the rows already read.
    let sub = j.sub("triage/delegate/aaa");
    assert_eq!(sub.turns.len(), 4);
    assert_eq!(sub.step_path, "triage/delegate/aaa");

    // The whole run, one journal per agent step, delegations inside their step's.
    let all = store.journals_of_run("r1").unwrap();
    let roots: Vec<(&str, usize)> = all
        .iter()
        .map(|j| (j.step_path.as_str(), j.turns.len()))
        .collect();
    assert_eq!(
        roots,
        vec![
            ("other", 2),
            ("triage", 8),
            ("triage-2", 2),
            ("triage/alpha", 2),
            ("triage2", 2),
            ("triagf", 2),
        ]
    );
    let triage = all
        .iter()
        .find(|j| j.step_path == "triage")
        .expect("triage");
    assert_eq!(
        triage, &j,
        "the run's view of a step is the step's own read"
    );
}

#[test]
fn reading_a_steps_journal_uses_the_primary_keys() {
    let (dir, _store) = open_temp();
    let conn = raw(&dir.path().join("state.db"));
    for (table, order) in [
        ("agent_turns", "step_path, iteration, turn"),
        ("tool_calls", "step_path, iteration, turn, call_index"),
        ("agent_delegations", "step_path, key"),
    ] {
        let sql = format!(
            "EXPLAIN QUERY PLAN SELECT * FROM {table} WHERE run_id = 'r' AND step_path >= 'p' \
             AND step_path < 'p/delegate0' AND (step_path = 'p' OR step_path >= 'p/delegate/') \
             ORDER BY {order}"
        );
        let plan: Vec<String> = conn
            .prepare(&sql)
            .and_then(|mut s| s.query_map([], |r| r.get::<_, String>(3))?.collect())
            .expect("query plan");
        let text = plan.join("\n");
        assert!(
            text.contains("USING INDEX sqlite_autoindex") && text.contains("step_path>?"),
            "{table}: {text}"
        );
        // Neither a scan nor a sort: the rows come in key order.
        assert!(!text.contains("SCAN"), "{table}: {text}");
        assert!(!text.contains("TEMP B-TREE"), "{table}: {text}");
    }
}

#[test]
fn pruning_a_run_deletes_its_journal() {
    let (_dir, store) = open_temp();
    let mut old = run("old");
    old.status = RunStatus::Completed;
    old.completed_at = Some(1_000);
    let live = run("live");
    let mut writes = vec![Write::InsertRun(old), Write::InsertRun(live)];
    for id in ["old", "live"] {
        writes.push(Write::UpsertTurn(turn(
            id,
            "triage",
            1,
            TurnStatus::Completed,
        )));
        writes.push(Write::UpsertToolCall(call(
            id,
            "triage",
            1,
            1,
            ToolCallStatus::Completed,
        )));
        writes.push(Write::UpsertTurn(turn(
            id,
            "triage/delegate/k1",
            1,
            TurnStatus::Completed,
        )));
        writes.push(Write::UpsertDelegation(delegation(
            id,
            "triage",
            "k1",
            DelegationStatus::Completed,
        )));
    }
    commit(&store, writes);
    let out = commit(&store, vec![Write::PruneFinishedBefore { cutoff: 10_000 }]);
    assert_eq!(out, vec![Outcome::Pruned { runs: 1 }]);
    assert!(store.journal("old", "triage").unwrap().is_empty());
    assert!(store.journals_of_run("old").unwrap().is_empty());
    let live = store.journal("live", "triage").unwrap();
    assert_eq!(
        (live.turns.len(), live.calls.len(), live.delegations.len()),
        (2, 1, 1)
    );
    let left: i64 = raw(store.path().expect("a SQLite store"))
        .query_row(
            "SELECT (SELECT COUNT(*) FROM agent_turns WHERE run_id = 'old')
                  + (SELECT COUNT(*) FROM tool_calls WHERE run_id = 'old')
                  + (SELECT COUNT(*) FROM agent_delegations WHERE run_id = 'old')",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(left, 0);
}
