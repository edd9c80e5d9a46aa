//! One PostgreSQL connection, usable from any thread.
//!
//! tokio-postgres splits a connection in two: the `Connection` does the socket I/O
//! and must run on a tokio runtime; the `Client` only sends requests to it over a
//! channel and waits for the answers. Every connection's I/O half runs on one
//! runtime thread of the store's own (`vectorstep-pg-io`), and the store's callers
//! wait for the `Client`'s answers with `futures::executor::block_on`, which needs
//! no runtime. So a read works from a tokio worker, `spawn_blocking` or a plain
//! thread alike, and blocks the caller as a SQLite read does (the synchronous
//! `postgres` crate would panic on a tokio worker: it starts a runtime per call).
//!
//! Statements are prepared once per connection and kept, keyed by the table files'
//! SQLite text, so the placeholders are respelled once and every later execution is
//! one round trip.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use super::super::error::DbError;
use super::super::sql::{for_postgres, pg_args, Args, Cols, Db, PgArg};
use super::super::Error;
use super::{redact, PgError};

/// How long a connection attempt may take when the URL does not say
/// (`connect_timeout`): a database that is down fails the attempt instead of
/// holding the writer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection and the statements prepared on it.
pub(crate) struct PgConn {
    client: Client,
    statements: RefCell<HashMap<String, Statement>>,
}

/// The runtime every connection's I/O runs on, started on first use.
fn io() -> Result<&'static tokio::runtime::Handle, PgError> {
    static IO: OnceLock<Result<tokio::runtime::Handle, String>> = OnceLock::new();
    let started = IO.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("vectorstep-pg-io".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .map_err(|e| e.to_string())?;
        Ok(handle)
    });
    started.as_ref().map_err(|e| PgError::Runtime(e.clone()))
}

/// Waits for a client future on the calling thread (see the module comment).
fn wait<F: Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

impl PgConn {
    /// Connects to `url` (without TLS: the database is expected on a private
    /// network or the same host).
    pub(crate) fn connect(url: &str) -> Result<PgConn, PgError> {
        let failed = |source| PgError::Connect {
            url: redact(url),
            source,
        };
        let mut config: tokio_postgres::Config = url.parse().map_err(failed)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.keepalives(true);
        if config.get_application_name().is_none() {
            config.application_name("vectorstep");
        }
        let connecting = io()?.spawn(async move {
            let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %super::detail(&e), "A PostgreSQL connection ended.");
                }
            });
            Ok::<_, tokio_postgres::Error>(client)
        });
        let client = wait(connecting)
            .map_err(|e| PgError::Runtime(e.to_string()))?
            .map_err(failed)?;
        Ok(PgConn {
            client,
            statements: RefCell::new(HashMap::new()),
        })
    }

    /// Whether the server or the network ended this connection; a closed
    /// connection is dropped and another one made.
    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Runs statements without parameters (`BEGIN`, `SAVEPOINT`, DDL), in one
    /// round trip.
    pub(crate) fn batch(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        wait(self.client.batch_execute(sql))
    }

    /// Runs one statement given in PostgreSQL's own spelling (`$1`), uncached.
    pub(crate) fn execute_raw(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        wait(self.client.execute(sql, params))
    }

    /// The rows of one statement in PostgreSQL's own spelling, uncached.
    pub(crate) fn query_raw(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        wait(self.client.query(sql, params))
    }

    /// The statement for a table file's SQLite text, prepared on first use.
    fn statement(&self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(st) = self.statements.borrow().get(sql) {
            return Ok(st.clone());
        }
        let st = wait(self.client.prepare(&for_postgres(sql)))?;
        self.statements
            .borrow_mut()
            .insert(sql.to_string(), st.clone());
        Ok(st)
    }

    fn rows(&self, sql: &str, args: Args<'_>) -> Result<Vec<tokio_postgres::Row>, DbError> {
        let st = self.statement(sql)?;
        let bound = pg_args(args);
        Ok(wait(self.client.query(&st, &params(&bound)))?)
    }
}

fn params<'b>(args: &'b [PgArg<'b>]) -> Vec<&'b (dyn ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn ToSql + Sync)).collect()
}

impl Db for PgConn {
    fn now_ms_sql(&self) -> &'static str {
        super::super::sql::POSTGRES_NOW_MS
    }

    fn is_postgres(&self) -> bool {
        true
    }

    fn exec(&self, sql: &str, args: Args<'_>) -> Result<usize, DbError> {
        let st = self.statement(sql)?;
        let bound = pg_args(args);
        let n = wait(self.client.execute(&st, &params(&bound)))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn first<T>(
        &self,
        table: &'static str,
        sql: &str,
        args: Args<'_>,
        decode: impl FnOnce(&Cols) -> Result<T, Error>,
    ) -> Result<Option<T>, DbError> {
        let rows = self.rows(sql, args)?;
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
        let rows = self.rows(sql, args)?;
        rows.iter()
            .map(|row| decode(&Cols::pg(row, table)).map_err(|e| DbError::Row(Box::new(e))))
            .collect()
    }
}

/// How long the listener waits before connecting again after its connection
/// ended (the server restarted, the network dropped).
const LISTEN_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Listens on `channel` (`LISTEN`) over a connection of its own, for the
/// process's life, and wakes `wake` (one stored permit) for every notification
/// and after every reconnect, since a notification sent while it was away is
/// lost. Waking is a hint: whoever waits also looks on a timer.
pub(crate) fn listen(
    url: &str,
    channel: &'static str,
    wake: std::sync::Arc<tokio::sync::Notify>,
) -> Result<(), PgError> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|source| PgError::Connect {
        url: redact(url),
        source,
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    config.keepalives(true);
    config.application_name("vectorstep listener");
    io()?.spawn(async move {
        loop {
            match listen_once(&config, channel, &wake).await {
                Ok(()) => {}
                Err(e) => {
                    tracing::debug!(error = %super::detail(&e), channel, "The PostgreSQL listener lost its connection; connecting again.");
                }
            }
            tokio::time::sleep(LISTEN_RETRY).await;
        }
    });
    Ok(())
}

/// One connection's worth of listening: ends when the connection does.
async fn listen_once(
    config: &tokio_postgres::Config,
    channel: &'static str,
    wake: &tokio::sync::Notify,
) -> Result<(), tokio_postgres::Error> {
    use futures::StreamExt;
    let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // The connection delivers notifications only while it is polled.
    let pump = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(_)) => {
                    if tx.send(()).is_err() {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    // Listening again: whatever was sent meanwhile is looked for now.
    wake.notify_one();
    while rx.recv().await.is_some() {
        wake.notify_one();
    }
    drop(client);
    match pump.await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}
