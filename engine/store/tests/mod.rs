//! Tests of the store against real SQLite files in temporary directories.

mod concurrency;
mod journal;
mod migrations;
mod records;
mod semantics;

use std::path::Path;

use crate::domain::{ApprovalStatus, NotificationStatus, RunStatus, StepKind, StepStatus};

use super::{
    ApprovalRecord, EventRecord, NotificationRecord, Outcome, RunRecord, StepRecord, Store, Write,
};

fn open_temp() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("state.db")).expect("open store");
    (dir, store)
}

fn raw(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("raw connection");
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .expect("busy timeout");
    conn
}

fn commit(store: &Store, writes: Vec<Write>) -> Vec<Outcome> {
    store.commit_blocking(writes).expect("commit")
}

/// A running run with every optional column empty.
fn run(id: &str) -> RunRecord {
    RunRecord {
        id: id.into(),
        pipeline_name: "disk-full".into(),
        status: RunStatus::Running,
        source: "webhook".into(),
        team: None,
        stage: "prod".into(),
        triggered_at: 1_700_000_000_000,
        completed_at: None,
        resumed_at: None,
        resume_count: 0,
        config_fingerprint: "f1".into(),
        parent_run_id: None,
        parent_step_path: None,
        dedup_fingerprint: None,
        context_json: "{}".into(),
        payload_json: r#"{"host":"db1"}"#.into(),
        tokens_used: 0,
        cost_usd: 0.0,
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
        executor: "shell".into(),
        agent: None,
        status: StepStatus::Running,
        attempts: 1,
        iteration: 1,
        idempotency_key: format!("{run_id}:{path}:1"),
        started_at: 1_700_000_000_100,
        finished_at: None,
        duration_ms: None,
        primary_confidence: None,
        effective_confidence: None,
        output_json: None,
        error: None,
        input_tokens: 0,
        output_tokens: 0,
        cost_usd: None,
        items_json: None,
    }
}

fn event(run_id: &str, msg: &str) -> EventRecord {
    EventRecord {
        id: 0,
        run_id: run_id.into(),
        ts: 1_700_000_000_200,
        level: "info".into(),
        event: "step_started".into(),
        msg: msg.into(),
        fields_json: "{}".into(),
    }
}

fn approval(token: &str, run_id: &str) -> ApprovalRecord {
    ApprovalRecord {
        token: token.into(),
        run_id: run_id.into(),
        step_path: "approve".into(),
        pipeline_name: "disk-full".into(),
        message: "Delete old logs on db1?".into(),
        team: None,
        stage: "prod".into(),
        channel: None,
        created_at: 1_700_000_000_300,
        deadline_at: 1_700_000_600_300,
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
        action: "escalate".into(),
        channel: "telegram".into(),
        message: "db1 disk full".into(),
        status: NotificationStatus::Pending,
        created_at: 1_700_000_000_400,
        sent_at: None,
        error: None,
    }
}

#[test]
fn the_store_can_be_shared_across_threads_and_tasks() {
    fn shareable<T: Clone + Send + Sync + 'static>() {}
    fn sendable<T: Send + Sync + 'static>() {}
    shareable::<Store>();
    // Errors cross thread and task boundaries (spawn_blocking, anyhow at the edge).
    sendable::<super::Error>();
}
