//! `pending_approvals`: human approval requests, their deadline and their decision.

use super::connection::{query_all, query_opt, Cols};
use super::error::DbError;
use super::sql::Db;
use super::{Error, Outcome, Store};
use crate::domain::{ApprovalStatus, RunId, UnixMillis};

/// A row of `pending_approvals`. `status` is one of `pending`, `approved`, `rejected`,
/// `timeout`, `closed`; `delivery_json` records where the request was delivered (for
/// example the chat message to edit once it is decided).
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRecord {
    pub token: String,
    pub run_id: RunId,
    pub step_path: String,
    pub pipeline_name: String,
    pub message: String,
    pub team: Option<String>,
    pub stage: String,
    pub channel: Option<String>,
    pub created_at: UnixMillis,
    pub deadline_at: UnixMillis,
    pub status: ApprovalStatus,
    pub decided_by: Option<String>,
    pub decided_at: Option<UnixMillis>,
    pub delivery_json: Option<String>,
}

const TABLE: &str = "pending_approvals";

const COLUMNS: &str = "token, run_id, step_path, pipeline_name, message, team, stage, \
    channel, created_at, deadline_at, status, decided_by, decided_at, delivery_json";

impl ApprovalRecord {
    fn decode(c: &Cols) -> Result<Self, Error> {
        Ok(ApprovalRecord {
            token: c.get("token")?,
            run_id: c.get("run_id")?,
            step_path: c.get("step_path")?,
            pipeline_name: c.get("pipeline_name")?,
            message: c.get("message")?,
            team: c.get("team")?,
            stage: c.get("stage")?,
            channel: c.get("channel")?,
            created_at: c.get("created_at")?,
            deadline_at: c.get("deadline_at")?,
            status: c.word("status")?,
            decided_by: c.get("decided_by")?,
            decided_at: c.get("decided_at")?,
            delivery_json: c.get("delivery_json")?,
        })
    }
}

pub(super) fn insert(db: &impl Db, a: &ApprovalRecord) -> Result<Outcome, DbError> {
    db.exec(
        &format!(
            "INSERT INTO pending_approvals ({COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
        ),
        &[
            &a.token,
            &a.run_id,
            &a.step_path,
            &a.pipeline_name,
            &a.message,
            &a.team,
            &a.stage,
            &a.channel,
            &a.created_at,
            &a.deadline_at,
            &a.status.as_str(),
            &a.decided_by,
            &a.decided_at,
            &a.delivery_json,
        ],
    )?;
    Ok(Outcome::Done)
}

pub(super) fn set_delivery(
    db: &impl Db,
    token: &str,
    delivery_json: &str,
) -> Result<Outcome, DbError> {
    db.exec(
        "UPDATE pending_approvals SET delivery_json = ?2 WHERE token = ?1",
        &[&token, &delivery_json],
    )?;
    Ok(Outcome::Done)
}

/// A button press, an HTTP decision and the deadline can race; the single conditional
/// UPDATE makes the first one recorded win and tells the others what happened.
pub(super) fn decide(
    db: &impl Db,
    token: &str,
    status: ApprovalStatus,
    by: Option<&str>,
    at: i64,
) -> Result<Outcome, DbError> {
    let changed = db.exec(
        "UPDATE pending_approvals SET status = ?2, decided_by = ?3, decided_at = ?4 \
             WHERE token = ?1 AND status = 'pending'",
        &[&token, &status.as_str(), &by, &at],
    )?;
    if changed > 0 {
        return Ok(Outcome::ApprovalDecided);
    }
    let current: Option<ApprovalStatus> = db.first(
        TABLE,
        "SELECT status FROM pending_approvals WHERE token = ?1",
        &[&token],
        |c| c.word("status"),
    )?;
    Ok(match current {
        Some(status) => Outcome::ApprovalAlreadyDecided { status },
        None => Outcome::ApprovalUnknown,
    })
}

/// When a run ends while approvals are still open, they can no longer affect it.
pub(super) fn close_of_run(db: &impl Db, run_id: &str, at: i64) -> Result<Outcome, DbError> {
    db.exec(
        "UPDATE pending_approvals SET status = 'closed', decided_at = ?2 \
         WHERE run_id = ?1 AND status = 'pending'",
        &[&run_id, &at],
    )?;
    Ok(Outcome::Done)
}

impl Store {
    pub fn approval(&self, token: &str) -> Result<Option<ApprovalRecord>, Error> {
        self.read(|conn| {
            let sql = format!("SELECT {COLUMNS} FROM pending_approvals WHERE token = ?1");
            query_opt(conn, TABLE, &sql, &[&token], ApprovalRecord::decode)
        })
    }

    /// Oldest first.
    pub fn approvals_with_status(
        &self,
        status: ApprovalStatus,
    ) -> Result<Vec<ApprovalRecord>, Error> {
        self.read(|conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM pending_approvals WHERE status = ?1 \
                 ORDER BY created_at, token"
            );
            query_all(
                conn,
                TABLE,
                &sql,
                &[&status.as_str()],
                ApprovalRecord::decode,
            )
        })
    }

    /// Pending approvals of production runs (what `human_approvals_pending` shows).
    /// A count, because the gauge is refreshed on every request and decision.
    pub fn count_pending_production_approvals(&self) -> Result<u64, Error> {
        self.read(|conn| {
            let count: Option<u64> = query_opt(
                conn,
                TABLE,
                "SELECT COUNT(*) AS n FROM pending_approvals \
                 WHERE status = 'pending' AND stage != 'testing'",
                &[],
                |c| c.get("n"),
            )?;
            Ok(count.unwrap_or(0))
        })
    }

    /// Tokens of every approval still pending: only the tokens, so the check for
    /// decisions made by another process stays cheap with thousands waiting.
    pub fn pending_approval_tokens(&self) -> Result<Vec<String>, Error> {
        self.read(|conn| {
            query_all(
                conn,
                TABLE,
                "SELECT token FROM pending_approvals WHERE status = 'pending'",
                &[],
                |c| c.get("token"),
            )
        })
    }

    /// Oldest first.
    pub fn approvals_of_run(&self, run_id: &str) -> Result<Vec<ApprovalRecord>, Error> {
        self.read(|conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM pending_approvals WHERE run_id = ?1 \
                 ORDER BY created_at, token"
            );
            query_all(conn, TABLE, &sql, &[&run_id], ApprovalRecord::decode)
        })
    }
}
