//! The statements of the table files on a PostgreSQL transaction: [`PgTx`]
//! implements the same `Db` trait as SQLite's connection, respelling the
//! placeholders and binding the neutral values.

use std::cell::RefCell;

use super::super::error::DbError;
use super::super::sql::{for_postgres, pg_args, Args, Cols, Db, PgArg};
use super::super::Error;

/// One open PostgreSQL transaction, used by the writes of one batch.
pub(crate) struct PgTx<'a> {
    tx: RefCell<postgres::Transaction<'a>>,
}

impl<'a> PgTx<'a> {
    pub(crate) fn new(tx: postgres::Transaction<'a>) -> PgTx<'a> {
        PgTx {
            tx: RefCell::new(tx),
        }
    }

    pub(crate) fn commit(self) -> Result<(), postgres::Error> {
        self.tx.into_inner().commit()
    }
}

fn params<'b>(args: &'b [PgArg<'b>]) -> Vec<&'b (dyn postgres::types::ToSql + Sync)> {
    args.iter()
        .map(|a| a as &(dyn postgres::types::ToSql + Sync))
        .collect()
}

impl Db for PgTx<'_> {
    fn now_ms_sql(&self) -> &'static str {
        super::super::sql::POSTGRES_NOW_MS
    }
    fn exec(&self, sql: &str, args: Args<'_>) -> Result<usize, DbError> {
        let bound = pg_args(args);
        let n = self
            .tx
            .borrow_mut()
            .execute(for_postgres(sql).as_str(), &params(&bound))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn first<T>(
        &self,
        table: &'static str,
        sql: &str,
        args: Args<'_>,
        decode: impl FnOnce(&Cols) -> Result<T, Error>,
    ) -> Result<Option<T>, DbError> {
        let bound = pg_args(args);
        let rows = self
            .tx
            .borrow_mut()
            .query(for_postgres(sql).as_str(), &params(&bound))?;
        match rows.first() {
            Some(row) => decode(&Cols::pg(row, table))
                .map(Some)
                .map_err(|e| DbError::Row(Box::new(e))),
            None => Ok(None),
        }
    }

    fn all<T>(
        &self,
        table: &'static str,
        sql: &str,
        args: Args<'_>,
        decode: impl Fn(&Cols) -> Result<T, Error>,
    ) -> Result<Vec<T>, DbError> {
        let bound = pg_args(args);
        let rows = self
            .tx
            .borrow_mut()
            .query(for_postgres(sql).as_str(), &params(&bound))?;
        rows.iter()
            .map(|row| decode(&Cols::pg(row, table)).map_err(|e| DbError::Row(Box::new(e))))
            .collect()
    }
}
