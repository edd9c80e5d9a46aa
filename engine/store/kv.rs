//! `kv`: small pieces of service state that must survive restarts, such as the
//! Telegram update offset and the last fire time of each schedule.

use rusqlite::Connection;

use super::connection::query_opt;
use super::sql::lite;
use super::{Error, Outcome, Store};

pub(super) fn set(conn: &Connection, key: &str, value: &str) -> rusqlite::Result<Outcome> {
    conn.prepare_cached(
        "INSERT INTO kv (key, value) VALUES (?1, ?2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )?
    .execute(lite(&[&key, &value]))?;
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
