//! The PostgreSQL schema: the SQLite migrations of `store::migrations`, each
//! translated by [`translate`], applied under the same version numbers. One list of
//! migrations is the schema of both backends, so they cannot drift apart
//! (`tests/postgres_schema.rs` compares the two, table by table and column by column).
//!
//! The translation is small because the SQL is kept to what both speak (`ON CONFLICT`,
//! partial indexes, CHECK constraints, `ALTER TABLE ... ADD COLUMN`): what differs is
//! the width of types (SQLite's INTEGER is 64-bit, PostgreSQL's is 32: milliseconds
//! since 1970 need BIGINT; REAL is a double in SQLite, a float in PostgreSQL) and the
//! events table's generated key.

use super::conn::PgConn;
use super::PgError;

/// SQLite DDL rewritten for PostgreSQL. Pure: words are replaced whole, never
/// inside another word (`INTEGER` but not `INTEGERS`), a quoted string (`'REAL'`
/// stays a value) or a `--` comment.
pub fn translate(sql: &str) -> String {
    let sql = sql.replace(
        "INTEGER PRIMARY KEY AUTOINCREMENT",
        "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    );
    let mut out = String::with_capacity(sql.len() + 64);
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        out.push_str(match word.as_str() {
            "INTEGER" => "BIGINT",
            "REAL" => "DOUBLE PRECISION",
            w => w,
        });
        word.clear();
    };
    // Where the scanner is: in SQL, in a 'string', or in a -- comment (to the end of
    // its line; an apostrophe there opens no string).
    #[derive(PartialEq)]
    enum At {
        Sql,
        Quoted,
        Comment,
    }
    let mut at = At::Sql;
    let mut chars = sql.chars().peekable();
    while let Some(ch) = chars.next() {
        match at {
            At::Sql if ch.is_ascii_alphanumeric() || ch == '_' => {
                word.push(ch);
                continue;
            }
            At::Sql if ch == '\'' => at = At::Quoted,
            At::Sql if ch == '-' && chars.peek() == Some(&'-') => at = At::Comment,
            At::Quoted if ch == '\'' => at = At::Sql,
            At::Comment if ch == '\n' => at = At::Sql,
            _ => {}
        }
        flush(&mut word, &mut out);
        out.push(ch);
    }
    flush(&mut word, &mut out);
    out
}

/// The key of the advisory lock that serialises migrations across replicas
/// starting at once ("vectorstep" in ASCII, folded into 63 bits).
const MIGRATION_LOCK: i64 = 0x7665_6374_6f72_7374;

/// Applies every migration the database has not recorded yet; returns the versions
/// applied. Each runs in its own transaction with its record, so a crash
/// mid-migration leaves the previous version intact; the whole pass holds a session
/// advisory lock, so two replicas starting at once apply each version once (the
/// second finds them recorded).
pub(crate) fn apply(conn: &PgConn) -> Result<Vec<i64>, PgError> {
    apply_list(conn, super::super::migrations::MIGRATIONS)
}

pub(crate) fn apply_list(
    conn: &PgConn,
    migrations: &'static [(&'static str, &'static str)],
) -> Result<Vec<i64>, PgError> {
    conn.execute_raw("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])?;
    let result = apply_locked(conn, migrations);
    // Released on every path; a dropped connection releases it too.
    let unlocked = conn.execute_raw("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]);
    let applied = result?;
    unlocked?;
    Ok(applied)
}

fn apply_locked(
    conn: &PgConn,
    migrations: &'static [(&'static str, &'static str)],
) -> Result<Vec<i64>, PgError> {
    conn.batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    BIGINT PRIMARY KEY,
             applied_at BIGINT
         )",
    )?;
    let known = i64::try_from(migrations.len()).unwrap_or(i64::MAX);
    let newest: Option<i64> = conn
        .query_raw("SELECT MAX(version) FROM schema_migrations", &[])?
        .first()
        .and_then(|row| row.get(0));
    if let Some(found) = newest.filter(|v| *v > known) {
        return Err(PgError::SchemaTooNew { found, known });
    }
    let mut applied = Vec::new();
    for (version, (name, sql)) in (1_i64..).zip(migrations.iter()) {
        conn.batch("BEGIN")?;
        match apply_one(conn, version, name, sql) {
            Ok(true) => {
                conn.batch("COMMIT")?;
                tracing::info!(version, name = *name, "PostgreSQL migration applied.");
                applied.push(version);
            }
            Ok(false) => conn.batch("ROLLBACK")?,
            Err(e) => {
                let _ = conn.batch("ROLLBACK");
                return Err(e);
            }
        }
    }
    Ok(applied)
}

/// Applies one migration inside the caller's transaction unless it is recorded;
/// whether it applied it.
fn apply_one(conn: &PgConn, version: i64, name: &'static str, sql: &str) -> Result<bool, PgError> {
    let done = !conn
        .query_raw(
            "SELECT 1 FROM schema_migrations WHERE version = $1",
            &[&version],
        )?
        .is_empty();
    if done {
        return Ok(false);
    }
    conn.batch(&translate(sql))
        .map_err(|source| PgError::Migration {
            version,
            name,
            source,
        })?;
    let now = super::super::connection::now_ms();
    conn.execute_raw(
        "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
        &[&version, &now],
    )?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::translate;

    #[test]
    fn types_are_widened_and_nothing_else_changes() {
        let check = |sql: &str, want: &str| assert_eq!(translate(sql), want, "{sql}");
        check("a INTEGER NOT NULL,", "a BIGINT NOT NULL,");
        check("c REAL,", "c DOUBLE PRECISION,");
        check(
            "id INTEGER PRIMARY KEY AUTOINCREMENT,",
            "id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,",
        );
        // Whole words only, in identifiers and in text alike.
        check("INTEGERS REALLY x_INTEGER", "INTEGERS REALLY x_INTEGER");
        // Comments are kept as they are, apostrophes included.
        check(
            "-- SQLite's REAL\nb REAL,",
            "-- SQLite's REAL\nb DOUBLE PRECISION,",
        );
        check(
            "CREATE INDEX i ON t (a) WHERE status = 'running';",
            "CREATE INDEX i ON t (a) WHERE status = 'running';",
        );
        check(
            "CHECK (kind IN ('REAL', 'x'))",
            "CHECK (kind IN ('REAL', 'x'))",
        );
        check("", "");
    }

    #[test]
    fn every_shipped_migration_translates_to_bigint_and_double_only() {
        for (name, sql) in super::super::super::migrations::MIGRATIONS {
            let pg = translate(sql);
            for word in pg.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                assert!(
                    !matches!(word, "INTEGER" | "REAL" | "AUTOINCREMENT"),
                    "{name}: `{word}` left in {pg}"
                );
            }
        }
    }
}
