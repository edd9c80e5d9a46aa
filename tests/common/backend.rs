//! Which store the integration tests run against: the same tests, parameterised by
//! `VECTORSTEP_TEST_BACKEND` (`sqlite`, the default, or `postgres`). `tests/run.sh`
//! runs the suite on SQLite and then the flow, crash, service, approvals and
//! schedule tests again on PostgreSQL (a throwaway server, `common::postgres`).
//!
//! A harness asks [`Database::new`] once per scratch folder and writes
//! [`Database::yaml`] into its config; a store reopened after a restart is the same
//! database.

use std::path::{Path, PathBuf};

use super::postgres::Postgres;

/// The store of one scratch folder.
#[derive(Debug, Clone)]
pub enum Database {
    Sqlite(PathBuf),
    /// A fresh database on the shared throwaway server.
    Postgres(String),
}

/// Whether this test process runs on PostgreSQL.
pub fn on_postgres() -> bool {
    match std::env::var("VECTORSTEP_TEST_BACKEND").as_deref() {
        Err(_) | Ok("") | Ok("sqlite") => false,
        Ok("postgres") => true,
        Ok(other) => panic!("VECTORSTEP_TEST_BACKEND is `{other}`; use `sqlite` or `postgres`"),
    }
}

/// The lease settings the PostgreSQL runs use: short, so a restarted service
/// adopts the runs of the one it replaced within seconds (the defaults are 30 s).
pub const TEST_REPLICA_YAML: &str = "replica: {lease_seconds: 3, heartbeat_seconds: 1}";

impl Database {
    /// The store for a scratch folder whose SQLite file would be `sqlite_path`.
    pub fn new(sqlite_path: &Path) -> Database {
        if on_postgres() {
            Database::Postgres(Postgres::shared().database())
        } else {
            Database::Sqlite(sqlite_path.to_path_buf())
        }
    }

    /// The config lines naming it (`database:`, and `replica:` on PostgreSQL).
    pub fn yaml(&self) -> String {
        match self {
            Database::Sqlite(path) => {
                format!("database: {{path: {:?}}}", path.display().to_string())
            }
            Database::Postgres(url) => {
                format!("database: {{url: {url:?}, pool_size: 4}}\n{TEST_REPLICA_YAML}")
            }
        }
    }

    /// Opens it, as the service does.
    pub fn open(&self) -> vectorstep::store::Store {
        match self {
            Database::Sqlite(path) => vectorstep::store::Store::open(path),
            Database::Postgres(url) => vectorstep::store::Store::open_postgres(url, 4),
        }
        .expect("open the store")
    }
}
