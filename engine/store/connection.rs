//! Opening connections with the store's pragmas, the read pool, and row decoding.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags};

use super::sql::{Args, Db};

use super::Error;

/// Long enough to ride out a checkpoint or another process's commit, short enough that
/// a wedged peer surfaces as an error instead of a hang.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Idle read connections kept around; more may be open while many reads run at once.
const MAX_IDLE_READERS: usize = 8;

/// Opens the read-write connection. WAL lets readers (including other processes such
/// as the CLI) proceed while the server writes; `synchronous=FULL` makes every COMMIT
/// survive power loss, not just a process kill, which is the durability contract.
pub(super) fn open_writer(path: &Path) -> Result<Connection, Error> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        // For example an in-memory or read-only location: refuse rather than silently
        // lose the concurrency and durability properties the service relies on.
        return Err(Error::NotWal {
            path: path.to_path_buf(),
            mode,
        });
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Every batch runs inside its own SAVEPOINT, so SQLite keeps a statement journal
    // of the pages a batch touches; in memory that costs a copy, not a temp file.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // Checkpoint every 16 MB of WAL instead of 4 MB: rows written and rewritten in
    // quick succession (a run's insert, then its finish) are copied back once.
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
    // Without a limit the WAL file keeps the size of its largest burst forever; with
    // it, the file is cut back to this size each time the WAL starts over.
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT_BYTES)?;
    Ok(conn)
}

/// Pages of WAL after which a commit runs a passive checkpoint (about 16 MB at the
/// default 4 KB page size).
pub(super) const WAL_AUTOCHECKPOINT_PAGES: i64 = 4000;

/// What the WAL file is cut back to when it starts over (`journal_size_limit`).
pub(super) const WAL_SIZE_LIMIT_BYTES: i64 = 16 * 1024 * 1024;

/// A WAL larger than this means passive checkpoints could not finish (readers kept
/// old snapshots); the writer then forces a truncating one. Together these keep the
/// WAL under [`WAL_BOUND_BYTES`] in steady traffic.
pub(super) const WAL_FORCE_CHECKPOINT_BYTES: u64 = 20 * 1024 * 1024;

/// The documented bound on the WAL file under steady traffic (docs/operations.md):
/// the forced-checkpoint threshold plus one group commit's pages.
pub const WAL_BOUND_BYTES: u64 = 32 * 1024 * 1024;

/// Free space the store wants at start-up: room for a full WAL and its checkpoint
/// into the main file, with some margin (docs/operations.md).
pub const MIN_FREE_BYTES: u64 = 64 * 1024 * 1024;

/// Opens a read-only connection; the journal mode is a property of the file, so WAL
/// set by the writer applies here too.
fn open_reader(path: &Path) -> Result<Connection, Error> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

/// Read-only connections opened on demand and reused. A connection is taken out of the
/// pool for the duration of one read so reads never share a connection.
pub(super) struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl ReadPool {
    pub(super) fn new(path: PathBuf) -> Self {
        ReadPool {
            path,
            idle: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, Error>,
    ) -> Result<T, Error> {
        // A poisoned lock only means another reader panicked while holding it; the
        // vector of idle connections is still valid.
        let taken = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match taken {
            Some(conn) => conn,
            None => open_reader(&self.path)?,
        };
        let result = f(&conn);
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
        result
    }
}

pub(super) use super::sql::Cols;

/// Runs a query and decodes every row (either backend).
pub(super) fn query_all<T>(
    db: &impl Db,
    table: &'static str,
    sql: &str,
    args: Args<'_>,
    decode: impl Fn(&Cols) -> Result<T, Error>,
) -> Result<Vec<T>, Error> {
    Ok(db.all(table, sql, args, decode)?)
}

/// Runs a query expected to match at most one row (a primary-key lookup).
pub(super) fn query_opt<T>(
    db: &impl Db,
    table: &'static str,
    sql: &str,
    args: Args<'_>,
    decode: impl Fn(&Cols) -> Result<T, Error>,
) -> Result<Option<T>, Error> {
    Ok(db.first(table, sql, args, decode)?)
}

/// Wall-clock unix milliseconds, used only for bookkeeping the store does on its own
/// (migration timestamps); everything else gets its time from the caller's clock.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Measures `n` single-row commits, one transaction each, on a scratch database in
/// `dir` opened with the store's pragmas. Benchmarks use it as the cost of a raw
/// fsync'd commit, to compare against what group commit achieves.
pub fn raw_commit_probe(dir: &Path, n: u32) -> Result<Duration, Error> {
    std::fs::create_dir_all(dir).map_err(|source| Error::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let path = dir.join(format!(
        "vectorstep-commit-probe-{}-{nanos}.sqlite",
        std::process::id()
    ));
    let result = run_probe(&path, n);
    // Leave nothing behind in the caller's directory, whatever happened.
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    result
}

fn run_probe(path: &Path, n: u32) -> Result<Duration, Error> {
    let conn = open_writer(path)?;
    conn.execute_batch("CREATE TABLE probe (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")?;
    let mut stmt = conn.prepare("INSERT INTO probe (value) VALUES (?1)")?;
    let started = Instant::now();
    for i in 0..n {
        // Autocommit mode: each execute is its own transaction and its own fsync.
        stmt.execute([format!("row {i}")])?;
    }
    Ok(started.elapsed())
}
