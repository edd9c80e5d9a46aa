//! The store's errors: `store::Error`, what a write's statement failed with
//! ([`DbError`], either driver) and PostgreSQL's ([`PgError`]). A leaf: it names
//! the drivers' error types and nothing else of the store.

use std::path::PathBuf;

/// Everything that can go wrong in the store.
///
/// Callers that want to retry (for example a webhook handler answering 503, or a run's
/// driver waiting for the store to come back) should ask [`Error::is_retriable`] rather
/// than matching on variants: lock contention with another process, a full disk, an
/// I/O error and a database file that is no longer where it was opened are conditions
/// of the machine that an operator (or time) can clear; everything else will fail the
/// same way again.
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
        source: DbError,
    },

    /// The shared group transaction could not be begun or committed, so this caller's
    /// batch is not durable even though none of its writes failed.
    #[error("the group transaction could not be {stage}: {message}")]
    Transaction {
        stage: &'static str,
        message: String,
        retriable: bool,
    },

    #[error("{0}")]
    Postgres(#[from] PgError),

    /// The batch began with a `Write::Fence` for a run whose lease is no longer the
    /// writer's (another replica claimed it, or the writer released it): nothing of
    /// the batch was applied, and the writer must stop driving the run. Never
    /// retriable: the lease does not come back by waiting.
    #[error(
        "run {run_id} is no longer leased to this replica ({}); nothing of the batch \
         was applied and the run must not be driven from here",
        holder(owner.as_deref(), *epoch, *released)
    )]
    Fenced {
        run_id: String,
        /// Who holds the lease now (`None`: nobody, the run was never leased or is gone).
        owner: Option<String>,
        /// The lease's current epoch (0: never leased).
        epoch: u64,
        /// The current holder released it at a step boundary.
        released: bool,
    },

    /// The batch began with a `Write::FenceNamedLease` for a singleton lease (the
    /// Telegram poller) the writer no longer holds.
    #[error(
        "the `{name}` lease is no longer this process's ({}): nothing of the batch was applied",
        match owner { Some(o) => format!("{o} holds it"), None => "nobody holds it".to_string() }
    )]
    NamedLeaseLost { name: String, owner: Option<String> },

    #[error("the store's writer thread has stopped")]
    WriterGone,

    /// The database path no longer names the file this process has open (deleted,
    /// or replaced by another file): anything committed now would land in a file
    /// nobody will read again, so nothing is committed until the path is restored.
    #[error(
        "the database file {path} is no longer the file this process opened ({detail}); \
         nothing is written until it is restored; restart vectorstep to use the file now at that path"
    )]
    FileReplaced { path: PathBuf, detail: String },

    /// The disk holding the database is full at start-up.
    #[error(
        "the disk holding {path} is full ({detail}); free some space there (the store needs \
         at least {needed_mb} MB free to start) and start again"
    )]
    DiskFull {
        path: PathBuf,
        detail: String,
        needed_mb: u64,
    },

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
            Error::Sqlite(e)
            | Error::Write {
                source: DbError::Sqlite(e),
                ..
            } => is_transient(e),
            Error::Postgres(PgError::Db(e) | PgError::Connect { source: e, .. })
            | Error::Write {
                source: DbError::Postgres(e),
                ..
            } => is_transient_pg(e),
            Error::Transaction { retriable, .. } => *retriable,
            Error::FileReplaced { .. } => true,
            Error::Fenced { .. } => false,
            _ => false,
        }
    }
}

/// Whether SQLite failed because of the machine rather than the data or the request:
/// busy and locked (another connection held the lock for longer than the busy
/// timeout), a full disk, an I/O error, a file made read-only or that cannot be
/// opened (its folder changed under the process). The same writes may succeed once
/// the condition clears.
pub(super) fn is_transient(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode as C;
    matches!(
        e.sqlite_error_code(),
        Some(
            C::DatabaseBusy
                | C::DatabaseLocked
                | C::DiskFull
                | C::SystemIoFailure
                | C::ReadOnly
                | C::CannotOpen
        )
    )
}

/// Whether PostgreSQL failed because of the connection or the server's state
/// rather than the data: the connection closed or broke, the server is shutting
/// down or starting, out of resources, or a serialization conflict. The same
/// batch may succeed on a new connection once the condition clears.
pub(super) fn is_transient_pg(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let c = code.code();
            c.starts_with("08")
                || c.starts_with("53")
                || c.starts_with("57P")
                || c == "40001"
                || c == "40P01"
                || c == "25006"
        }
        // No SQLSTATE: transient only when the client could not talk to the
        // server (I/O, a timeout), not when it refused a value itself.
        None => std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()),
    }
}

/// A full disk, as SQLite reports it.
pub(super) fn is_disk_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

/// A failed statement of a write, whichever driver ran it.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("{0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("{}", detail(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// A row the write read back could not be decoded.
    #[error("{0}")]
    Row(Box<Error>),
    /// `Write::Fence` refused the batch; becomes [`Error::Fenced`].
    #[error("run {run_id} is fenced ({})", holder(owner.as_deref(), *epoch, *released))]
    Fenced {
        run_id: String,
        owner: Option<String>,
        epoch: u64,
        released: bool,
    },
    /// `Write::FenceNamedLease` refused the batch; becomes [`Error::NamedLeaseLost`].
    #[error("the `{name}` lease is lost")]
    NamedLeaseLost { name: String, owner: Option<String> },
}

/// Who holds a lease, in words.
fn holder(owner: Option<&str>, epoch: u64, released: bool) -> String {
    match (owner, released) {
        (None, _) => format!("it is leased to nobody, epoch {epoch}"),
        (Some(o), false) => format!("{o} holds it under epoch {epoch}"),
        (Some(o), true) => format!("{o} released it under epoch {epoch}"),
    }
}

impl From<DbError> for Error {
    fn from(e: DbError) -> Error {
        match e {
            DbError::Sqlite(e) => Error::Sqlite(e),
            DbError::Postgres(e) => Error::Postgres(PgError::Db(e)),
            DbError::Row(e) => *e,
            DbError::NamedLeaseLost { name, owner } => Error::NamedLeaseLost { name, owner },
            DbError::Fenced {
                run_id,
                owner,
                epoch,
                released,
            } => Error::Fenced {
                run_id,
                owner,
                epoch,
                released,
            },
        }
    }
}

/// A PostgreSQL failure, with what was being done. Messages carry the server's
/// own words (`tokio_postgres::Error` alone displays only "db error").
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("cannot connect to PostgreSQL at {url}: {}", detail(.source))]
    Connect {
        /// The URL without its password.
        url: String,
        source: tokio_postgres::Error,
    },
    #[error("PostgreSQL migration {version} ({name}) failed: {}", detail(.source))]
    Migration {
        version: i64,
        name: &'static str,
        source: tokio_postgres::Error,
    },
    /// The database was migrated by a newer build.
    #[error(
        "the PostgreSQL database has schema version {found}, but this build knows only up to \
         {known}; upgrade vectorstep or point it at another database"
    )]
    SchemaTooNew { found: i64, known: i64 },
    #[error("PostgreSQL: {}", detail(.0))]
    Db(#[from] tokio_postgres::Error),
    /// The thread that runs the connections' I/O could not be started.
    #[error("cannot start the PostgreSQL connection thread: {0}")]
    Runtime(String),
}

/// What the server said (message and SQLSTATE), or the client error with its causes.
pub fn detail(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} (SQLSTATE {})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
