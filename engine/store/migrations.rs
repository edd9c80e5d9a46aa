//! Versioned schema migrations, embedded in the binary and applied at open.
//!
//! A migration's version is its position in [`MIGRATIONS`] plus one. Never edit or
//! reorder an entry that has shipped: databases in the field have recorded it as
//! applied and will not run it again. Add a new entry instead.

use rusqlite::{Connection, TransactionBehavior};
use tracing::info;

use super::connection::now_ms;
use super::sql::lite;
use super::Error;

/// Ordered `(name, sql)` pairs.
pub(super) const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_initial", INITIAL),
    ("0002_dedup_lookup", DEDUP_LOOKUP),
    ("0003_drop_redundant_index", DROP_REDUNDANT_INDEX),
    ("0004_partial_parent_index", PARTIAL_PARENT_INDEX),
    ("0005_run_owner", RUN_OWNER),
    ("0006_agent_journal", AGENT_JOURNAL),
    ("0007_replicas", REPLICAS),
    ("0008_replay_of", REPLAY_OF),
    ("0009_replay_lookup", REPLAY_LOOKUP),
];

/// A run's page lists the runs that replay it: only replays are indexed.
const REPLAY_LOOKUP: &str = "CREATE INDEX ix_pipeline_runs_replay_of ON pipeline_runs (replay_of) WHERE replay_of IS NOT NULL;";

/// A replay (SPEC 12, `POST /runs/{id}/replay`) names the run it replays; NULL for
/// every other run (looked up through `0009_replay_lookup`).
const REPLAY_OF: &str = "ALTER TABLE pipeline_runs ADD COLUMN replay_of TEXT;";

/// A run created by `vectorstep run` records the process that owns it (the name of
/// its lock file, see `store::lock`); NULL means `serve` owns it. `serve` looks for
/// owned running runs every few seconds, so only those rows are indexed.
const RUN_OWNER: &str = "ALTER TABLE pipeline_runs ADD COLUMN owner TEXT;
CREATE INDEX ix_pipeline_runs_owner ON pipeline_runs (owner) WHERE owner IS NOT NULL;";

/// Only sub-pipeline children have a parent; indexing the NULLs of every other run
/// cost each insert a B-tree update for nothing. Lookups by parent (`parent_run_id =
/// ?`) imply NOT NULL, so they still use the index.
const PARTIAL_PARENT_INDEX: &str = "DROP INDEX IF EXISTS ix_pipeline_runs_parent;
CREATE INDEX ix_pipeline_runs_parent ON pipeline_runs (parent_run_id, parent_step_path)
    WHERE parent_run_id IS NOT NULL;";

/// `ix_pipeline_runs_dedup` starts with `pipeline_name`, so the single-column index
/// only cost every insert another B-tree update.
const DROP_REDUNDANT_INDEX: &str = "DROP INDEX IF EXISTS ix_pipeline_runs_pipeline_name;";

/// Dedup looks up recent runs by pipeline and fingerprint regardless of status.
const DEDUP_LOOKUP: &str = "CREATE INDEX ix_pipeline_runs_dedup ON pipeline_runs (pipeline_name, dedup_fingerprint, triggered_at);";

/// Status columns carry CHECK constraints with the values of SPEC section 5 so that a
/// typo in a caller fails its write loudly instead of producing a run that the resume
/// sweep (which looks for exactly 'running') silently ignores. TEXT primary keys are
/// NOT NULL because SQLite, for historical reasons, otherwise accepts NULL keys.
const INITIAL: &str = "
CREATE TABLE pipeline_runs (
    id                 TEXT PRIMARY KEY NOT NULL,
    pipeline_name      TEXT NOT NULL,
    status             TEXT NOT NULL CHECK (status IN ('running', 'completed', 'stopped',
                           'escalated', 'aborted', 'failed', 'interrupted', 'cancelled')),
    source             TEXT NOT NULL,
    team               TEXT,
    stage              TEXT NOT NULL,
    triggered_at       INTEGER NOT NULL,
    completed_at       INTEGER,
    resumed_at         INTEGER,
    resume_count       INTEGER NOT NULL DEFAULT 0,
    config_fingerprint TEXT NOT NULL,
    parent_run_id      TEXT,
    parent_step_path   TEXT,
    dedup_fingerprint  TEXT,
    context_json       TEXT NOT NULL,
    payload_json       TEXT NOT NULL,
    tokens_used        INTEGER NOT NULL DEFAULT 0,
    cost_usd           REAL NOT NULL DEFAULT 0,
    terminal_step      TEXT,
    reason             TEXT,
    final_output_json  TEXT
);
CREATE INDEX ix_pipeline_runs_status ON pipeline_runs (status);
CREATE INDEX ix_pipeline_runs_pipeline_name ON pipeline_runs (pipeline_name);
CREATE INDEX ix_pipeline_runs_triggered_at ON pipeline_runs (triggered_at);
CREATE INDEX ix_pipeline_runs_parent ON pipeline_runs (parent_run_id, parent_step_path);
-- At most one running run per pipeline and deduplication fingerprint.
CREATE UNIQUE INDEX ix_pipeline_runs_running_fingerprint
    ON pipeline_runs (pipeline_name, dedup_fingerprint)
    WHERE status = 'running' AND dedup_fingerprint IS NOT NULL;

CREATE TABLE pipeline_steps (
    run_id               TEXT NOT NULL REFERENCES pipeline_runs (id),
    step_path            TEXT NOT NULL,
    step_index           INTEGER NOT NULL,
    kind                 TEXT NOT NULL CHECK (kind IN ('step', 'parallel', 'branch',
                             'fan_out', 'fan_out_branch')),
    executor             TEXT NOT NULL,
    agent                TEXT,
    status               TEXT NOT NULL CHECK (status IN ('running', 'completed', 'stopped',
                             'escalated', 'aborted', 'failed', 'skipped', 'waiting')),
    attempts             INTEGER NOT NULL,
    iteration            INTEGER NOT NULL,
    idempotency_key      TEXT NOT NULL,
    started_at           INTEGER NOT NULL,
    finished_at          INTEGER,
    duration_ms          INTEGER,
    primary_confidence   REAL,
    effective_confidence REAL,
    output_json          TEXT,
    error                TEXT,
    input_tokens         INTEGER NOT NULL DEFAULT 0,
    output_tokens        INTEGER NOT NULL DEFAULT 0,
    cost_usd             REAL,
    items_json           TEXT,
    PRIMARY KEY (run_id, step_path)
);

CREATE TABLE run_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL,
    ts          INTEGER NOT NULL,
    level       TEXT NOT NULL,
    event       TEXT NOT NULL,
    msg         TEXT NOT NULL,
    fields_json TEXT NOT NULL
);
CREATE INDEX ix_run_events_run ON run_events (run_id, id);

CREATE TABLE pending_approvals (
    token         TEXT PRIMARY KEY NOT NULL,
    run_id        TEXT NOT NULL,
    step_path     TEXT NOT NULL,
    pipeline_name TEXT NOT NULL,
    message       TEXT NOT NULL,
    team          TEXT,
    stage         TEXT NOT NULL,
    channel       TEXT,
    created_at    INTEGER NOT NULL,
    deadline_at   INTEGER NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'rejected',
                      'timeout', 'closed')),
    decided_by    TEXT,
    decided_at    INTEGER,
    delivery_json TEXT
);
CREATE INDEX ix_pending_approvals_run ON pending_approvals (run_id);
CREATE INDEX ix_pending_approvals_status ON pending_approvals (status);

-- Outbox: a notification owed by a run is recorded before it is sent, under a key the
-- caller derives deterministically, so a crash between recording and sending neither
-- loses it nor sends it twice.
CREATE TABLE notifications (
    id         TEXT PRIMARY KEY NOT NULL,
    run_id     TEXT NOT NULL,
    action     TEXT NOT NULL,
    channel    TEXT NOT NULL,
    message    TEXT NOT NULL,
    status     TEXT NOT NULL CHECK (status IN ('pending', 'sent', 'failed')),
    created_at INTEGER NOT NULL,
    sent_at    INTEGER,
    error      TEXT
);
CREATE INDEX ix_notifications_status ON notifications (status);

CREATE TABLE kv (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
";

/// The step journal of tool-using agents (SPEC 10): one row per model turn, per tool
/// call and per delegation, committed like step records. Listed after `INITIAL` so
/// that the schema's status lists keep their order (`domain::tests` reads them).
///
/// Every read is "the rows of one step and of its `<step path>/delegate/...`
/// sub-paths" (a range on `step_path`) or "the rows of one run" (the API, retention),
/// so the primary keys, which start with `(run_id, step_path)`, are the indexes; no
/// other is needed. `effect_key` is UNIQUE: two calls can never share the key a
/// tool deduplicates its effects on. Turn messages hold only what that turn added
/// (the prompt on turn 1, tool results after), so the journal grows linearly.
const AGENT_JOURNAL: &str = "
CREATE TABLE agent_turns (
    run_id        TEXT NOT NULL,
    step_path     TEXT NOT NULL,
    iteration     INTEGER NOT NULL,
    turn          INTEGER NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('started', 'completed', 'failed')),
    messages_json TEXT NOT NULL,
    reply_json    TEXT,
    tools_json    TEXT,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd      REAL,
    error         TEXT,
    started_at    INTEGER NOT NULL,
    finished_at   INTEGER,
    PRIMARY KEY (run_id, step_path, iteration, turn)
);

CREATE TABLE tool_calls (
    run_id            TEXT NOT NULL,
    step_path         TEXT NOT NULL,
    iteration         INTEGER NOT NULL,
    turn              INTEGER NOT NULL,
    call_index        INTEGER NOT NULL,
    call_id           TEXT NOT NULL,
    tool              TEXT NOT NULL,
    arguments_json    TEXT NOT NULL,
    effect            TEXT NOT NULL CHECK (effect IN ('read', 'write')),
    effect_key        TEXT NOT NULL UNIQUE,
    status            TEXT NOT NULL CHECK (status IN ('started', 'completed', 'failed',
                          'waiting', 'rejected', 'timed_out', 'escalated')),
    attempt           INTEGER NOT NULL,
    result_json       TEXT,
    approval_token    TEXT,
    approval_deadline INTEGER,
    decided_by        TEXT,
    started_at        INTEGER NOT NULL,
    finished_at       INTEGER,
    duration_ms       INTEGER,
    PRIMARY KEY (run_id, step_path, iteration, turn, call_index)
);

CREATE TABLE agent_delegations (
    run_id       TEXT NOT NULL,
    step_path    TEXT NOT NULL,
    key          TEXT NOT NULL,
    agent        TEXT NOT NULL,
    question     TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('started', 'completed', 'failed')),
    output_json  TEXT,
    journal_path TEXT NOT NULL,
    started_at   INTEGER NOT NULL,
    finished_at  INTEGER,
    PRIMARY KEY (run_id, step_path, key)
);
";

/// Several replicas sharing one PostgreSQL store (SPEC 11; see `store::replicas`).
/// `replicas` is what each replica publishes (heartbeat, the pipeline fingerprints
/// it has loaded); the `lease_*` columns are a run's lease: owner, epoch (0: never
/// leased), expiry on the database's clock, and whether it was released at a step
/// boundary. The heartbeat renews "the running runs leased to me" in one statement,
/// hence the partial index. `named_leases` holds singletons (the Telegram poller),
/// `schedule_ticks` each schedule's next due tick, advanced by compare-and-set so a
/// cron tick fires once across replicas. SQLite gets the same tables (one schema),
/// where a single node simply never leases.
const REPLICAS: &str = "
CREATE TABLE replicas (
    id                TEXT PRIMARY KEY NOT NULL,
    kind              TEXT NOT NULL CHECK (kind IN ('serve', 'run')),
    started_at        INTEGER NOT NULL,
    heartbeat_at      INTEGER NOT NULL,
    stopped_at        INTEGER,
    fingerprints_json TEXT NOT NULL DEFAULT '[]',
    host              TEXT
);

ALTER TABLE pipeline_runs ADD COLUMN lease_owner TEXT;
ALTER TABLE pipeline_runs ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pipeline_runs ADD COLUMN lease_expires_at INTEGER;
ALTER TABLE pipeline_runs ADD COLUMN lease_released INTEGER NOT NULL DEFAULT 0;
CREATE INDEX ix_pipeline_runs_lease_owner ON pipeline_runs (lease_owner)
    WHERE status = 'running';

CREATE TABLE named_leases (
    name       TEXT PRIMARY KEY NOT NULL,
    owner      TEXT NOT NULL,
    epoch      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE TABLE schedule_ticks (
    pipeline_name TEXT PRIMARY KEY NOT NULL,
    next_due_at   INTEGER NOT NULL
);

ALTER TABLE notifications ADD COLUMN claimed_by TEXT;
ALTER TABLE notifications ADD COLUMN claimed_until INTEGER;
";

/// Applies every migration the database has not recorded yet.
pub(super) fn apply(conn: &mut Connection) -> Result<(), Error> {
    apply_list(conn, MIGRATIONS)
}

/// Each migration runs in its own IMMEDIATE transaction that also records it, so a
/// crash mid-migration leaves the previous version intact, and two processes opening
/// the same file at once cannot both apply the same version.
pub(super) fn apply_list(
    conn: &mut Connection,
    migrations: &'static [(&'static str, &'static str)],
) -> Result<(), Error> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    INTEGER PRIMARY KEY,
             applied_at INTEGER
         )",
    )?;
    let known = i64::try_from(migrations.len()).unwrap_or(i64::MAX);
    let newest: Option<i64> =
        conn.query_row("SELECT MAX(version) FROM schema_migrations", [], |r| {
            r.get(0)
        })?;
    if let Some(found) = newest.filter(|v| *v > known) {
        return Err(Error::SchemaTooNew { found, known });
    }

    for (version, (name, sql)) in (1_i64..).zip(migrations.iter()) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let applied: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = ?1)",
            [version],
            |r| r.get(0),
        )?;
        if applied {
            continue;
        }
        tx.execute_batch(sql).map_err(|source| Error::Migration {
            version,
            name,
            source,
        })?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
            lite(&[&version, &now_ms()]),
        )?;
        tx.commit()?;
        info!(version, name = *name, "Store migration applied.");
    }
    Ok(())
}
