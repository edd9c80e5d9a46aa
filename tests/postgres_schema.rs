//! The PostgreSQL schema against a real, throwaway PostgreSQL server
//! (`common::postgres`): the migrations apply once, concurrently too, and leave the
//! same tables and columns, with the same rules, as the SQLite store.

mod common;

use std::collections::BTreeMap;

use common::postgres::{postgres_client, Postgres};
use vectorstep::store::postgres::migrate;

/// `table -> [(column, type, not null)]`, types in PostgreSQL's words.
type Shape = BTreeMap<String, Vec<(String, String, bool)>>;

fn postgres_shape(url: &str) -> Shape {
    let mut c = postgres_client(url).expect("connect");
    let rows = c
        .query(
            "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns \
             WHERE table_schema = 'public' ORDER BY table_name, ordinal_position",
            &[],
        )
        .expect("columns");
    let mut shape = Shape::new();
    for r in rows {
        let (table, column, ty, nullable): (String, String, String, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        shape
            .entry(table)
            .or_default()
            .push((column, ty, nullable == "NO"));
    }
    shape
}

fn sqlite_shape() -> Shape {
    let dir = std::env::temp_dir().join(format!("vs-schema-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("vs.db");
    drop(vectorstep::store::Store::open(&path).expect("open the SQLite store"));
    let conn = rusqlite::Connection::open(&path).expect("open");
    let mut tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .expect("tables")
        .query_map([], |r| r.get(0))
        .expect("tables")
        .collect::<Result<_, _>>()
        .expect("tables");
    tables.sort();
    let mut shape = Shape::new();
    for t in tables {
        let mut stmt = conn
            .prepare(&format!("PRAGMA table_info({t})"))
            .expect("table_info");
        let cols = stmt
            .query_map([], |r| {
                let (name, ty, notnull, pk): (String, String, bool, i64) =
                    (r.get(1)?, r.get(2)?, r.get(3)?, r.get(5)?);
                // What the translation makes of each SQLite type.
                let ty = match ty.as_str() {
                    "INTEGER" => "bigint",
                    "REAL" => "double precision",
                    "TEXT" => "text",
                    other => panic!("{t}.{name}: unexpected SQLite type {other}"),
                };
                // PostgreSQL makes every primary key column NOT NULL.
                Ok((name, ty.to_string(), notnull || pk > 0))
            })
            .expect("columns")
            .collect::<Result<Vec<_>, _>>()
            .expect("columns");
        shape.insert(t, cols);
    }
    let _ = std::fs::remove_dir_all(&dir);
    shape
}

#[test]
fn the_postgres_schema_has_every_table_and_column_of_the_sqlite_one() {
    let url = Postgres::shared().database();
    let applied = migrate(&url).expect("migrate");
    assert_eq!(applied, (1..=applied.len() as i64).collect::<Vec<_>>());
    assert!(applied.len() >= 6, "{applied:?}");
    assert_eq!(
        migrate(&url).expect("migrate again"),
        Vec::<i64>::new(),
        "a second start applies nothing"
    );
    let pg = postgres_shape(&url);
    let lite = sqlite_shape();
    assert_eq!(
        pg.keys().collect::<Vec<_>>(),
        lite.keys().collect::<Vec<_>>(),
        "tables"
    );
    for (table, cols) in &lite {
        assert_eq!(&pg[table], cols, "columns of {table}");
    }
}

#[test]
fn the_postgres_schema_keeps_the_rules_the_engine_relies_on() {
    let url = Postgres::shared().database();
    let mut c = postgres_client(&url).expect("connect");
    migrate(&url).expect("migrate");
    let run = |id: &str, status: &str, fp: &str| {
        format!(
            "INSERT INTO pipeline_runs (id, pipeline_name, status, source, stage, triggered_at, \
             config_fingerprint, dedup_fingerprint, context_json, payload_json) VALUES \
             ('{id}', 'p', '{status}', 'generic', 'production', 1764633600000, 'f', '{fp}', '{{}}', '{{}}')"
        )
    };
    // Milliseconds since 1970 fit (a 32-bit INTEGER would not).
    c.batch_execute(&run("r1", "running", "x")).expect("a run");
    // A status word outside the list is refused, as in SQLite.
    let code = |e: postgres::Error| e.as_db_error().map(|d| d.code().clone());
    let bad = c
        .batch_execute(&run("r2", "runing", "y"))
        .expect_err("a typo");
    assert_eq!(code(bad), Some(postgres::error::SqlState::CHECK_VIOLATION));
    // At most one running run per pipeline and dedup fingerprint.
    let dup = c
        .batch_execute(&run("r3", "running", "x"))
        .expect_err("a duplicate");
    assert_eq!(code(dup), Some(postgres::error::SqlState::UNIQUE_VIOLATION));
    c.batch_execute(&run("r4", "completed", "x"))
        .expect("a finished one may share it");
    // The run log numbers its events itself.
    for _ in 0..2 {
        c.batch_execute(
            "INSERT INTO run_events (run_id, ts, level, event, msg, fields_json) \
             VALUES ('r1', 1, 'INFO', 'run_started', 'm', '{}')",
        )
        .expect("an event");
    }
    let ids: Vec<i64> = c
        .query("SELECT id FROM run_events ORDER BY id", &[])
        .expect("ids")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(ids[0] < ids[1], "{ids:?}");
}

#[test]
fn replicas_starting_at_once_apply_each_migration_once() {
    let url = Postgres::shared().database();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || migrate(&url).expect("migrate"))
        })
        .collect();
    let mut all: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("thread"))
        .collect();
    all.sort();
    let n = all.len() as i64;
    assert_eq!(
        all,
        (1..=n).collect::<Vec<_>>(),
        "each version once, by someone"
    );
    let mut c = postgres_client(&url).expect("connect");
    let recorded: i64 = c
        .query_one("SELECT COUNT(*) FROM schema_migrations", &[])
        .expect("count")
        .get(0);
    assert_eq!(recorded, n);
}

#[test]
fn a_database_migrated_by_a_newer_build_is_refused() {
    let url = Postgres::shared().database();
    let mut c = postgres_client(&url).expect("connect");
    migrate(&url).expect("migrate");
    c.batch_execute("INSERT INTO schema_migrations (version, applied_at) VALUES (999, 0)")
        .expect("a future version");
    let e = migrate(&url).expect_err("refused");
    assert!(e.to_string().contains("schema version 999"), "{e}");
}

#[test]
fn a_server_stopped_at_once_comes_back_with_what_was_committed() {
    let pg = Postgres::start();
    let url = pg.database();
    let mut c = postgres_client(&url).expect("connect");
    migrate(&url).expect("migrate");
    c.batch_execute("INSERT INTO kv (key, value) VALUES ('k', 'v')")
        .expect("commit");
    drop(c);
    pg.stop_immediate();
    assert!(postgres_client(&url).is_err(), "the server is down");
    pg.restart();
    let mut c = postgres_client(&url).expect("reconnect");
    let v: String = c
        .query_one("SELECT value FROM kv WHERE key = 'k'", &[])
        .expect("read")
        .get(0);
    assert_eq!(v, "v");
}
