//! Reads of `pipeline_runs` and `run_events` for the operator web UI: the runs
//! list as keyset pages (a page costs the same with 100 runs or 100,000 in the
//! store: it walks `ix_pipeline_runs_triggered_at` from the cursor and stops after
//! `limit` rows), counts by status, a pipeline's recent runs, and the run log after
//! a given event id (the events stream).

use super::connection::{query_all, query_opt, Cols};
use super::events::EventRecord;
use super::runs::{RunRecord, COLUMNS};
use super::sql::Bind;
use super::{Error, Store};
use crate::domain::{RunStatus, UnixMillis};

const EVENTS_AFTER: &str = "SELECT id, run_id, ts, level, event, msg, fields_json FROM run_events \
     WHERE run_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3";

/// Where a page of the runs list starts: after the run `(triggered_at, id)`, in
/// the list's order (newest first, then id descending).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCursor {
    pub triggered_at: UnixMillis,
    pub id: String,
}

impl RunCursor {
    /// `"<triggered_at>~<id>"`, as it travels in a URL.
    pub fn encode(&self) -> String {
        format!("{}~{}", self.triggered_at, self.id)
    }

    /// `None` for anything that is not a cursor this module wrote.
    pub fn parse(s: &str) -> Option<RunCursor> {
        let (at, id) = s.split_once('~')?;
        let triggered_at = at.parse().ok()?;
        (!id.is_empty() && id.len() <= 100).then(|| RunCursor {
            triggered_at,
            id: id.to_string(),
        })
    }
}

/// The runs list's filters. Empty fields do not filter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunQuery {
    pub status: Option<String>,
    pub pipeline: Option<String>,
    pub team: Option<String>,
    /// Runs triggered at or after this time.
    pub since: Option<UnixMillis>,
    /// Runs triggered before this time.
    pub until: Option<UnixMillis>,
    /// A run id (or its beginning), or a text found in the run's trigger (label
    /// and annotation values, the summary).
    pub search: Option<String>,
    pub after: Option<RunCursor>,
    /// At least 1.
    pub limit: u32,
}

/// Adds `sql` to `conditions` with each `#` made a placeholder numbered after the arguments bound
/// so far (PostgreSQL refuses a parameter it never uses, so only conditions in
/// use are bound).
fn bind<'a>(
    conditions: &mut Vec<String>,
    args: &mut Vec<&'a dyn Bind>,
    sql: &str,
    values: Vec<&'a dyn Bind>,
) {
    let mut sql = sql.to_string();
    for v in values {
        args.push(v);
        sql = sql.replacen('#', &format!("?{}", args.len()), 1);
    }
    conditions.push(sql);
}

/// `%` and `_` of a search text matched as themselves.
fn like_pattern(text: &str) -> String {
    let mut p = String::with_capacity(text.len() + 2);
    p.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

impl Store {
    /// One page of the runs list, newest first; the next page starts after the
    /// last run returned.
    pub fn runs_page(&self, q: &RunQuery) -> Result<Vec<RunRecord>, Error> {
        let mut conditions: Vec<String> = Vec::new();
        let mut args: Vec<&dyn Bind> = Vec::new();
        let search = q.search.as_deref().map(str::trim).filter(|s| !s.is_empty());
        let pattern = search.map(like_pattern);
        let id_prefix = search.map(|s| format!("{}%", s.replace(['%', '_', '\\'], "")));
        if let Some(s) = &q.status {
            bind(&mut conditions, &mut args, "status = #", vec![s]);
        }
        if let Some(p) = &q.pipeline {
            bind(&mut conditions, &mut args, "pipeline_name = #", vec![p]);
        }
        if let Some(t) = &q.team {
            bind(&mut conditions, &mut args, "team = #", vec![t]);
        }
        if let Some(since) = &q.since {
            bind(&mut conditions, &mut args, "triggered_at >= #", vec![since]);
        }
        if let Some(until) = &q.until {
            bind(&mut conditions, &mut args, "triggered_at < #", vec![until]);
        }
        if let (Some(pattern), Some(prefix)) = (&pattern, &id_prefix) {
            bind(
                &mut conditions,
                &mut args,
                "(id LIKE # OR context_json LIKE # ESCAPE '\\')",
                vec![prefix, pattern],
            );
        }
        if let Some(c) = &q.after {
            bind(
                &mut conditions,
                &mut args,
                "(triggered_at < # OR (triggered_at = # AND id < #))",
                vec![&c.triggered_at, &c.triggered_at, &c.id],
            );
        }
        let limit = i64::from(q.limit.max(1));
        args.push(&limit);
        let where_clause = if conditions.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conditions.join(" AND "))
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM pipeline_runs {where_clause} \
             ORDER BY triggered_at DESC, id DESC LIMIT ?{}",
            args.len()
        );
        self.read(|conn| query_all(conn, "pipeline_runs", &sql, &args, RunRecord::decode))
    }

    /// The runs that replay `run_id`, oldest first.
    pub fn replays_of(&self, run_id: &str) -> Result<Vec<RunRecord>, Error> {
        let sql = format!(
            "SELECT {COLUMNS} FROM pipeline_runs WHERE replay_of = ?1 ORDER BY triggered_at, id"
        );
        self.read(|conn| query_all(conn, "pipeline_runs", &sql, &[&run_id], RunRecord::decode))
    }

    /// How many runs have each status, over the whole store (`(status, count)`,
    /// statuses without runs left out). Its cost grows with the store: call it
    /// off the request path (the UI caches it).
    pub fn count_runs_by_status(&self) -> Result<Vec<(String, u64)>, Error> {
        self.read(|conn| {
            query_all(
                conn,
                "pipeline_runs",
                "SELECT status, COUNT(*) AS n FROM pipeline_runs GROUP BY status ORDER BY status",
                &[],
                |c: &Cols| Ok((c.get("status")?, c.get("n")?)),
            )
        })
    }

    /// A run's log entries after the event `after_id` (0: from the start), in
    /// write order, at most `limit`.
    pub fn events_after(
        &self,
        run_id: &str,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<EventRecord>, Error> {
        let limit = i64::from(limit.max(1));
        self.read(|conn| {
            query_all(
                conn,
                "run_events",
                EVENTS_AFTER,
                &[&run_id, &after_id, &limit],
                EventRecord::decode,
            )
        })
    }

    /// [`Store::events_after`], then the run's status (`None`: no such run),
    /// read after the events on the same connection: one look of the events
    /// stream. The status column only, not the whole row.
    pub fn events_after_and_status(
        &self,
        run_id: &str,
        after_id: i64,
        limit: u32,
    ) -> Result<(Vec<EventRecord>, Option<RunStatus>), Error> {
        let limit = i64::from(limit.max(1));
        self.read(|conn| {
            let events = query_all(
                conn,
                "run_events",
                EVENTS_AFTER,
                &[&run_id, &after_id, &limit],
                EventRecord::decode,
            )?;
            let status = query_opt(
                conn,
                "pipeline_runs",
                "SELECT status FROM pipeline_runs WHERE id = ?1",
                &[&run_id],
                |c: &Cols| c.word("status"),
            )?;
            Ok((events, status))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_what_they_did_not_write() {
        let c = RunCursor {
            triggered_at: 1_700_000_000_123,
            id: "0190-abc".into(),
        };
        assert_eq!(RunCursor::parse(&c.encode()), Some(c));
        for bad in [
            "",
            "~",
            "12~",
            "x~id",
            "12",
            &format!("1~{}", "a".repeat(101)),
        ] {
            assert_eq!(RunCursor::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn search_text_is_matched_literally() {
        assert_eq!(like_pattern("db"), "%db%");
        assert_eq!(like_pattern("50%_x\\"), "%50\\%\\_x\\\\%");
    }
}
