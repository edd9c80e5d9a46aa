//! Durable state: runs, steps, the run log, approvals, the notification outbox, the
//! agent step journal and a small key-value table, in one SQLite file.
//!
//! This is the only module that imports rusqlite or tokio-postgres. [`Store`] is
//! either backend: [`Store::open`] a SQLite file (one `serve`), or
//! [`Store::open_postgres`] a PostgreSQL database several replicas share (see
//! `postgres`). What follows is the contract its callers rely on; both keep it.
//!
//! # Writes: batches of [`Write`], one [`Outcome`] each
//!
//! Every change is a [`Write`] value (insert a run, upsert a step record, append a
//! log event, decide an approval, ...), and [`Store::commit`] applies a batch of
//! them:
//! - **Atomic.** The batch commits as one transaction: all of it or none of it. If
//!   one write fails, the error names it and nothing of the batch is applied; other
//!   callers' batches are unaffected. The engine relies on this to commit a unit's
//!   result together with what follows from it (the run's terminal status, its log
//!   line, the notifications it owes).
//! - **Durable on return.** `commit` returns only once the batch is on disk; a
//!   process killed right after can rely on it, one killed before cannot have
//!   applied part of it. Dropping the future does not cancel a submitted batch.
//! - **One answer per write.** Conditional writes say what happened in their
//!   [`Outcome`] rather than failing: `DuplicateRunning`/`DuplicateRecent` for a
//!   deduplicated run, `ApprovalDecided`/`ApprovalAlreadyDecided`/`ApprovalUnknown`
//!   for a decision (the first decision wins), `NotRunning` for a `FinishRun` of a
//!   run already finished, and the `...IfInserted` writes apply
//!   only when the batch's run insert won. The batch is still committed.
//! - **Ordered.** One writer thread owns the only write connection and applies
//!   batches in the order they were submitted, group-committing concurrent ones.
//!
//! A failed commit is an [`Error`]; [`Error::is_retriable`] says whether the same
//! batch may succeed later (busy, full disk, I/O, the file replaced under the
//! process) or never will (a constraint, a corrupt row, a closed store). A caller
//! that waits out a retriable failure uses [`Store::commit_or_return`], which hands
//! the uncommitted writes back in a [`Rejected`] so the very same batch can be
//! submitted again without keeping a copy. Meanwhile [`Store::unwritable`] says why
//! writes fail (see `health`: the writer probes the file every second and clears
//! the mark on the first commit that succeeds), so intake can answer 503 and runs
//! can wait instead of failing. Synchronous code (the CLI, tests) uses
//! [`Store::commit_blocking`].
//!
//! # Reads
//!
//! Reads are plain synchronous methods returning records (`run`, `steps`, `events`,
//! `approval`, `approvals_of_run`, `runs`, `pending_notifications`, `kv`, ...). They
//! use a pool of read-only connections, never wait for the writer, and also work
//! while another process (the running server) writes. A read sees every batch
//! whose `commit` has returned.
//!
//! The rule for reads from async code: **call a read directly only when its cost is
//! bounded by one run or by the pending rows** (a row by its key, the rows of one
//! run, one agent step's `journal`, the runs still running, the approvals and
//! notifications still pending, which the engine keeps bounded by deciding, closing
//! and delivering them); **a read whose cost grows with history (`runs` with a
//! filter, `find_duplicate`, a run's whole log or all its journals for the API,
//! `journals_of_run`) goes inside `tokio::task::spawn_blocking`**. The HTTP
//! handlers do so; the runner reads only rows of the run it drives, and its
//! background tasks (start-up sweep, outbox retries, the park timer) read only
//! pending or running rows.
//!
//! Map: `writer` (the write path and [`Write`]/[`Outcome`]), `health` (whether the
//! store can write, whether its path still names the open file), `migrations`
//! (schema), `connection` (pragmas, read pool, row decoding), `lock` (the `flock` sidecar
//! files that say which process owns the store and which owns a run), then one file per
//! table: `runs`, `steps`, `events`, `approvals`, `notifications`, `kv`, and `journal`
//! (the three tables of the agent step journal); `copy` copies every table from one
//! store into another (`vectorstep store copy`).

mod approvals;
mod browse;
mod connection;
mod copy;
mod error;
mod events;
mod health;
mod journal;
mod kv;
pub mod lock;
mod migrations;
mod notifications;
pub mod postgres;
mod replicas;
mod runs;
mod sql;
mod steps;
mod watch;
mod writer;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::Connection;

pub use approvals::ApprovalRecord;
pub use browse::{RunCursor, RunQuery};
pub use connection::{raw_commit_probe, MIN_FREE_BYTES, WAL_BOUND_BYTES};
pub use copy::{copy_all, CopyError, CopyReport, CopyTable, StoreLocation, TableCopied};
pub use error::DbError;
pub use error::Error;
pub use events::EventRecord;
pub use journal::{
    is_within, root_of, DelegationRecord, StepJournal, ToolCallRecord, TurnRecord, DELEGATE_INFIX,
};
pub use notifications::NotificationRecord;
pub use postgres::redact as redact_url;
pub use postgres::SessionLock;
pub use replicas::{LeaseRecord, NamedLeaseRecord, ReplicaKind, ReplicaRecord, RunLeaseRow};
pub use runs::{DuplicateOf, RunFilter, RunRecord};
pub use sql::CopyValue;
pub use steps::StepRecord;
pub use watch::RunWatch;
pub use writer::{Outcome, Rejected, StoreStats, Write};

use connection::ReadPool;
use health::Health;
use postgres::pool::PgPool;
use postgres::PgConn;
use sql::{Args, Cols, Db};
use writer::Writer;

/// A handle to the database. Cheap to clone; all clones share one writer thread and
/// one read pool. When the last clone is dropped, the writer finishes every queued
/// batch and stops (the drop waits for that).
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    /// The SQLite file, `None` on PostgreSQL.
    path: Option<PathBuf>,
    /// Where the store is, for logs: the file, or the URL without its password.
    name: String,
    readers: Readers,
    writer: Writer,
    health: Arc<Health>,
}

/// The read connections of either backend.
enum Readers {
    Lite(ReadPool),
    Pg(PgPool),
}

/// One read connection, lent to a read for its duration: the table files' reads
/// run their statements on it through [`Db`], whichever the backend.
pub(crate) enum Reader<'a> {
    Lite(&'a Connection),
    Pg(&'a PgConn),
}

impl Db for Reader<'_> {
    fn now_ms_sql(&self) -> &'static str {
        match self {
            Reader::Lite(c) => c.now_ms_sql(),
            Reader::Pg(c) => c.now_ms_sql(),
        }
    }

    fn is_postgres(&self) -> bool {
        matches!(self, Reader::Pg(_))
    }

    fn exec(&self, sql: &str, args: Args<'_>) -> Result<usize, DbError> {
        match self {
            Reader::Lite(c) => c.exec(sql, args),
            Reader::Pg(c) => c.exec(sql, args),
        }
    }

    fn first<T>(
        &self,
        table: &'static str,
        sql: &str,
        args: Args<'_>,
        decode: impl FnOnce(&Cols) -> Result<T, Error>,
    ) -> Result<Option<T>, DbError> {
        match self {
            Reader::Lite(c) => c.first(table, sql, args, decode),
            Reader::Pg(c) => c.first(table, sql, args, decode),
        }
    }

    fn all<T>(
        &self,
        table: &'static str,
        sql: &str,
        args: Args<'_>,
        decode: impl Fn(&Cols) -> Result<T, Error>,
    ) -> Result<Vec<T>, DbError> {
        match self {
            Reader::Lite(c) => c.all(table, sql, args, decode),
            Reader::Pg(c) => c.all(table, sql, args, decode),
        }
    }
}

/// Free space under which the store refuses to start: SQLite could not even grow
/// the WAL by a few pages.
const REFUSE_BELOW_FREE_BYTES: u64 = 1024 * 1024;

impl Store {
    /// Opens (creating if needed) the database at `path`, brings its schema up to date
    /// and starts the writer thread.
    pub fn open(path: &Path) -> Result<Store, Error> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| Error::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        check_free_space(path)?;
        let mut conn: Connection =
            connection::open_writer(path).map_err(|e| disk_full_at_start(path, e))?;
        migrations::apply(&mut conn).map_err(|e| disk_full_at_start(path, e))?;
        let health = Arc::new(Health::new(path));
        let writer = Writer::spawn(conn, Arc::clone(&health))?;
        Ok(Store {
            inner: Arc::new(Inner {
                path: Some(path.to_path_buf()),
                name: path.display().to_string(),
                readers: Readers::Lite(ReadPool::new(path.to_path_buf())),
                writer,
                health,
            }),
        })
    }

    /// Opens the PostgreSQL database at `url` (`database.url`), brings its schema
    /// up to date (under an advisory lock, so replicas starting together migrate
    /// once) and starts the writer thread. `pool_size` bounds the idle read
    /// connections kept.
    pub fn open_postgres(url: &str, pool_size: usize) -> Result<Store, Error> {
        let conn = PgConn::connect(url)?;
        postgres::schema::apply(&conn)?;
        let name = postgres::redact(url);
        let health = Arc::new(Health::remote(&name));
        let writer = Writer::spawn_with(
            postgres::writer::PgWriter::new(url, conn),
            Arc::clone(&health),
        )?;
        Ok(Store {
            inner: Arc::new(Inner {
                path: None,
                name,
                readers: Readers::Pg(PgPool::new(url, pool_size)),
                writer,
                health,
            }),
        })
    }

    /// Why the store cannot take writes right now (`None` when it can): the last
    /// commit failed for a transient reason (busy, full disk, I/O) and none has
    /// succeeded since, or the database path no longer names the file this process
    /// opened. The file is checked afresh on every call (one `stat`).
    pub fn unwritable(&self) -> Option<String> {
        self.inner.health.problem()
    }

    /// The SQLite file; `None` when the store is PostgreSQL.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// Whether the store is PostgreSQL (shared by several replicas).
    pub fn is_shared(&self) -> bool {
        matches!(self.inner.readers, Readers::Pg(_))
    }

    /// Where the store is, for logs and errors: the SQLite file, or the PostgreSQL
    /// URL without its password.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Applies `writes` atomically and returns once they are committed to disk, with
    /// one [`Outcome`] per write. If any write fails, none of the batch is applied and
    /// the error names the failing write; other callers' batches are unaffected.
    ///
    /// Dropping the returned future does not cancel the batch: once submitted it is
    /// committed (or fails) regardless.
    pub async fn commit(&self, writes: Vec<Write>) -> Result<Vec<Outcome>, Error> {
        self.commit_or_return(writes).await.map_err(|r| r.error)
    }

    /// [`Store::commit`], handing the writes back when they were not committed, so
    /// that a caller who waits out a transient failure ([`Error::is_retriable`]) can
    /// submit the same batch again without having kept a copy.
    pub async fn commit_or_return(&self, writes: Vec<Write>) -> Result<Vec<Outcome>, Rejected> {
        let reply = self.inner.writer.submit(writes)?;
        match reply.await {
            Ok(result) => result,
            Err(_) => Err(Rejected {
                error: Error::WriterGone,
                writes: Vec::new(),
            }),
        }
    }

    /// [`Store::commit`] for synchronous code: the CLI, tests, `spawn_blocking`.
    /// It blocks the calling thread, so it must not be called from async code running
    /// on a tokio worker (tokio panics there); use `commit` instead.
    pub fn commit_blocking(&self, writes: Vec<Write>) -> Result<Vec<Outcome>, Error> {
        let reply = self.inner.writer.submit(writes).map_err(|r| r.error)?;
        reply
            .blocking_recv()
            .map_err(|_| Error::WriterGone)?
            .map_err(|r| r.error)
    }

    /// Counters of the write path since this store was opened.
    /// Follows a run's log: the watch resolves after each commit of this
    /// process that appends to it (`watch`).
    pub fn watch_run(&self, run_id: &str) -> RunWatch {
        self.inner.writer.watchers.subscribe(run_id)
    }

    /// How many runs' logs are followed (`watch_run`).
    pub fn followed_runs(&self) -> usize {
        self.inner.writer.watchers.followed()
    }

    pub fn stats(&self) -> StoreStats {
        self.inner.writer.counters.snapshot()
    }

    /// The result of `PRAGMA integrity_check`: `"ok"` when the file is sound,
    /// otherwise SQLite's list of problems, one per line. PostgreSQL checks its own
    /// pages; there the answer is `"ok"` once the server answers a query.
    pub fn integrity_check(&self) -> Result<String, Error> {
        self.read(|reader| {
            let conn = match reader {
                Reader::Lite(conn) => *conn,
                Reader::Pg(conn) => {
                    conn.exec("SELECT 1", &[])?;
                    return Ok("ok".to_string());
                }
            };
            let mut stmt = conn.prepare("PRAGMA integrity_check")?;
            let mut rows = stmt.query([])?;
            let mut lines = Vec::new();
            while let Some(row) = rows.next()? {
                lines.push(row.get::<_, String>(0)?);
            }
            Ok(lines.join("\n"))
        })
    }

    fn read<T>(&self, f: impl FnOnce(&Reader<'_>) -> Result<T, Error>) -> Result<T, Error> {
        match &self.inner.readers {
            Readers::Lite(pool) => pool.with(|c| f(&Reader::Lite(c))),
            Readers::Pg(pool) => pool.with(|c| f(&Reader::Pg(c))),
        }
    }
}

/// The liveness lock of replica `replica` on the PostgreSQL database at `url`:
/// held for the replica's lifetime on a connection of its own, so the others see
/// at once when its session ends ([`Store::replica_gone`]). `None` if taken
/// already (a replica id is per boot, so only by a probe at that very moment).
pub fn lock_replica(url: &str, replica: &str) -> Result<Option<SessionLock>, Error> {
    Ok(postgres::try_replica_lock(
        url,
        postgres::replica_lock_key(replica),
    )?)
}

/// Wakes `wake` whenever another process on the PostgreSQL store at `url` frees
/// runs for others (a lease released at shutdown, a replica stopped), and after the
/// listener reconnects; see `postgres::WORK_CHANNEL`.
pub fn listen_for_work(url: &str, wake: std::sync::Arc<tokio::sync::Notify>) -> Result<(), Error> {
    Ok(postgres::listen(url, postgres::WORK_CHANNEL, wake)?)
}

/// Refuses to start on a disk with no room left, and warns when it is short.
fn check_free_space(path: &Path) -> Result<(), Error> {
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d,
        None => Path::new("."),
    };
    let Some(free) = free_bytes(dir) else {
        return Ok(());
    };
    if free < REFUSE_BELOW_FREE_BYTES {
        return Err(Error::DiskFull {
            path: path.to_path_buf(),
            detail: format!("{free} bytes free in {}", dir.display()),
            needed_mb: MIN_FREE_BYTES / (1024 * 1024),
        });
    }
    if free < MIN_FREE_BYTES {
        tracing::warn!(
            path = %path.display(),
            free_mb = free / (1024 * 1024),
            wanted_mb = MIN_FREE_BYTES / (1024 * 1024),
            "Little free space for the store; commits fail (and runs wait, intake answers 503) once it runs out."
        );
    }
    Ok(())
}

/// Bytes an unprivileged process may still write in `dir`, if the system says.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path and `stat` is a plain C struct that
    // statvfs fills in; it is read only when the call succeeded.
    unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut stat) != 0 {
            return None;
        }
        Some((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
    }
}

/// A full disk while opening or migrating says so, instead of a bare SQLite code.
fn disk_full_at_start(path: &Path, e: Error) -> Error {
    let full = match &e {
        Error::Sqlite(s) | Error::Migration { source: s, .. } => error::is_disk_full(s),
        _ => false,
    };
    if full {
        Error::DiskFull {
            path: path.to_path_buf(),
            detail: e.to_string(),
            needed_mb: MIN_FREE_BYTES / (1024 * 1024),
        }
    } else {
        e
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}
