//! The PostgreSQL side of the store, for several replicas sharing one database
//! (`database.url`). Being built. So far: the schema (`schema`), which is the SQLite
//! schema translated, version for version, so both backends always hold the same
//! tables, columns and rules; and the writes (`db`, [`apply_batch`]): every `Write`
//! runs the very statements it runs on SQLite, through the same `Db` trait, with
//! the same outcomes; and the first reads (`run_with_steps`), through the read
//! functions the SQLite store uses. The connection owner with group commit, the
//! other reads and the leases follow, behind the same contract as the SQLite
//! store (see `store`).
//!
//! Like SQLite's connections, PostgreSQL clients here are synchronous
//! (`postgres::Client`) and owned by the store's own threads: the engine never holds
//! one across an await, and never holds a transaction across a step.

mod db;
pub mod schema;

use super::{Error, Outcome, Write};

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

/// A synchronous client for `url`, without TLS (the database is expected on a
/// private network or the same host; TLS is not built in yet).
pub fn connect(url: &str) -> Result<postgres::Client, PgError> {
    postgres::Client::connect(url, postgres::NoTls).map_err(|source| PgError::Connect {
        url: redact(url),
        source,
    })
}

/// Applies one batch atomically in its own transaction, with one [`Outcome`] per
/// write: all of it or, naming the failing write, none of it. (The PostgreSQL
/// writer will group several batches per transaction, as SQLite's does.)
pub fn apply_batch(client: &mut postgres::Client, writes: &[Write]) -> Result<Vec<Outcome>, Error> {
    let tx = db::PgTx::new(client.transaction().map_err(PgError::Db)?);
    let outcomes = super::writer::apply_writes(&tx, writes)?;
    tx.commit().map_err(PgError::Db)?;
    Ok(outcomes)
}

/// The run `id` and its step records, read with the statements the SQLite store
/// reads them with (`Store::run`, `Store::steps`), in one transaction.
pub fn run_with_steps(
    client: &mut postgres::Client,
    id: &str,
) -> Result<Option<(super::RunRecord, Vec<super::StepRecord>)>, Error> {
    let tx = db::PgTx::new(client.transaction().map_err(PgError::Db)?);
    let Some(run) = super::runs::by_id(&tx, id)? else {
        return Ok(None);
    };
    let steps = super::steps::of_run(&tx, id)?;
    tx.commit().map_err(PgError::Db)?;
    Ok(Some((run, steps)))
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
