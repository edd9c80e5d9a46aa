//! Opening, migrating and reopening.

use super::*;
use crate::store::migrations::{apply_list, MIGRATIONS};
use crate::store::Error;

fn applied(path: &Path) -> Vec<(i64, Option<i64>)> {
    let conn = raw(path);
    let mut stmt = conn
        .prepare("SELECT version, applied_at FROM schema_migrations ORDER BY version")
        .expect("prepare");
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query");
    rows.collect::<Result<_, _>>().expect("rows")
}

#[test]
fn reopening_applies_nothing_twice_and_keeps_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The parent directories do not exist yet: open creates them.
    let path = dir.path().join("nested/deeper/state.db");
    let store = Store::open(&path).expect("first open");
    commit(&store, vec![Write::InsertRun(run("r1"))]);
    drop(store);
    let first = applied(&path);
    assert_eq!(first.len(), MIGRATIONS.len());
    assert_eq!(first[0].0, 1);
    assert!(first[0].1.is_some_and(|at| at > 0));

    let store = Store::open(&path).expect("second open");
    assert_eq!(applied(&path), first, "no migration ran again");
    assert_eq!(store.run("r1").unwrap().map(|r| r.id), Some("r1".into()));
}

#[test]
fn the_file_is_in_wal_mode() {
    let (dir, _store) = open_temp();
    let mode: String = raw(&dir.path().join("state.db"))
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("pragma");
    assert_eq!(mode, "wal");
}

#[test]
fn a_database_from_a_newer_build_is_refused() {
    let (dir, store) = open_temp();
    drop(store);
    let path = dir.path().join("state.db");
    let newer = MIGRATIONS.len() as i64 + 1;
    raw(&path)
        .execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, 0)",
            [newer],
        )
        .expect("raw insert");
    match Store::open(&path) {
        Err(Error::SchemaTooNew { found, known }) => {
            assert_eq!((found, known), (newer, MIGRATIONS.len() as i64));
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

#[test]
fn a_failing_migration_leaves_the_earlier_ones_applied_and_itself_undone() {
    const LIST: &[(&str, &str)] = &[
        ("0001_a", "CREATE TABLE a (x INTEGER);"),
        (
            "0002_b",
            "CREATE TABLE b (x INTEGER); INSERT INTO missing VALUES (1);",
        ),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.db");
    let mut conn = raw(&path);
    match apply_list(&mut conn, LIST) {
        Err(Error::Migration { version, name, .. }) => assert_eq!((version, name), (2, "0002_b")),
        other => panic!("expected a migration error, got {other:?}"),
    }
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE name IN ('a', 'b') ORDER BY name")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("tables");
    assert_eq!(tables, ["a"]);
    assert_eq!(
        applied(&path)
            .into_iter()
            .map(|(v, _)| v)
            .collect::<Vec<_>>(),
        [1]
    );
}

#[test]
fn the_commit_probe_measures_and_cleans_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let elapsed = crate::store::raw_commit_probe(dir.path(), 5).expect("probe");
    assert!(elapsed > std::time::Duration::ZERO);
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("read_dir").collect();
    assert!(left.is_empty(), "probe left files behind: {left:?}");
}
