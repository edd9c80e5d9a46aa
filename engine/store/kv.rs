//! `kv`: small pieces of service state that must survive restarts, such as the
//! Telegram update offset and the last fire time of each schedule.

use super::connection::{query_all, query_opt};
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
    /// Every `(key, value)` whose key starts with `prefix`, by key.
    pub fn kv_prefixed(&self, prefix: &str) -> Result<Vec<(String, String)>, Error> {
        // A range rather than LIKE, whose `_` would match any character.
        let end = format!("{prefix}\u{10FFFF}");
        self.read(|conn| {
            query_all(
                conn,
                "kv",
                "SELECT key, value FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key",
                &[&prefix, &end.as_str()],
                |c| Ok((c.get("key")?, c.get("value")?)),
            )
        })
    }

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
