//! The PostgreSQL side of the store, for several replicas sharing one database
//! (`database.url`): the same contract as the SQLite store (see `store`), the same
//! statements and the same schema.
//! - `schema`: the SQLite migrations translated, version for version, so both
//!   backends always hold the same tables, columns and rules; applied under an
//!   advisory lock.
//! - `conn`: one connection, usable from any thread (its I/O runs on the store's
//!   own runtime thread); it implements the `Db` trait every table file's
//!   statements run through, so every `Write` runs the very statements it runs on
//!   SQLite, with the same outcomes.
//! - `writer`: the writer thread's group commit over one connection, made again
//!   after the server or the network dropped it.
//! - `pool`: connections for reads.
//! - `conn::listen`: one more connection that `LISTEN`s for `WORK_CHANNEL`, so a
//!   replica hears at once that runs were let go (a handoff) instead of at its
//!   next sweep.
//!
//! The engine never holds a connection across an await, and never holds a
//! transaction across a step: a transaction lives inside one group commit.

mod conn;

pub(crate) mod pool;
pub(crate) mod schema;
pub(crate) mod writer;

pub(crate) use conn::{listen, PgConn};

/// The channel every replica listens on and a write that frees runs for others
/// (`ReleaseLease`, `StopReplica`) notifies in its transaction: delivered when it
/// commits, to wake the other replicas' orphan sweeps.
pub(crate) const WORK_CHANNEL: &str = "vectorstep_work";

pub use super::error::{detail, PgError};

/// `url` with any password replaced by `***`, fit for logs and errors.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// A session-level advisory lock, held while this value lives (its connection
/// stays open for that long; the server releases the lock when the connection
/// ends, a crash included).
pub struct SessionLock {
    conn: PgConn,
}

impl SessionLock {
    /// Whether the lock is still held: its connection has not ended (a database
    /// restart or a network failure ends it, and the server drops the lock then).
    pub fn is_held(&self) -> bool {
        !self.conn.is_closed()
    }
}

/// The advisory lock key a replica holds for its lifetime, so the others can tell
/// at once that its session ended (a kill, a lost host): a hash of its id.
pub fn replica_lock_key(replica: &str) -> i64 {
    let h = blake3::hash(format!("vectorstep replica {replica}").as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    i64::from_le_bytes(b)
}

/// The advisory lock key ("serve" in ASCII) every replica holds shared for its
/// lifetime, and `vectorstep store copy` exclusively for the copy's.
pub const SERVE_LOCK: i64 = 0x0073_6572_7665;

/// Takes the session advisory lock `key` on a connection of its own, or `None`
/// when another session holds it.
pub fn try_session_lock(url: &str, key: i64) -> Result<Option<SessionLock>, PgError> {
    let conn = PgConn::connect(url)?;
    let rows = conn.query_raw("SELECT pg_try_advisory_lock($1)", &[&key])?;
    let got: bool = rows.first().map(|r| r.get(0)).unwrap_or(false);
    Ok(got.then_some(SessionLock { conn }))
}

/// A replica's liveness lock `key` together with a shared hold of
/// [`SERVE_LOCK`], on a connection of its own: `vectorstep store copy` takes
/// `SERVE_LOCK` exclusively, so it refuses while any replica lives (and a replica
/// started during a copy gets no liveness lock). `None` if either is taken.
pub fn try_replica_lock(url: &str, key: i64) -> Result<Option<SessionLock>, PgError> {
    let conn = PgConn::connect(url)?;
    let rows = conn.query_raw(
        "SELECT pg_try_advisory_lock_shared($1) AND pg_try_advisory_lock($2)",
        &[&SERVE_LOCK, &key],
    )?;
    let got: bool = rows.first().map(|r| r.get(0)).unwrap_or(false);
    Ok(got.then_some(SessionLock { conn }))
}

/// Connects to `url` and brings its schema up to date (what `Store::open_postgres`
/// does first); the versions it applied. For tools and tests that migrate a
/// database without opening a store.
pub fn migrate(url: &str) -> Result<Vec<i64>, PgError> {
    schema::apply(&PgConn::connect(url)?)
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_password_never_reaches_a_log() {
        let check = |url: &str, want: &str| assert_eq!(redact(url), want, "{url}");
        check(
            "postgres://vs:s3cret@db:5432/vs",
            "postgres://vs:***@db:5432/vs",
        );
        check("postgres://vs:p@ss@db/vs", "postgres://vs:***@db/vs");
        check("postgres://vs@db/vs", "postgres://vs@db/vs");
        check("postgres://db/vs", "postgres://db/vs");
        check("not a url", "not a url");
    }
}
