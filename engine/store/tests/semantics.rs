//! Outcomes that are answers rather than errors: deduplication and first decisions.

use super::*;
use crate::store::Error;

fn deduped(id: &str, pipeline: &str, fingerprint: &str) -> RunRecord {
    RunRecord {
        pipeline_name: pipeline.into(),
        dedup_fingerprint: Some(fingerprint.into()),
        ..run(id)
    }
}

#[test]
fn a_running_duplicate_is_reported_without_failing_the_batch() {
    let (_dir, store) = open_temp();
    assert_eq!(
        commit(&store, vec![Write::InsertRun(deduped("r1", "p", "fp"))]),
        [Outcome::RunInserted]
    );
    let out = commit(
        &store,
        vec![
            Write::InsertRun(deduped("r2", "p", "fp")),
            Write::AppendEvent(event("r1", "deduplicated")),
        ],
    );
    assert_eq!(
        out,
        [
            Outcome::DuplicateRunning {
                existing_run_id: "r1".into()
            },
            Outcome::Done
        ]
    );
    assert_eq!(store.run("r2").unwrap(), None);
    assert_eq!(
        store.events("r1").unwrap().len(),
        1,
        "the rest of the batch is kept"
    );

    // Other pipelines, other fingerprints and runs without one are not duplicates.
    let out = commit(
        &store,
        vec![
            Write::InsertRun(deduped("r3", "other", "fp")),
            Write::InsertRun(deduped("r4", "p", "fp2")),
            Write::InsertRun(run("r5")),
            Write::InsertRun(run("r6")),
        ],
    );
    assert_eq!(out, vec![Outcome::RunInserted; 4]);
}

#[test]
fn a_finished_run_no_longer_blocks_its_fingerprint() {
    let (_dir, store) = open_temp();
    commit(&store, vec![Write::InsertRun(deduped("r1", "p", "fp"))]);
    commit(
        &store,
        vec![Write::FinishRun {
            run_id: "r1".into(),
            status: RunStatus::Completed,
            completed_at: 1,
            terminal_step: None,
            reason: None,
            final_output_json: None,
        }],
    );
    assert_eq!(
        commit(&store, vec![Write::InsertRun(deduped("r2", "p", "fp"))]),
        [Outcome::RunInserted]
    );
    assert_eq!(store.count_runs_with_status(RunStatus::Running).unwrap(), 1);
}

#[test]
fn the_partial_unique_index_backs_the_check() {
    // Even a writer that skipped the check could not create a second running run.
    let (dir, store) = open_temp();
    commit(&store, vec![Write::InsertRun(deduped("r1", "p", "fp"))]);
    let err = raw(&dir.path().join("state.db"))
        .execute(
            "INSERT INTO pipeline_runs (id, pipeline_name, status, source, stage, triggered_at, \
             config_fingerprint, dedup_fingerprint, context_json, payload_json) \
             VALUES ('r2', 'p', 'running', 's', 'prod', 1, 'f', 'fp', '{}', '{}')",
            [],
        )
        .expect_err("unique index must reject");
    assert!(err.to_string().contains("UNIQUE"), "{err}");
}

#[test]
fn the_first_approval_decision_wins() {
    let (_dir, store) = open_temp();
    commit(&store, vec![Write::InsertApproval(approval("t1", "r1"))]);
    let decide = |status: &str, by: &str, at| Write::DecideApproval {
        token: "t1".into(),
        status: status.parse().expect("a known status"),
        by: Some(by.into()),
        at,
    };
    let out = commit(
        &store,
        vec![
            decide("approved", "alice", 10),
            decide("rejected", "bob", 11),
        ],
    );
    assert_eq!(
        out,
        [
            Outcome::ApprovalDecided,
            Outcome::ApprovalAlreadyDecided {
                status: ApprovalStatus::Approved
            }
        ]
    );
    let out = commit(
        &store,
        vec![
            decide("timeout", "deadline", 12),
            Write::DecideApproval {
                token: "nope".into(),
                status: ApprovalStatus::Approved,
                by: None,
                at: 1,
            },
        ],
    );
    assert_eq!(
        out,
        [
            Outcome::ApprovalAlreadyDecided {
                status: ApprovalStatus::Approved
            },
            Outcome::ApprovalUnknown
        ]
    );
    let a = store.approval("t1").unwrap().expect("exists");
    assert_eq!(
        (a.status.as_str(), a.decided_by.as_deref(), a.decided_at),
        ("approved", Some("alice"), Some(10))
    );
}

/// The types cannot hold a word outside the contract, and the schema's CHECK
/// constraints refuse one; a row that holds one all the same (written by hand with
/// the constraints switched off) reads back as a corrupt row naming the column and
/// the words expected, not as a panic or a silently different status.
#[test]
fn a_status_outside_the_spec_reads_back_as_a_corrupt_row() {
    let (dir, store) = open_temp();
    commit(&store, vec![Write::InsertRun(run("r1"))]);
    let raw = rusqlite::Connection::open(dir.path().join("state.db")).expect("raw connection");
    raw.execute_batch(
        "PRAGMA ignore_check_constraints = ON; \
         UPDATE pipeline_runs SET status = 'runing' WHERE id = 'r1';",
    )
    .expect("write a bad word");
    let err = store.run("r1").expect_err("an unknown word");
    assert!(
        matches!(
            err,
            Error::Corrupt {
                table: "pipeline_runs",
                column: "status",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "corrupt row in pipeline_runs.status: `runing` is not a run status (expected one of: \
         running, completed, stopped, escalated, aborted, failed, interrupted, cancelled)"
    );
}

#[test]
fn pruning_deletes_only_old_finished_runs_and_what_belongs_to_them() {
    let (_dir, store) = open_temp();
    let mut old = run("old");
    old.status = RunStatus::Completed;
    old.completed_at = Some(1_000);
    let mut recent = run("recent");
    recent.status = RunStatus::Failed;
    recent.completed_at = Some(50_000);
    let mut live = run("live");
    live.completed_at = None;
    commit(
        &store,
        vec![
            Write::InsertRun(old),
            Write::InsertRun(recent),
            Write::InsertRun(live),
            Write::UpsertStep(step("old", "a", 0)),
            Write::AppendEvent(event("old", "x")),
            Write::InsertNotification(notification("n-old", "old")),
            Write::UpsertStep(step("live", "a", 0)),
        ],
    );
    let out = commit(&store, vec![Write::PruneFinishedBefore { cutoff: 10_000 }]);
    assert_eq!(out, vec![Outcome::Pruned { runs: 1 }]);
    assert!(store.run("old").unwrap().is_none());
    assert!(store.steps("old").unwrap().is_empty());
    assert!(store.events("old").unwrap().is_empty());
    assert!(store.notifications_of_run("old").unwrap().is_empty());
    assert!(store.run("recent").unwrap().is_some());
    assert!(store.run("live").unwrap().is_some());
    assert_eq!(store.steps("live").unwrap().len(), 1);
}

#[test]
fn conditional_writes_are_applied_only_with_their_run() {
    let (_dir, store) = open_temp();
    let first = commit(
        &store,
        vec![
            Write::InsertRun(deduped("a", "p", "fp")),
            Write::AppendEventIfInserted(event("a", "started")),
            Write::UpsertStepIfInserted(step("a", "triage", 0)),
        ],
    );
    assert_eq!(
        first,
        vec![Outcome::RunInserted, Outcome::Done, Outcome::Done]
    );
    let second = commit(
        &store,
        vec![
            Write::InsertRun(deduped("b", "p", "fp")),
            Write::AppendEventIfInserted(event("b", "started")),
            Write::UpsertStepIfInserted(step("b", "triage", 0)),
        ],
    );
    assert_eq!(
        second[0],
        Outcome::DuplicateRunning {
            existing_run_id: "a".into()
        }
    );
    assert_eq!(store.events("a").unwrap().len(), 1);
    assert!(
        store.events("b").unwrap().is_empty(),
        "a deduplicated run left an event behind"
    );
    assert_eq!(store.steps("a").unwrap().len(), 1);
    assert!(
        store.steps("b").unwrap().is_empty(),
        "a deduplicated run left a step record behind"
    );
}
