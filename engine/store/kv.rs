//! `kv`: small pieces of service state that must survive restarts, such as the
//! Telegram update offset and the last fire time of each schedule.

use super::connection::query_opt;
use super::error::DbError;
use super::sql::Db;
use super::{Error, Outcome, Store};

pub(super) fn set(db: &impl Db, key: &str, value: &str) -> Result<Outcome, DbError> {
    db.exec(
        "INSERT INTO kv (key, value) VALUES (?1, ?2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&key, &value],
    )?;
    Ok(Outcome::Done)
}

impl Store {
    pub fn kv(&self, key: &str) -> Result<Option<String>, Error> {
        self.read(|conn| {
            query_opt(
                conn,
                "kv",
                "SELECT value FROM kv WHERE key = ?1",
                &[&key],
                |c| c.get("value"),
            )
        })
    }
}
