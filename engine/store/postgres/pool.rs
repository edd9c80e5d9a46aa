//! Connections for reads, made on demand and reused, like SQLite's read pool. A
//! connection is taken out of the pool for the duration of one read, so reads
//! never share one; a connection the server closed (a restart) is dropped rather
//! than handed out again.

use std::sync::Mutex;

use super::super::Error;
use super::conn::PgConn;

pub(crate) struct PgPool {
    url: String,
    idle: Mutex<Vec<PgConn>>,
    /// How many idle connections are kept (`database.pool_size`).
    keep: usize,
}

impl PgPool {
    pub(crate) fn new(url: &str, keep: usize) -> PgPool {
        PgPool {
            url: url.to_string(),
            idle: Mutex::new(Vec::new()),
            keep: keep.max(1),
        }
    }

    /// The database's URL (with its password: never for logs).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&PgConn) -> Result<T, Error>) -> Result<T, Error> {
        let conn = loop {
            // A poisoned lock only means another reader panicked holding it; the
            // vector of idle connections is still valid.
            let taken = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            match taken {
                Some(conn) if conn.is_closed() => continue,
                Some(conn) => break conn,
                None => break PgConn::connect(&self.url)?,
            }
        };
        let result = f(&conn);
        if !conn.is_closed() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < self.keep {
                idle.push(conn);
            }
        }
        result
    }
}
