//! The one error type of the store, used by callers as `store::Error`.

use std::path::PathBuf;

/// Everything that can go wrong in the store.
///
/// Callers that want to retry (for example a webhook handler answering 503) should ask
/// [`Error::is_retriable`] rather than matching on variants: only lock contention with
/// another process and group-level failures caused by someone else's batch are worth
/// another attempt; everything else will fail the same way again.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create the database directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },

    /// SQLite refused WAL (an in-memory path, some network filesystems); without it
    /// readers would block the writer and the durability contract would not hold.
    #[error("{path} cannot be opened in WAL mode (sqlite kept journal_mode={mode})")]
    NotWal { path: PathBuf, mode: String },

    #[error("cannot start the store's writer thread: {0}")]
    SpawnWriter(std::io::Error),

    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),

    #[error("migration {version} ({name}) failed: {source}")]
    Migration {
        version: i64,
        name: &'static str,
        source: rusqlite::Error,
    },

    /// The database was migrated by a newer build; writing to it with this build could
    /// corrupt data the newer schema relies on.
    #[error(
        "the database has schema version {found}, but this build knows only up to {known}; \
         upgrade vectorstep or point it at another database"
    )]
    SchemaTooNew { found: i64, known: i64 },

    /// One write of the caller's batch failed; the whole batch was rolled back and
    /// nothing else in the same group commit was affected.
    #[error("write #{index} ({write}) of the batch failed, the batch was rolled back: {source}")]
    Write {
        index: usize,
        write: &'static str,
        source: rusqlite::Error,
    },

    /// The shared group transaction could not be begun or committed, so this caller's
    /// batch is not durable even though none of its writes failed.
    #[error("the group transaction could not be {stage}: {message}")]
    Transaction {
        stage: &'static str,
        message: String,
        retriable: bool,
    },

    #[error("the store's writer thread has stopped")]
    WriterGone,

    /// A row holds a value its Rust type cannot represent (a NULL in a required column,
    /// a negative token count, text in an integer column...).
    #[error("corrupt row in {table}.{column}: {detail}")]
    Corrupt {
        table: &'static str,
        column: &'static str,
        detail: String,
    },
}

impl Error {
    /// Whether the same operation may succeed if tried again later.
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Sqlite(e) | Error::Write { source: e, .. } => is_busy(e),
            Error::Transaction { retriable, .. } => *retriable,
            _ => false,
        }
    }
}

/// Busy and locked mean another connection held the lock for longer than the busy
/// timeout; nothing is wrong with the data or the request.
pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}
