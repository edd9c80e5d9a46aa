//! `notifications`: the outbox that makes each notification a run owes happen once.
//!
//! The caller records a notification (status `pending`) in the same batch as the state
//! change that causes it, sends it, then marks it `sent` or `failed`. After a crash the
//! `pending` rows are exactly the notifications still owed.

use super::connection::{query_all, Cols};
use super::error::DbError;
use super::sql::Db;
use super::{Error, Outcome, Store};
use crate::domain::{NotificationStatus, RunId, UnixMillis};

/// A row of `notifications`. `id` is chosen by the caller deterministically (for
/// example `<run_id>:<action>:<n>`) so that recording it again after a resume is a
/// no-op; `status` is one of `pending`, `sent`, `failed`.
#[derive(Debug, Clone, PartialEq)]
pub struct NotificationRecord {
    pub id: String,
    pub run_id: RunId,
    pub action: String,
    pub channel: String,
    pub message: String,
    pub status: NotificationStatus,
    pub created_at: UnixMillis,
    pub sent_at: Option<UnixMillis>,
    pub error: Option<String>,
}

const TABLE: &str = "notifications";

const COLUMNS: &str = "id, run_id, action, channel, message, status, created_at, sent_at, error";

impl NotificationRecord {
    fn decode(c: &Cols) -> Result<Self, Error> {
        Ok(NotificationRecord {
            id: c.get("id")?,
            run_id: c.get("run_id")?,
            action: c.get("action")?,
            channel: c.get("channel")?,
            message: c.get("message")?,
            status: c.word("status")?,
            created_at: c.get("created_at")?,
            sent_at: c.get("sent_at")?,
            error: c.get("error")?,
        })
    }
}

/// `ON CONFLICT (id) DO NOTHING` swallows only the primary-key conflict that signals
/// "already recorded"; the row that is kept is the first one, including its status.
pub(super) fn insert(db: &impl Db, n: &NotificationRecord) -> Result<Outcome, DbError> {
    db.exec(
        &format!(
            "INSERT INTO notifications ({COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (id) DO NOTHING"
        ),
        &[
            &n.id,
            &n.run_id,
            &n.action,
            &n.channel,
            &n.message,
            &n.status.as_str(),
            &n.created_at,
            &n.sent_at,
            &n.error,
        ],
    )?;
    Ok(Outcome::Done)
}

/// `at` becomes `sent_at`: the time of the last delivery attempt, successful or
/// not. The attempt is over, so its claim goes too.
pub(super) fn mark(
    db: &impl Db,
    id: &str,
    status: NotificationStatus,
    at: i64,
    error: Option<&str>,
) -> Result<Outcome, DbError> {
    db.exec(
        "UPDATE notifications SET status = ?2, sent_at = ?3, error = ?4, \
         claimed_by = NULL, claimed_until = NULL WHERE id = ?1",
        &[&id, &status.as_str(), &at, &error],
    )?;
    Ok(Outcome::Done)
}

/// `Write::ClaimNotification`: takes a pending row for one delivery attempt
/// until now + `claim_ms` (database clock) if nobody else's claim is running;
/// `NotificationClaimed`, else `NotificationBusy` (claimed elsewhere, or no
/// longer pending).
pub(super) fn claim(
    db: &impl Db,
    id: &str,
    claimer: &str,
    claim_ms: u64,
    take_from: Option<&str>,
) -> Result<Outcome, DbError> {
    let now = db.now_ms_sql();
    // A sender seen gone: its claim is taken whatever its expiry.
    let gone = take_from.unwrap_or(claimer);
    let changed = db.exec(
        &format!(
            "UPDATE notifications SET claimed_by = ?2, claimed_until = {now} + ?3 \
             WHERE id = ?1 AND status = 'pending' AND (claimed_until IS NULL \
             OR claimed_until <= {now} OR claimed_by = ?2 OR claimed_by = ?4)"
        ),
        &[&id, &claimer, &claim_ms, &gone],
    )?;
    Ok(if changed > 0 {
        Outcome::NotificationClaimed
    } else {
        Outcome::NotificationBusy
    })
}

impl Store {
    /// In the order they were created.
    pub fn notifications_of_run(&self, run_id: &str) -> Result<Vec<NotificationRecord>, Error> {
        self.read(|conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM notifications WHERE run_id = ?1 ORDER BY created_at, id"
            );
            query_all(conn, TABLE, &sql, &[&run_id], NotificationRecord::decode)
        })
    }

    /// Who holds a delivery claim on notification `id` now (database clock), if
    /// anyone.
    pub fn notification_claimant(&self, id: &str) -> Result<Option<String>, Error> {
        self.read(|conn| {
            let now = conn.now_ms_sql();
            let holder: Option<Option<String>> = super::connection::query_opt(
                conn,
                TABLE,
                &format!(
                    "SELECT claimed_by FROM notifications WHERE id = ?1 AND claimed_until > {now}"
                ),
                &[&id],
                |c| c.get("claimed_by"),
            )?;
            Ok(holder.flatten())
        })
    }

    /// Every notification recorded but not yet sent or given up on, oldest first.
    pub fn pending_notifications(&self) -> Result<Vec<NotificationRecord>, Error> {
        self.read(|conn| {
            let sql = format!(
                "SELECT {COLUMNS} FROM notifications WHERE status = 'pending' \
                 ORDER BY created_at, id"
            );
            query_all(conn, TABLE, &sql, &[], NotificationRecord::decode)
        })
    }
}
