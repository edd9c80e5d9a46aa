//! The PostgreSQL side of the writer thread (`store::writer`): the same queue and
//! group commit as SQLite's, over one connection that is made again when the
//! server or the network drops it.
//!
//! A group is one transaction; with several batches in it, each runs inside its own
//! savepoint, so a failing batch is undone alone and only its caller sees the
//! error. A single batch needs no savepoint: its failure rolls the transaction
//! back. While the database cannot be reached, every group fails as retriable: the
//! store is marked unwritable (intake answers 503, runs wait and submit the same
//! batch again) and the writer probes every second until a commit succeeds.
//!
//! One ambiguity no client can remove: a connection lost during `COMMIT` leaves
//! the group's fate unknown. It is reported as a retriable failure, so the batch is
//! submitted again; the writes are upserts and conditional updates, so applying
//! one twice leaves the same rows, except a run-log event, which may then appear
//! twice (docs/replicas.md).

use super::super::error::is_transient_pg as is_transient;
use super::super::writer::{apply_writes, Attempt, GroupCommit};
use super::super::{Error, Write};
use super::conn::PgConn;
use super::PgError;

pub(crate) struct PgWriter {
    url: String,
    conn: Option<PgConn>,
}

impl PgWriter {
    pub(crate) fn new(url: &str, conn: PgConn) -> PgWriter {
        PgWriter {
            url: url.to_string(),
            conn: Some(conn),
        }
    }

    /// The open connection, made again if it was closed.
    fn connection(&mut self) -> Result<&PgConn, PgError> {
        if self.conn.as_ref().is_none_or(PgConn::is_closed) {
            self.conn = None;
            let conn = PgConn::connect(&self.url)?;
            tracing::info!("The store writer is connected to PostgreSQL again.");
            self.conn = Some(conn);
        }
        match self.conn.as_ref() {
            Some(conn) => Ok(conn),
            None => Err(PgError::Runtime("no connection".into())),
        }
    }
}

fn failed(stage: &'static str, error: &tokio_postgres::Error) -> Attempt {
    Attempt::Failed {
        stage,
        message: super::detail(error),
        retriable: is_transient(error),
    }
}

impl GroupCommit for PgWriter {
    fn attempt(&mut self, batches: &[&[Write]]) -> Attempt {
        let conn = match self.connection() {
            Ok(conn) => conn,
            Err(error) => {
                return Attempt::Failed {
                    stage: "begun",
                    message: error.to_string(),
                    retriable: true,
                }
            }
        };
        if let Err(error) = conn.batch("BEGIN") {
            return failed("begun", &error);
        }
        let single = batches.len() == 1;
        let mut replies = Vec::with_capacity(batches.len());
        for (index, writes) in batches.iter().enumerate() {
            if !single {
                if let Err(error) = conn.batch("SAVEPOINT batch") {
                    let _ = conn.batch("ROLLBACK");
                    return failed("begun", &error);
                }
            }
            match apply_writes(conn, writes) {
                Ok(outcomes) => {
                    if !single {
                        if let Err(error) = conn.batch("RELEASE SAVEPOINT batch") {
                            let _ = conn.batch("ROLLBACK");
                            return failed("committed", &error);
                        }
                    }
                    replies.push(Ok(outcomes));
                }
                Err(error) => {
                    // A refused batch (a constraint, a fence) on a sound
                    // connection is undone alone; the rest of the group goes on.
                    let sound = !error.is_retriable() && !conn.is_closed();
                    if sound && single && conn.batch("ROLLBACK").is_ok() {
                        return Attempt::Committed(vec![Err(error)]);
                    }
                    if sound
                        && !single
                        && conn
                            .batch("ROLLBACK TO SAVEPOINT batch; RELEASE SAVEPOINT batch")
                            .is_ok()
                    {
                        replies.push(Err(error));
                        continue;
                    }
                    // The transaction is gone: answer this batch and let the others
                    // try again.
                    let _ = conn.batch("ROLLBACK");
                    return Attempt::Aborted { index, error };
                }
            }
        }
        if let Err(error) = conn.batch("COMMIT") {
            if !conn.is_closed() {
                let _ = conn.batch("ROLLBACK");
            }
            return failed("committed", &error);
        }
        Attempt::Committed(replies)
    }

    fn refuse(&mut self) -> Option<Error> {
        None
    }
}
