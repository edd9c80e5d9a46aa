//! Durable state: runs, steps, the run log, approvals, the notification outbox and a
//! small key-value table, in one SQLite file.
//!
//! This is the only module that imports rusqlite. Writes go through [`Store::commit`]
//! (or [`Store::commit_blocking`]), which returns only once the batch is durable; one
//! writer thread owns the only write connection and group-commits concurrent batches.
//! Reads are synchronous and use separate read-only connections, so they never wait
//! for the writer and also work while another process (the running server) writes.
//!
//! Map: `writer` (the write path and [`Write`]/[`Outcome`]), `migrations` (schema),
//! `connection` (pragmas, read pool, row decoding), `lock` (the `flock` sidecar files
//! that say which process owns the store and which owns a run), then one file per
//! table: `runs`, `steps`, `events`, `approvals`, `notifications`, `kv`.

mod approvals;
mod connection;
mod error;
mod events;
mod kv;
pub mod lock;
mod migrations;
mod notifications;
mod runs;
mod steps;
mod writer;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::Connection;

pub use approvals::ApprovalRecord;
pub use connection::raw_commit_probe;
pub use error::Error;
pub use events::EventRecord;
pub use notifications::NotificationRecord;
pub use runs::{DuplicateOf, RunFilter, RunRecord};
pub use steps::StepRecord;
pub use writer::{Outcome, StoreStats, Write};

use connection::ReadPool;
use writer::Writer;

/// A handle to the database. Cheap to clone; all clones share one writer thread and
/// one read pool. When the last clone is dropped, the writer finishes every queued
/// batch and stops (the drop waits for that).
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    readers: ReadPool,
    writer: Writer,
}

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
        let mut conn: Connection = connection::open_writer(path)?;
        migrations::apply(&mut conn)?;
        let writer = Writer::spawn(conn)?;
        Ok(Store {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                readers: ReadPool::new(path.to_path_buf()),
                writer,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Applies `writes` atomically and returns once they are committed to disk, with
    /// one [`Outcome`] per write. If any write fails, none of the batch is applied and
    /// the error names the failing write; other callers' batches are unaffected.
    ///
    /// Dropping the returned future does not cancel the batch: once submitted it is
    /// committed (or fails) regardless.
    pub async fn commit(&self, writes: Vec<Write>) -> Result<Vec<Outcome>, Error> {
        let reply = self.inner.writer.submit(writes)?;
        reply.await.map_err(|_| Error::WriterGone)?
    }

    /// [`Store::commit`] for synchronous code: the CLI, tests, `spawn_blocking`.
    /// It blocks the calling thread, so it must not be called from async code running
    /// on a tokio worker (tokio panics there); use `commit` instead.
    pub fn commit_blocking(&self, writes: Vec<Write>) -> Result<Vec<Outcome>, Error> {
        let reply = self.inner.writer.submit(writes)?;
        reply.blocking_recv().map_err(|_| Error::WriterGone)?
    }

    /// Counters of the write path since this store was opened.
    pub fn stats(&self) -> StoreStats {
        self.inner.writer.counters.snapshot()
    }

    /// The result of `PRAGMA integrity_check`: `"ok"` when the file is sound,
    /// otherwise SQLite's list of problems, one per line.
    pub fn integrity_check(&self) -> Result<String, Error> {
        self.read(|conn| {
            let mut stmt = conn.prepare("PRAGMA integrity_check")?;
            let mut rows = stmt.query([])?;
            let mut lines = Vec::new();
            while let Some(row) = rows.next()? {
                lines.push(row.get::<_, String>(0)?);
            }
            Ok(lines.join("\n"))
        })
    }

    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T, Error>) -> Result<T, Error> {
        self.inner.readers.with(f)
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}
