//! Every write variant round-trips through the reads, column for column.

use super::*;
use crate::store::{Error, RunFilter};

#[test]
fn run_with_every_column_set_round_trips() {
    let (_dir, store) = open_temp();
    let full = RunRecord {
        team: Some("sre".into()),
        completed_at: Some(5),
        resumed_at: Some(4),
        resume_count: 3,
        parent_run_id: Some("parent".into()),
        parent_step_path: Some("child/call".into()),
        dedup_fingerprint: Some("dedup".into()),
        tokens_used: 1234,
        cost_usd: 0.25,
        terminal_step: Some("fix".into()),
        reason: Some("done".into()),
        final_output_json: Some(r#"{"ok":true}"#.into()),
        replay_of: Some("r0".into()),
        status: RunStatus::Completed,
        ..run("r1")
    };
    let bare = run("r2");
    let out = commit(
        &store,
        vec![
            Write::InsertRun(full.clone()),
            Write::InsertRun(bare.clone()),
        ],
    );
    assert_eq!(out, vec![Outcome::RunInserted, Outcome::RunInserted]);
    assert_eq!(store.run("r1").unwrap(), Some(full));
    assert_eq!(store.run("r2").unwrap(), Some(bare));
    assert_eq!(store.run("missing").unwrap(), None);
}

#[test]
fn finish_usage_and_resume_update_the_run() {
    let (_dir, store) = open_temp();
    commit(&store, vec![Write::InsertRun(run("r1"))]);
    let out = commit(
        &store,
        vec![
            Write::MarkResumed {
                run_id: "r1".into(),
                at: 10,
                counted: true,
            },
            Write::MarkResumed {
                run_id: "r1".into(),
                at: 20,
                counted: true,
            },
            // A clean handoff sets nothing new and is not counted.
            Write::MarkResumed {
                run_id: "r1".into(),
                at: 30,
                counted: false,
            },
            Write::SetRunUsage {
                run_id: "r1".into(),
                tokens_used: 99,
                cost_usd: 1.5,
            },
            Write::FinishRun {
                run_id: "r1".into(),
                status: RunStatus::Escalated,
                completed_at: 30,
                terminal_step: Some("check".into()),
                reason: Some("low confidence".into()),
                final_output_json: Some("[1]".into()),
            },
        ],
    );
    assert_eq!(out, vec![Outcome::Done; 5]);
    let got = store.run("r1").unwrap().expect("run exists");
    assert_eq!(got.resumed_at, Some(10), "the first resume time is kept");
    assert_eq!(got.resume_count, 2);
    assert_eq!((got.tokens_used, got.cost_usd), (99, 1.5));
    assert_eq!(got.status, "escalated");
    assert_eq!(got.completed_at, Some(30));
    assert_eq!(got.terminal_step.as_deref(), Some("check"));
    assert_eq!(got.reason.as_deref(), Some("low confidence"));
    assert_eq!(got.final_output_json.as_deref(), Some("[1]"));

    // A second finisher must not overwrite the first terminal status.
    let again = Write::FinishRun {
        run_id: "r1".into(),
        status: RunStatus::Failed,
        completed_at: 40,
        terminal_step: None,
        reason: None,
        final_output_json: None,
    };
    assert_eq!(commit(&store, vec![again]), vec![Outcome::NotRunning]);
    let got = store.run("r1").unwrap().expect("run exists");
    assert_eq!(
        (got.status.as_str(), got.completed_at),
        ("escalated", Some(30))
    );
}

#[test]
fn run_listing_filters_orders_and_pages() {
    let (_dir, store) = open_temp();
    let mk = |id: &str, pipeline: &str, status: &str, at: i64| RunRecord {
        pipeline_name: pipeline.into(),
        status: status.parse().expect("a known status"),
        triggered_at: at,
        ..run(id)
    };
    commit(
        &store,
        vec![
            Write::InsertRun(mk("a", "p1", "running", 100)),
            Write::InsertRun(mk("b", "p1", "completed", 300)),
            Write::InsertRun(mk("c", "p2", "running", 200)),
            Write::InsertRun(mk("d", "p2", "running", 200)),
        ],
    );
    let ids = |runs: Vec<RunRecord>| runs.into_iter().map(|r| r.id).collect::<Vec<_>>();

    assert_eq!(
        ids(store.runs(&RunFilter::default()).unwrap()),
        ["b", "c", "d", "a"]
    );
    let page = RunFilter {
        limit: 2,
        offset: 1,
        ..RunFilter::default()
    };
    assert_eq!(ids(store.runs(&page).unwrap()), ["c", "d"]);
    let running = RunFilter {
        status: Some("running".into()),
        ..RunFilter::default()
    };
    assert_eq!(ids(store.runs(&running).unwrap()), ["c", "d", "a"]);
    let p1 = RunFilter {
        pipeline: Some("p1".into()),
        ..RunFilter::default()
    };
    assert_eq!(ids(store.runs(&p1).unwrap()), ["b", "a"]);
    let both = RunFilter {
        pipeline: Some("p2".into()),
        ..running
    };
    assert_eq!(ids(store.runs(&both).unwrap()), ["c", "d"]);

    assert_eq!(
        ids(store.runs_with_status(RunStatus::Running).unwrap()),
        ["a", "c", "d"]
    );
    assert_eq!(store.count_runs_with_status(RunStatus::Running).unwrap(), 3);
    assert_eq!(store.count_runs_with_status(RunStatus::Failed).unwrap(), 0);
}

#[test]
fn child_run_is_found_by_parent_and_step() {
    let (_dir, store) = open_temp();
    let child = RunRecord {
        parent_run_id: Some("p".into()),
        parent_step_path: Some("call".into()),
        ..run("child")
    };
    commit(
        &store,
        vec![Write::InsertRun(run("p")), Write::InsertRun(child.clone())],
    );
    assert_eq!(store.child_run("p", "call").unwrap(), Some(child));
    assert_eq!(store.child_run("p", "other").unwrap(), None);
}

#[test]
fn upsert_step_replaces_every_column() {
    let (_dir, store) = open_temp();
    let first = step("r1", "fix", 2);
    let done = StepRecord {
        step_index: 3,
        kind: StepKind::FanOut,
        executor: "llm".into(),
        agent: Some("triage".into()),
        status: StepStatus::Completed,
        attempts: 2,
        iteration: 4,
        idempotency_key: "k2".into(),
        started_at: 7,
        finished_at: Some(9),
        duration_ms: Some(2),
        primary_confidence: Some(0.5),
        effective_confidence: Some(0.75),
        output_json: Some(r#"{"a":1}"#.into()),
        error: Some("warn".into()),
        input_tokens: 10,
        output_tokens: 20,
        cost_usd: Some(0.125),
        items_json: Some("[1,2]".into()),
        ..first.clone()
    };
    commit(
        &store,
        vec![
            Write::InsertRun(run("r1")),
            Write::UpsertStep(first.clone()),
        ],
    );
    assert_eq!(store.steps("r1").unwrap(), vec![first]);
    assert_eq!(
        commit(&store, vec![Write::UpsertStep(done.clone())]),
        [Outcome::Done]
    );
    assert_eq!(store.steps("r1").unwrap(), vec![done]);
}

#[test]
fn steps_come_in_index_then_path_order() {
    let (_dir, store) = open_temp();
    commit(
        &store,
        vec![
            Write::InsertRun(run("r1")),
            Write::UpsertStep(step("r1", "notify", 2)),
            Write::UpsertStep(step("r1", "group/b", 1)),
            Write::UpsertStep(step("r1", "group", 1)),
            Write::UpsertStep(step("r1", "check", 0)),
        ],
    );
    let paths: Vec<_> = store
        .steps("r1")
        .unwrap()
        .into_iter()
        .map(|s| s.step_path)
        .collect();
    assert_eq!(paths, ["check", "group", "group/b", "notify"]);
    assert!(store.steps("other").unwrap().is_empty());
}

#[test]
fn events_round_trip_with_database_ids() {
    let (_dir, store) = open_temp();
    let mut e = event("r1", "first");
    e.id = 777;
    e.fields_json = r#"{"step":"fix"}"#.into();
    commit(
        &store,
        vec![
            Write::AppendEvent(e.clone()),
            Write::AppendEvent(event("r2", "x")),
        ],
    );
    let got = store.events("r1").unwrap();
    assert_eq!(got.len(), 1);
    assert_ne!(got[0].id, 777, "the id passed in is ignored");
    assert_eq!(got[0], EventRecord { id: got[0].id, ..e });
}

#[test]
fn approvals_round_trip_and_close_with_the_run() {
    let (_dir, store) = open_temp();
    let full = ApprovalRecord {
        team: Some("sre".into()),
        channel: Some("tg".into()),
        ..approval("t1", "r1")
    };
    commit(
        &store,
        vec![
            Write::InsertApproval(full.clone()),
            Write::InsertApproval(approval("t2", "r1")),
            Write::InsertApproval(approval("t3", "r2")),
            Write::SetApprovalDelivery {
                token: "t1".into(),
                delivery_json: r#"{"msg":5}"#.into(),
            },
            Write::DecideApproval {
                token: "t2".into(),
                status: ApprovalStatus::Approved,
                by: None,
                at: 8,
            },
        ],
    );
    let t1 = store.approval("t1").unwrap().expect("t1 exists");
    assert_eq!(
        t1,
        ApprovalRecord {
            delivery_json: Some(r#"{"msg":5}"#.into()),
            ..full
        }
    );
    assert_eq!(store.approval("nope").unwrap(), None);

    let out = commit(
        &store,
        vec![Write::CloseApprovalsOfRun {
            run_id: "r1".into(),
            at: 50,
        }],
    );
    assert_eq!(out, [Outcome::Done]);
    let statuses: Vec<_> = store
        .approvals_of_run("r1")
        .unwrap()
        .into_iter()
        .map(|a| (a.token, a.status.to_string(), a.decided_at))
        .collect();
    assert_eq!(
        statuses,
        [
            ("t1".to_string(), "closed".to_string(), Some(50)),
            ("t2".to_string(), "approved".to_string(), Some(8)),
        ]
    );
    let pending: Vec<_> = store
        .approvals_with_status(ApprovalStatus::Pending)
        .unwrap()
        .into_iter()
        .map(|a| a.token)
        .collect();
    assert_eq!(pending, ["t3"]);
}

#[test]
fn a_notification_claim_keeps_other_senders_off_until_its_attempt_is_marked() {
    let (_dir, store) = open_temp();
    commit(
        &store,
        vec![Write::InsertNotification(notification("n1", "r1"))],
    );
    let claim = |who: &str, ms: u64| Write::ClaimNotification {
        id: "n1".into(),
        claimer: who.into(),
        claim_ms: ms,
        take_from: None,
    };
    let mark = |status| Write::MarkNotification {
        id: "n1".into(),
        status,
        at: 5,
        error: None,
    };
    use Outcome::{NotificationBusy as Busy, NotificationClaimed as Claimed};
    assert_eq!(
        commit(
            &store,
            vec![claim("a", 60_000), claim("b", 60_000), claim("a", 60_000)]
        ),
        [Claimed, Busy, Claimed],
        "held by a against b, again by a"
    );
    // A failed attempt stays pending and frees the row for any sender.
    commit(&store, vec![mark(NotificationStatus::Pending)]);
    assert_eq!(commit(&store, vec![claim("b", 0)]), [Claimed]);
    // A claim that ran out (a sender that died mid-send) is taken over.
    assert_eq!(commit(&store, vec![claim("a", 60_000)]), [Claimed]);
    assert_eq!(
        store.notification_claimant("n1").unwrap().as_deref(),
        Some("a")
    );
    // b has seen a gone: it takes a's running claim.
    let take = Write::ClaimNotification {
        id: "n1".into(),
        claimer: "b".into(),
        claim_ms: 60_000,
        take_from: Some("c".into()),
    };
    assert_eq!(
        commit(&store, vec![take]),
        [Busy],
        "only from the one seen gone"
    );
    let take = Write::ClaimNotification {
        id: "n1".into(),
        claimer: "b".into(),
        claim_ms: 60_000,
        take_from: Some("a".into()),
    };
    assert_eq!(commit(&store, vec![take]), [Claimed]);
    assert_eq!(
        store.notification_claimant("n1").unwrap().as_deref(),
        Some("b")
    );
    commit(&store, vec![mark(NotificationStatus::Sent)]);
    assert_eq!(
        store.notification_claimant("n1").unwrap(),
        None,
        "marked: no claim"
    );
    assert_eq!(
        commit(&store, vec![claim("b", 60_000)]),
        [Busy],
        "a sent notification is nobody's to send"
    );
    assert_eq!(commit(&store, vec![claim("x", 1)]), [Busy]);
}

#[test]
fn a_write_fenced_by_a_named_lease_applies_only_for_its_holder() {
    let (_dir, store) = open_temp();
    let acquire = |owner: &str, ms: u64| Write::AcquireNamedLease {
        name: "telegram_poller".into(),
        owner: owner.into(),
        lease_ms: ms,
    };
    let fenced = |owner: &str, epoch: u64, value: &str| {
        vec![
            Write::FenceNamedLease {
                name: "telegram_poller".into(),
                owner: owner.into(),
                epoch,
            },
            Write::SetKv {
                key: "telegram:update_offset".into(),
                value: value.into(),
            },
        ]
    };
    assert_eq!(
        commit(&store, vec![acquire("a", 60_000)]),
        [Outcome::NamedLeaseHeld { epoch: 1 }]
    );
    commit(&store, fenced("a", 1, "10"));
    let refused = |writes: Vec<Write>| match store.commit_blocking(writes) {
        Err(Error::NamedLeaseLost { owner, .. }) => owner,
        other => panic!("refused: {other:?}"),
    };
    assert_eq!(
        refused(fenced("b", 1, "20")),
        Some("a".to_string()),
        "not b's"
    );
    assert_eq!(
        refused(fenced("a", 2, "20")),
        Some("a".to_string()),
        "not that epoch"
    );
    // a's lease runs out: its next fenced write is refused too, then b takes over.
    commit(&store, vec![acquire("a", 0)]);
    assert_eq!(
        refused(fenced("a", 1, "20")),
        Some("a".to_string()),
        "expired"
    );
    assert_eq!(
        commit(&store, vec![acquire("b", 60_000)]),
        [Outcome::NamedLeaseHeld { epoch: 2 }]
    );
    commit(&store, fenced("b", 2, "30"));
    assert_eq!(
        store.kv("telegram:update_offset").unwrap().as_deref(),
        Some("30")
    );
}

#[test]
fn notifications_are_recorded_once_and_marked() {
    let (_dir, store) = open_temp();
    let n1 = notification("r1:escalate:1", "r1");
    let mut dup = n1.clone();
    dup.message = "a different text".into();
    commit(
        &store,
        vec![
            Write::InsertNotification(n1.clone()),
            Write::InsertNotification(dup),
            Write::InsertNotification(notification("r1:escalate:2", "r1")),
        ],
    );
    assert_eq!(
        store.notifications_of_run("r1").unwrap()[0],
        n1,
        "the first record wins"
    );
    assert_eq!(store.pending_notifications().unwrap().len(), 2);

    commit(
        &store,
        vec![
            Write::MarkNotification {
                id: n1.id.clone(),
                status: NotificationStatus::Sent,
                at: 9,
                error: None,
            },
            Write::MarkNotification {
                id: "r1:escalate:2".into(),
                status: NotificationStatus::Failed,
                at: 10,
                error: Some("429".into()),
            },
        ],
    );
    let got = store.notifications_of_run("r1").unwrap();
    assert_eq!((got[0].status.as_str(), got[0].sent_at), ("sent", Some(9)));
    assert_eq!(
        (got[1].status.as_str(), got[1].error.as_deref()),
        ("failed", Some("429"))
    );
    assert!(store.pending_notifications().unwrap().is_empty());
}

#[test]
fn kv_sets_and_overwrites() {
    let (_dir, store) = open_temp();
    commit(
        &store,
        vec![Write::SetKv {
            key: "tg.offset".into(),
            value: "1".into(),
        }],
    );
    commit(
        &store,
        vec![Write::SetKv {
            key: "tg.offset".into(),
            value: "2".into(),
        }],
    );
    assert_eq!(store.kv("tg.offset").unwrap().as_deref(), Some("2"));
    assert_eq!(store.kv("missing").unwrap(), None);
}

#[test]
fn a_corrupt_row_is_an_error_naming_table_and_column() {
    let (dir, store) = open_temp();
    commit(&store, vec![Write::InsertRun(run("r1"))]);
    raw(&dir.path().join("state.db"))
        .execute("UPDATE pipeline_runs SET tokens_used = -1", [])
        .expect("raw update");
    match store.run("r1") {
        Err(Error::Corrupt { table, column, .. }) => {
            assert_eq!((table, column), ("pipeline_runs", "tokens_used"));
        }
        other => panic!("expected a corrupt-row error, got {other:?}"),
    }
    assert_eq!(store.integrity_check().unwrap(), "ok");
}

#[test]
fn events_after_and_status_reads_a_look_of_the_events_stream() {
    let (_dir, store) = open_temp();
    assert_eq!(
        store.events_after_and_status("r1", 0, 10).expect("read"),
        (Vec::new(), None)
    );
    commit(
        &store,
        vec![
            Write::InsertRun(run("r1")),
            Write::AppendEvent(event("r1", "one")),
            Write::AppendEvent(event("r1", "two")),
            Write::AppendEvent(event("r1", "three")),
            Write::InsertRun(run("r2")),
            Write::AppendEvent(event("r2", "other")),
        ],
    );
    let (all, status) = store.events_after_and_status("r1", 0, 10).expect("read");
    assert_eq!(status, Some(RunStatus::Running));
    let msgs = |es: &[EventRecord]| es.iter().map(|e| e.msg.clone()).collect::<Vec<_>>();
    assert_eq!(msgs(&all), ["one", "two", "three"]);
    assert_eq!(all, store.events_after("r1", 0, 10).expect("read"));
    let (rest, _) = store
        .events_after_and_status("r1", all[0].id, 10)
        .expect("read");
    assert_eq!(msgs(&rest), ["two", "three"]);
    let (first_two, _) = store.events_after_and_status("r1", 0, 2).expect("read");
    assert_eq!(msgs(&first_two), ["one", "two"]);
    let (none, status) = store
        .events_after_and_status("r1", all[2].id, 10)
        .expect("read");
    assert!(none.is_empty());
    assert_eq!(status, Some(RunStatus::Running));
}
