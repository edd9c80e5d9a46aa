//! `pipeline_runs`: one row per run; the resume sweep starts from its `running` rows.

use super::connection::{query_all, query_opt, Cols};
use super::error::DbError;
use super::sql::{Bind, Db};
use super::{Error, Outcome, Store};
use crate::domain::{RunId, RunStatus, UnixMillis};

/// A row of `pipeline_runs`. JSON columns hold serialised JSON the store never parses.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub id: RunId,
    pub pipeline_name: String,
    pub status: RunStatus,
    pub source: String,
    pub team: Option<String>,
    pub stage: String,
    pub triggered_at: UnixMillis,
    pub completed_at: Option<UnixMillis>,
    pub resumed_at: Option<UnixMillis>,
    pub resume_count: u32,
    pub config_fingerprint: String,
    pub parent_run_id: Option<String>,
    pub parent_step_path: Option<String>,
    pub dedup_fingerprint: Option<String>,
    pub context_json: String,
    pub payload_json: String,
    pub tokens_used: u64,
    pub cost_usd: f64,
    pub terminal_step: Option<String>,
    pub reason: Option<String>,
    pub final_output_json: Option<String>,
    /// The run this one replays (`POST /runs/{id}/replay`), if it is a replay.
    pub replay_of: Option<String>,
}

/// Selects runs for listing. `limit == 0` means no limit, so `RunFilter::default()`
/// lists everything.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunFilter {
    pub status: Option<String>,
    pub pipeline: Option<String>,
    pub limit: u32,
    pub offset: u32,
}

const TABLE: &str = "pipeline_runs";

const INSERT: &str = "INSERT INTO pipeline_runs (id, pipeline_name, status, source, team, \
    stage, triggered_at, completed_at, resumed_at, resume_count, config_fingerprint, \
    parent_run_id, parent_step_path, dedup_fingerprint, context_json, payload_json, \
    tokens_used, cost_usd, terminal_step, reason, final_output_json, replay_of) VALUES (?1, \
    ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, \
    ?21, ?22)";

pub(super) const COLUMNS: &str = "id, pipeline_name, status, source, team, stage, triggered_at, \
    completed_at, resumed_at, resume_count, config_fingerprint, parent_run_id, \
    parent_step_path, dedup_fingerprint, context_json, payload_json, tokens_used, cost_usd, \
    terminal_step, reason, final_output_json, replay_of";

impl RunRecord {
    pub(super) fn decode(c: &Cols) -> Result<Self, Error> {
        Ok(RunRecord {
            id: c.get("id")?,
            pipeline_name: c.get("pipeline_name")?,
            status: c.word("status")?,
            source: c.get("source")?,
            team: c.get("team")?,
            stage: c.get("stage")?,
            triggered_at: c.get("triggered_at")?,
            completed_at: c.get("completed_at")?,
            resumed_at: c.get("resumed_at")?,
            resume_count: c.get("resume_count")?,
            config_fingerprint: c.get("config_fingerprint")?,
            parent_run_id: c.get("parent_run_id")?,
            parent_step_path: c.get("parent_step_path")?,
            dedup_fingerprint: c.get("dedup_fingerprint")?,
            context_json: c.get("context_json")?,
            payload_json: c.get("payload_json")?,
            tokens_used: c.get("tokens_used")?,
            cost_usd: c.get("cost_usd")?,
            terminal_step: c.get("terminal_step")?,
            reason: c.get("reason")?,
            final_output_json: c.get("final_output_json")?,
            replay_of: c.get("replay_of")?,
        })
    }
}

/// Looks for a conflicting run before inserting, rather than catching the
/// unique-index violation: a failed statement would force the caller's whole batch to
/// roll back, while a duplicate is an expected answer, not an error. The writer is the
/// only writer and holds an IMMEDIATE transaction, so nothing can slip in between.
pub(super) fn insert_dedup(
    db: &impl Db,
    run: &RunRecord,
    window_start: i64,
) -> Result<Outcome, DbError> {
    serialize_fingerprint(db, run)?;
    if let Some(outcome) = running_duplicate(db, run)? {
        return Ok(outcome);
    }
    if let Some(fingerprint) = &run.dedup_fingerprint {
        // Newest first straight off `ix_pipeline_runs_dedup`: no sort, no temp table.
        let recent: Option<(String, RunStatus)> = db.first(
            TABLE,
            "SELECT id, status FROM pipeline_runs WHERE pipeline_name = ?1 \
             AND dedup_fingerprint = ?2 AND triggered_at >= ?3 \
             ORDER BY triggered_at DESC LIMIT 1",
            &[&run.pipeline_name, &fingerprint, &window_start],
            |c| Ok((c.get("id")?, c.word("status")?)),
        )?;
        if let Some((existing_run_id, status)) = recent {
            return Ok(Outcome::DuplicateRecent {
                existing_run_id,
                status,
            });
        }
    }
    insert_row(db, run)
}

pub(super) fn insert(db: &impl Db, run: &RunRecord) -> Result<Outcome, DbError> {
    serialize_fingerprint(db, run)?;
    if let Some(outcome) = running_duplicate(db, run)? {
        return Ok(outcome);
    }
    insert_row(db, run)
}

/// On PostgreSQL, where several replicas insert at once, the check for a
/// duplicate and the insert must not interleave with another replica's: a
/// transaction-scoped advisory lock on (pipeline, fingerprint), held until this
/// batch's transaction ends, makes the second insert see the first. SQLite has one
/// writer, so nothing interleaves there.
fn serialize_fingerprint(db: &impl Db, run: &RunRecord) -> Result<(), DbError> {
    let Some(fingerprint) = run
        .dedup_fingerprint
        .as_deref()
        .filter(|_| db.is_postgres())
    else {
        return Ok(());
    };
    let h =
        blake3::hash(format!("vectorstep dedup {}\0{fingerprint}", run.pipeline_name).as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    let key = i64::from_le_bytes(b);
    db.exec("SELECT pg_advisory_xact_lock(?1)", &[&key])?;
    Ok(())
}

/// A running run of the same pipeline and dedup fingerprint always suppresses a new
/// running one (the partial unique index would refuse it anyway).
fn running_duplicate(db: &impl Db, run: &RunRecord) -> Result<Option<Outcome>, DbError> {
    let (true, Some(fingerprint)) = (run.status == RunStatus::Running, &run.dedup_fingerprint)
    else {
        return Ok(None);
    };
    let existing: Option<String> = db.first(
        TABLE,
        "SELECT id FROM pipeline_runs WHERE pipeline_name = ?1 \
         AND dedup_fingerprint = ?2 AND status = 'running' LIMIT 1",
        &[&run.pipeline_name, &fingerprint],
        |c| c.get("id"),
    )?;
    Ok(existing.map(|existing_run_id| Outcome::DuplicateRunning { existing_run_id }))
}

fn insert_row(db: &impl Db, run: &RunRecord) -> Result<Outcome, DbError> {
    db.exec(
        INSERT,
        &[
            &run.id,
            &run.pipeline_name,
            &run.status.as_str(),
            &run.source,
            &run.team,
            &run.stage,
            &run.triggered_at,
            &run.completed_at,
            &run.resumed_at,
            &run.resume_count,
            &run.config_fingerprint,
            &run.parent_run_id,
            &run.parent_step_path,
            &run.dedup_fingerprint,
            &run.context_json,
            &run.payload_json,
            &run.tokens_used,
            &run.cost_usd,
            &run.terminal_step,
            &run.reason,
            &run.final_output_json,
            &run.replay_of,
        ],
    )?;
    Ok(Outcome::RunInserted)
}

/// Only a running run can finish, so a late finisher (say, a step completing after the
/// run was cancelled) cannot overwrite the terminal status that was recorded first.
pub(super) fn finish(
    db: &impl Db,
    run_id: &str,
    status: RunStatus,
    completed_at: i64,
    terminal_step: Option<&str>,
    reason: Option<&str>,
    final_output_json: Option<&str>,
) -> Result<Outcome, DbError> {
    let changed = db.exec(
        "UPDATE pipeline_runs SET status = ?2, completed_at = ?3, terminal_step = ?4, \
             reason = ?5, final_output_json = ?6 WHERE id = ?1 AND status = 'running'",
        &[
            &run_id,
            &status.as_str(),
            &completed_at,
            &terminal_step,
            &reason,
            &final_output_json,
        ],
    )?;
    Ok(if changed == 0 {
        Outcome::NotRunning
    } else {
        Outcome::Done
    })
}

pub(super) fn set_usage(
    db: &impl Db,
    run_id: &str,
    tokens_used: u64,
    cost_usd: f64,
) -> Result<Outcome, DbError> {
    db.exec(
        "UPDATE pipeline_runs SET tokens_used = ?2, cost_usd = ?3 WHERE id = ?1",
        &[&run_id, &tokens_used, &cost_usd],
    )?;
    Ok(Outcome::Done)
}

/// `resumed_at` keeps the first resume (SPEC 6.5); the count grows on every resume.
pub(super) fn mark_resumed(
    db: &impl Db,
    run_id: &str,
    at: i64,
    counted: bool,
) -> Result<Outcome, DbError> {
    // A constant in the text, not a parameter: one statement per value, and no
    // integer width for PostgreSQL to infer.
    let add = if counted { 1 } else { 0 };
    db.exec(
        &format!(
            "UPDATE pipeline_runs SET resumed_at = COALESCE(resumed_at, ?2), \
             resume_count = resume_count + {add} WHERE id = ?1"
        ),
        &[&run_id, &at],
    )?;
    Ok(Outcome::Done)
}

/// Sets or clears the owning process of a run (see `Write::SetRunOwner`).
pub(super) fn set_owner(
    db: &impl Db,
    run_id: &str,
    owner: Option<&str>,
) -> Result<Outcome, DbError> {
    db.exec(
        "UPDATE pipeline_runs SET owner = ?2 WHERE id = ?1",
        &[&run_id, &owner],
    )?;
    Ok(Outcome::Done)
}

/// The run a new one with this pipeline and fingerprint would be folded into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateOf {
    pub run_id: String,
    pub status: RunStatus,
    /// True when it is `running` (always suppresses), false when it is a run
    /// triggered inside the dedup window.
    pub running: bool,
}

impl Store {
    /// The same test as an insert with dedup (`Write::InsertRunDedup`), read-only:
    /// a `running` run of `pipeline` with `fingerprint`, else, with a window, the
    /// newest run triggered since `window_start`. Two lookups on
    /// `ix_pipeline_runs_dedup`, whatever the number of runs; used when the
    /// concurrency cap refuses new runs, so a 429 costs no more than an insert.
    pub fn find_duplicate(
        &self,
        pipeline: &str,
        fingerprint: &str,
        window_start: Option<i64>,
    ) -> Result<Option<DuplicateOf>, Error> {
        self.read(|conn| {
            let running: Option<String> = conn.first(
                TABLE,
                "SELECT id FROM pipeline_runs WHERE pipeline_name = ?1 \
                 AND dedup_fingerprint = ?2 AND status = 'running' LIMIT 1",
                &[&pipeline, &fingerprint],
                |c| c.get("id"),
            )?;
            if let Some(run_id) = running {
                return Ok(Some(DuplicateOf {
                    run_id,
                    status: RunStatus::Running,
                    running: true,
                }));
            }
            let Some(window_start) = window_start else {
                return Ok(None);
            };
            Ok(conn.first(
                TABLE,
                "SELECT id, status FROM pipeline_runs WHERE pipeline_name = ?1 \
                 AND dedup_fingerprint = ?2 AND triggered_at >= ?3 \
                 ORDER BY triggered_at DESC LIMIT 1",
                &[&pipeline, &fingerprint, &window_start],
                |c| {
                    Ok(DuplicateOf {
                        run_id: c.get("id")?,
                        status: c.word("status")?,
                        running: false,
                    })
                },
            )?)
        })
    }

    /// `(run id, owner)` of every running run owned by a `vectorstep run` process,
    /// oldest first.
    pub fn owned_running_runs(&self) -> Result<Vec<(String, String)>, Error> {
        self.read(|conn| {
            query_all(
                conn,
                TABLE,
                "SELECT id, owner FROM pipeline_runs WHERE owner IS NOT NULL \
                 AND status = 'running' ORDER BY triggered_at, id",
                &[],
                |c| Ok((c.get("id")?, c.get("owner")?)),
            )
        })
    }

    /// Every running run with its owning `vectorstep run` process (`None`: `serve`
    /// owns it), oldest first. One read, so a run and its owner are seen together.
    pub fn running_runs_with_owners(&self) -> Result<Vec<(RunRecord, Option<String>)>, Error> {
        self.read(|conn| {
            let sql = format!(
                "SELECT {COLUMNS}, owner FROM pipeline_runs WHERE status = 'running' \
                 ORDER BY triggered_at, id"
            );
            query_all(conn, TABLE, &sql, &[], |c| {
                Ok((RunRecord::decode(c)?, c.get("owner")?))
            })
        })
    }

    /// The process owning a run, if a `vectorstep run` process does.
    pub fn run_owner(&self, run_id: &str) -> Result<Option<String>, Error> {
        self.read(|conn| {
            query_opt(
                conn,
                TABLE,
                "SELECT owner FROM pipeline_runs WHERE id = ?1",
                &[&run_id],
                |c| c.get("owner"),
            )
        })
        .map(Option::flatten)
    }

    pub fn run(&self, id: &str) -> Result<Option<RunRecord>, Error> {
        self.read(|conn| by_id(conn, id))
    }

    /// Newest first (`triggered_at` descending, then `id` so pages are stable).
    pub fn runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>, Error> {
        // Only the conditions in use are put in the SQL so the planner can pick the
        // status or pipeline index; the few possible texts are cached as statements.
        // Placeholders are numbered in the order they are bound: PostgreSQL refuses
        // a statement with a parameter it never uses.
        let mut conditions = Vec::new();
        let mut args: Vec<&dyn Bind> = Vec::new();
        if let Some(status) = &filter.status {
            args.push(status);
            conditions.push(format!("status = ?{}", args.len()));
        }
        if let Some(pipeline) = &filter.pipeline {
            args.push(pipeline);
            conditions.push(format!("pipeline_name = ?{}", args.len()));
        }
        let where_clause = if conditions.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conditions.join(" AND "))
        };
        // No limit is the largest one: both backends take it (SQLite's -1 and
        // PostgreSQL's ALL are each the other's syntax error).
        let limit = if filter.limit == 0 {
            i64::MAX
        } else {
            i64::from(filter.limit)
        };
        args.push(&limit);
        args.push(&filter.offset);
        let sql = format!(
            "SELECT {COLUMNS} FROM pipeline_runs {where_clause} \
             ORDER BY triggered_at DESC, id LIMIT ?{} OFFSET ?{}",
            args.len() - 1,
            args.len()
        );
        self.read(|conn| query_all(conn, TABLE, &sql, &args, RunRecord::decode))
    }

    /// Oldest first, the order in which the startup sweep should resume them.
    pub fn runs_with_status(&self, status: RunStatus) -> Result<Vec<RunRecord>, Error> {
        self.read(|conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM pipeline_runs WHERE status = ?1 ORDER BY triggered_at, id"
            );
            query_all(conn, TABLE, &sql, &[&status.as_str()], RunRecord::decode)
        })
    }

    /// The run started by the given step of a parent run, if any. When a step was
    /// retried and started several children, the newest one is returned.
    pub fn child_run(
        &self,
        parent_run_id: &str,
        parent_step_path: &str,
    ) -> Result<Option<RunRecord>, Error> {
        self.read(|conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM pipeline_runs WHERE parent_run_id = ?1 \
                 AND parent_step_path = ?2 ORDER BY triggered_at DESC, id DESC LIMIT 1"
            );
            query_opt(
                conn,
                TABLE,
                &sql,
                &[&parent_run_id, &parent_step_path],
                RunRecord::decode,
            )
        })
    }

    pub fn count_runs_with_status(&self, status: RunStatus) -> Result<u64, Error> {
        self.read(|conn| {
            let count: Option<u64> = query_opt(
                conn,
                TABLE,
                "SELECT COUNT(*) AS n FROM pipeline_runs WHERE status = ?1",
                &[&status.as_str()],
                |c| c.get("n"),
            )?;
            Ok(count.unwrap_or(0))
        })
    }
}

pub(super) fn prune(db: &impl Db, cutoff: i64) -> Result<Outcome, DbError> {
    let old = "SELECT id FROM pipeline_runs WHERE status != 'running' AND completed_at IS NOT NULL AND completed_at < ?1";
    let owned = [
        "pipeline_steps",
        "run_events",
        "pending_approvals",
        "notifications",
    ];
    for table in owned.into_iter().chain(super::journal::TABLES) {
        db.exec(
            &format!("DELETE FROM {table} WHERE run_id IN ({old})"),
            &[&cutoff],
        )?;
    }
    let runs = db.exec("DELETE FROM pipeline_runs WHERE status != 'running' AND completed_at IS NOT NULL AND completed_at < ?1", &[&cutoff])?;
    Ok(Outcome::Pruned { runs: runs as u64 })
}

/// The run `id`, on either backend.
pub(super) fn by_id(db: &impl Db, id: &str) -> Result<Option<RunRecord>, Error> {
    let sql = format!("SELECT {COLUMNS} FROM pipeline_runs WHERE id = ?1");
    query_opt(db, TABLE, &sql, &[&id], RunRecord::decode)
}
