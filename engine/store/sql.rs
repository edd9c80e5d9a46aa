//! What the table files bind and read, in the driver's stead: values bound to a
//! statement ([`Bind`]) and columns read back from a row ([`Cols`], [`Column`]).
//! The table files write each statement once, with SQLite's numbered placeholders
//! (`?1`, `?2`, ...) and only SQL PostgreSQL speaks too, so that the PostgreSQL
//! store (being built, see `postgres`) runs the same statements with its own
//! driver underneath.
//!
//! Bound text is borrowed, never copied: a step record's output JSON goes from the
//! record to the driver as it is.

use super::error::{DbError, Error};

/// A value bound to a statement, in the four kinds the schema uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Value<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
    /// An unsigned count past `i64::MAX`: the statement fails with it, so no
    /// impossible total is ever stored (wrapped or clamped).
    TooLarge(u64),
}

/// Anything a table file binds.
pub(super) trait Bind {
    fn value(&self) -> Value<'_>;
}

/// The arguments of one statement.
pub(super) type Args<'a> = &'a [&'a dyn Bind];

impl Bind for i64 {
    fn value(&self) -> Value<'_> {
        Value::Int(*self)
    }
}

impl Bind for u32 {
    fn value(&self) -> Value<'_> {
        Value::Int(i64::from(*self))
    }
}

impl Bind for u64 {
    fn value(&self) -> Value<'_> {
        i64::try_from(*self).map_or(Value::TooLarge(*self), Value::Int)
    }
}

impl Bind for f64 {
    fn value(&self) -> Value<'_> {
        Value::Real(*self)
    }
}

impl Bind for bool {
    fn value(&self) -> Value<'_> {
        Value::Int(i64::from(*self))
    }
}

impl Bind for str {
    fn value(&self) -> Value<'_> {
        Value::Text(self)
    }
}

impl Bind for String {
    fn value(&self) -> Value<'_> {
        Value::Text(self)
    }
}

impl<T: Bind + ?Sized> Bind for &T {
    fn value(&self) -> Value<'_> {
        (**self).value()
    }
}

/// One cell of a row as it is, owned: what `store copy` reads from one store and
/// writes to the other (see `store::copy`), whatever the column.
#[derive(Debug, Clone, PartialEq)]
pub enum CopyValue {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

impl Bind for CopyValue {
    fn value(&self) -> Value<'_> {
        match self {
            CopyValue::Null => Value::Null,
            CopyValue::Int(i) => Value::Int(*i),
            CopyValue::Real(r) => Value::Real(*r),
            CopyValue::Text(t) => Value::Text(t),
        }
    }
}

impl Column for CopyValue {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        Ok(match cell {
            Cell::Null => CopyValue::Null,
            Cell::Int(i) => CopyValue::Int(i),
            Cell::Real(r) => CopyValue::Real(r),
            Cell::Text(t) => CopyValue::Text(t.to_string()),
        })
    }
}

impl<T: Bind> Bind for Option<T> {
    fn value(&self) -> Value<'_> {
        match self {
            Some(v) => v.value(),
            None => Value::Null,
        }
    }
}

/// `args` for rusqlite, borrowed.
pub(super) fn lite(args: Args<'_>) -> impl rusqlite::Params + '_ {
    rusqlite::params_from_iter(args.iter().map(|a| Lite(a.value())))
}

struct Lite<'a>(Value<'a>);

impl rusqlite::ToSql for Lite<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        if let Value::TooLarge(n) = self.0 {
            return Err(rusqlite::Error::ToSqlConversionFailure(
                format!("{n} does not fit a signed 64-bit column").into(),
            ));
        }
        Ok(ToSqlOutput::Borrowed(match self.0 {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(i),
            Value::Real(r) => ValueRef::Real(r),
            Value::Text(t) => ValueRef::Text(t.as_bytes()),
            Value::TooLarge(_) => ValueRef::Null,
        }))
    }
}

/// A column's value as read from a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Cell<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
}

/// A type a column decodes into; the error says what the cell held instead.
pub(super) trait Column: Sized {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String>;
}

fn unexpected(want: &str, cell: Cell<'_>) -> String {
    format!("expected {want}, found {cell:?}")
}

impl Column for i64 {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        match cell {
            Cell::Int(i) => Ok(i),
            c => Err(unexpected("an integer", c)),
        }
    }
}

impl Column for u32 {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        let i = i64::from_cell(cell)?;
        u32::try_from(i).map_err(|_| format!("{i} is out of range for u32"))
    }
}

impl Column for u64 {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        let i = i64::from_cell(cell)?;
        u64::try_from(i).map_err(|_| format!("{i} is out of range for u64"))
    }
}

impl Column for f64 {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        match cell {
            Cell::Real(r) => Ok(r),
            // SQLite stores a whole REAL as an integer when it can.
            Cell::Int(i) => Ok(i as f64),
            c => Err(unexpected("a number", c)),
        }
    }
}

impl Column for bool {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        match cell {
            Cell::Int(0) => Ok(false),
            Cell::Int(1) => Ok(true),
            c => Err(unexpected("0 or 1", c)),
        }
    }
}

impl Column for String {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        match cell {
            Cell::Text(t) => Ok(t.to_string()),
            c => Err(unexpected("text", c)),
        }
    }
}

impl<T: Column> Column for Option<T> {
    fn from_cell(cell: Cell<'_>) -> Result<Self, String> {
        match cell {
            Cell::Null => Ok(None),
            c => T::from_cell(c).map(Some),
        }
    }
}

/// One row being decoded, with the table it came from for error messages.
pub(super) struct Cols<'a> {
    row: Row<'a>,
    table: &'static str,
}

/// The driver's row.
enum Row<'a> {
    Lite(&'a rusqlite::Row<'a>),
    Pg(&'a tokio_postgres::Row),
}

impl<'a> Cols<'a> {
    pub(super) fn lite(row: &'a rusqlite::Row<'a>, table: &'static str) -> Cols<'a> {
        Cols {
            row: Row::Lite(row),
            table,
        }
    }

    pub(super) fn pg(row: &'a tokio_postgres::Row, table: &'static str) -> Cols<'a> {
        Cols {
            row: Row::Pg(row),
            table,
        }
    }

    /// Column `column` of the row; a missing column or a value of the wrong kind is
    /// [`Error::Corrupt`], never a panic.
    pub(super) fn get<T: Column>(&self, column: &'static str) -> Result<T, Error> {
        let corrupt = |detail: String| Error::Corrupt {
            table: self.table,
            column,
            detail,
        };
        match self.row {
            Row::Lite(r) => {
                use rusqlite::types::ValueRef;
                let v = r.get_ref(column).map_err(|e| corrupt(e.to_string()))?;
                let cell = match v {
                    ValueRef::Null => Cell::Null,
                    ValueRef::Integer(i) => Cell::Int(i),
                    ValueRef::Real(f) => Cell::Real(f),
                    ValueRef::Text(t) => {
                        Cell::Text(std::str::from_utf8(t).map_err(|e| corrupt(e.to_string()))?)
                    }
                    ValueRef::Blob(_) => return Err(corrupt("a blob".into())),
                };
                T::from_cell(cell).map_err(corrupt)
            }
            Row::Pg(r) => pg_cell(r, column, |cell| T::from_cell(cell)).map_err(corrupt),
        }
    }

    /// A column holding one of the words of `T` (a status, a kind).
    pub(super) fn word<T: crate::domain::Word>(&self, column: &'static str) -> Result<T, Error> {
        let text: String = self.get(column)?;
        crate::domain::parse_word(&text).map_err(|e| Error::Corrupt {
            table: self.table,
            column,
            detail: e.to_string(),
        })
    }
}

/// Reads a PostgreSQL column by its type (BIGINT, INTEGER, DOUBLE PRECISION, TEXT,
/// BOOLEAN: what the translated schema and our queries produce).
fn pg_cell<T>(
    row: &tokio_postgres::Row,
    column: &str,
    decode: impl FnOnce(Cell<'_>) -> Result<T, String>,
) -> Result<T, String> {
    use tokio_postgres::types::Type;
    let idx = row
        .columns()
        .iter()
        .position(|c| c.name() == column)
        .ok_or_else(|| format!("no column {column} in the row"))?;
    let ty = row.columns()[idx].type_().clone();
    let e = |e: tokio_postgres::Error| e.to_string();
    let cell = if ty == Type::INT8 {
        row.try_get::<_, Option<i64>>(idx)
            .map_err(e)?
            .map_or(Cell::Null, Cell::Int)
    } else if ty == Type::INT4 {
        row.try_get::<_, Option<i32>>(idx)
            .map_err(e)?
            .map_or(Cell::Null, |i| Cell::Int(i64::from(i)))
    } else if ty == Type::INT2 {
        row.try_get::<_, Option<i16>>(idx)
            .map_err(e)?
            .map_or(Cell::Null, |i| Cell::Int(i64::from(i)))
    } else if ty == Type::FLOAT8 {
        row.try_get::<_, Option<f64>>(idx)
            .map_err(e)?
            .map_or(Cell::Null, Cell::Real)
    } else if ty == Type::BOOL {
        row.try_get::<_, Option<bool>>(idx)
            .map_err(e)?
            .map_or(Cell::Null, |b| Cell::Int(i64::from(b)))
    } else if ty == Type::TEXT || ty == Type::VARCHAR {
        let text: Option<&str> = row.try_get(idx).map_err(e)?;
        return decode(text.map_or(Cell::Null, Cell::Text));
    } else {
        return Err(format!(
            "column {column} has type {ty}, which the store never uses"
        ));
    };
    decode(cell)
}

/// SQLite's numbered placeholders (`?1`) respelled for PostgreSQL (`$1`), outside
/// quoted strings. Statements are written once, in SQLite's spelling.
pub(super) fn for_postgres(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quoted = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted && chars.peek().is_some_and(char::is_ascii_digit) => out.push('$'),
            _ => out.push(c),
        }
    }
    out
}

/// `args` for the PostgreSQL driver, borrowed.
pub(super) fn pg_args<'a>(args: Args<'a>) -> Vec<PgArg<'a>> {
    args.iter().map(|a| PgArg(a.value())).collect()
}

/// One value bound for PostgreSQL: integers go as the column's width (the schema's
/// are BIGINT; an INTEGER is narrowed only when it fits), text and NULL as given.
#[derive(Debug)]
pub(super) struct PgArg<'a>(Value<'a>);

impl tokio_postgres::types::ToSql for PgArg<'_> {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut tokio_postgres::types::private::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use tokio_postgres::types::{IsNull, Type};
        match self.0 {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) if *ty == Type::INT4 => i32::try_from(i)?.to_sql(ty, out),
            Value::Int(i) if *ty == Type::FLOAT8 => (i as f64).to_sql(ty, out),
            Value::Int(i) => i.to_sql(ty, out),
            Value::Real(r) => r.to_sql(ty, out),
            Value::Text(t) => t.to_sql(ty, out),
            Value::TooLarge(n) => Err(format!("{n} does not fit a signed 64-bit column").into()),
        }
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// What a write needs of a connection inside the writer's transaction: run one
/// statement, or read the first row of a query. Both backends' writers implement it,
/// so each write is written once (see the table files).
pub(super) trait Db {
    /// Runs `sql`; how many rows it changed.
    fn exec(&self, sql: &str, args: Args<'_>) -> Result<usize, DbError>;

    /// The first row of `sql` decoded by `decode`, or `None` when there is none.
    fn first<T>(
        &self,
        table: &'static str,
        sql: &str,
        args: Args<'_>,
        decode: impl FnOnce(&Cols) -> Result<T, Error>,
    ) -> Result<Option<T>, DbError>;

    /// Every row of `sql`, each decoded by `decode`.
    fn all<T>(
        &self,
        table: &'static str,
        sql: &str,
        args: Args<'_>,
        decode: impl Fn(&Cols) -> Result<T, Error>,
    ) -> Result<Vec<T>, DbError>;

    /// The SQL expression for the database's clock in unix milliseconds, spliced
    /// into statements whose times must not come from a replica's own (possibly
    /// skewed) clock: leases, heartbeats (see `replicas`).
    fn now_ms_sql(&self) -> &'static str;

    /// Whether the statements run on PostgreSQL, for the few that must be spelled
    /// differently there (keeping a generated key when copying a store).
    fn is_postgres(&self) -> bool;
}

/// [`Db::now_ms_sql`] on SQLite (3.42+ for `subsec`; the bundled SQLite is newer).
pub(super) const SQLITE_NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// [`Db::now_ms_sql`] on PostgreSQL: `clock_timestamp()`, not `now()`, which is
/// frozen at the start of the transaction and a group may stay open a while.
pub(super) const POSTGRES_NOW_MS: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";

impl Db for rusqlite::Connection {
    fn now_ms_sql(&self) -> &'static str {
        SQLITE_NOW_MS
    }

    fn is_postgres(&self) -> bool {
        false
    }

    fn exec(&self, sql: &str, args: Args<'_>) -> Result<usize, DbError> {
        // Cached: most statements run for every step record, thousands a second.
        Ok(self.prepare_cached(sql)?.execute(lite(args))?)
    }

    fn first<T>(
        &self,
        table: &'static str,
        sql: &str,
        args: Args<'_>,
        decode: impl FnOnce(&Cols) -> Result<T, Error>,
    ) -> Result<Option<T>, DbError> {
        let mut stmt = self.prepare_cached(sql)?;
        let mut rows = stmt.query(lite(args))?;
        match rows.next()? {
            Some(row) => decode(&Cols::lite(row, table))
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
        let mut stmt = self.prepare_cached(sql)?;
        let mut rows = stmt.query(lite(args))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(decode(&Cols::lite(row, table)).map_err(|e| DbError::Row(Box::new(e)))?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_respelled_outside_strings_only() {
        let check = |sql: &str, want: &str| assert_eq!(for_postgres(sql), want, "{sql}");
        check("a = ?1 AND b = ?12", "a = $1 AND b = $12");
        check("a = '?1' AND b = ?2", "a = '?1' AND b = $2");
        check("x LIKE 'it''s ?3' OR y = ?4", "x LIKE 'it''s ?3' OR y = $4");
        check("a = ? ", "a = ? ");
    }

    #[test]
    fn values_bind_as_their_kind_and_none_as_null() {
        let args: [&dyn Bind; 7] = [
            &7_i64,
            &7_u32,
            &u64::MAX,
            &0.5_f64,
            &true,
            &"t",
            &None::<String>,
        ];
        let got: Vec<Value> = args.iter().map(|a| a.value()).collect();
        assert_eq!(
            got,
            [
                Value::Int(7),
                Value::Int(7),
                Value::TooLarge(u64::MAX),
                Value::Real(0.5),
                Value::Int(1),
                Value::Text("t"),
                Value::Null
            ]
        );
    }

    #[test]
    fn cells_decode_or_say_what_they_held() {
        assert_eq!(u32::from_cell(Cell::Int(3)), Ok(3));
        assert!(u32::from_cell(Cell::Int(-1)).is_err());
        assert_eq!(f64::from_cell(Cell::Int(2)), Ok(2.0));
        assert_eq!(Option::<String>::from_cell(Cell::Null), Ok(None));
        assert_eq!(
            Option::<String>::from_cell(Cell::Text("x")),
            Ok(Some("x".into()))
        );
        let e = String::from_cell(Cell::Int(1)).expect_err("not text");
        assert!(e.contains("expected text"), "{e}");
        assert!(i64::from_cell(Cell::Null).is_err());
    }

    #[test]
    fn a_row_round_trips_through_sqlite_with_borrowed_binds() {
        let conn = rusqlite::Connection::open_in_memory().expect("open");
        conn.execute_batch("CREATE TABLE t (a INTEGER, b REAL, c TEXT, d TEXT)")
            .expect("create");
        let text = String::from("borrowed");
        let none: Option<&str> = None;
        let args: [&dyn Bind; 4] = [&5_u64, &1.5_f64, &text, &none];
        conn.execute("INSERT INTO t VALUES (?1, ?2, ?3, ?4)", lite(&args))
            .expect("insert");
        let mut stmt = conn.prepare("SELECT a, b, c, d FROM t").expect("select");
        let mut rows = stmt.query([]).expect("query");
        let row = rows.next().expect("next").expect("a row");
        let c = Cols::lite(row, "t");
        assert_eq!(c.get::<u64>("a").expect("a"), 5);
        assert_eq!(c.get::<f64>("b").expect("b"), 1.5);
        assert_eq!(c.get::<String>("c").expect("c"), "borrowed");
        assert_eq!(c.get::<Option<String>>("d").expect("d"), None);
        let e = c.get::<u64>("c").expect_err("text is not a number");
        assert!(
            e.to_string().contains("t.c") || e.to_string().contains('c'),
            "{e}"
        );
        assert!(
            c.get::<i64>("nope").is_err(),
            "a missing column is an error"
        );
    }
}
