//! `run_events`: the run log, append-only, read back in the order it was written.

use super::connection::{query_all, Cols};
use super::error::DbError;
use super::sql::Db;
use super::{Error, Outcome, Store};
use crate::domain::{RunId, UnixMillis};

/// A row of `run_events`. `id` is assigned by the database; whatever value is passed
/// in on insert is ignored.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    pub id: i64,
    pub run_id: RunId,
    pub ts: UnixMillis,
    pub level: String,
    pub event: String,
    pub msg: String,
    pub fields_json: String,
}

const TABLE: &str = "run_events";

impl EventRecord {
    pub(super) fn decode(c: &Cols) -> Result<Self, Error> {
        Ok(EventRecord {
            id: c.get("id")?,
            run_id: c.get("run_id")?,
            ts: c.get("ts")?,
            level: c.get("level")?,
            event: c.get("event")?,
            msg: c.get("msg")?,
            fields_json: c.get("fields_json")?,
        })
    }
}

pub(super) fn append(db: &impl Db, event: &EventRecord) -> Result<Outcome, DbError> {
    db.exec(
        "INSERT INTO run_events (run_id, ts, level, event, msg, fields_json) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        &[
            &event.run_id,
            &event.ts,
            &event.level,
            &event.event,
            &event.msg,
            &event.fields_json,
        ],
    )?;
    Ok(Outcome::Done)
}

impl Store {
    /// In write order. AUTOINCREMENT ids never go backwards, so ordering by id is the
    /// order in which events were committed even when timestamps tie.
    pub fn events(&self, run_id: &str) -> Result<Vec<EventRecord>, Error> {
        self.read(|conn| {
            query_all(
                conn,
                TABLE,
                "SELECT id, run_id, ts, level, event, msg, fields_json FROM run_events \
                 WHERE run_id = ?1 ORDER BY id",
                &[&run_id],
                EventRecord::decode,
            )
        })
    }
}
