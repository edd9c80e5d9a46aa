//! `GET /runs/{id}/events`: the run log as Server-Sent Events (SPEC 2, 12).
//!
//! Every event carries its `run_events` id as `id:`, so a client that reconnects
//! with `Last-Event-ID` (or asks `?after=ID`) gets exactly what it missed. The
//! stream reads the store, not the engine's memory: it follows a run whichever
//! process or replica drives it. It reads again when this process commits to
//! the run's log (`Store::watch_run`: other runs' commits do not wake it; at
//! most every [`MIN_INTERVAL`], so one read carries a busy run's commits), and
//! at least every [`FOREIGN_POLL`] for writers it cannot see (another replica, a
//! `vectorstep run`). When the run is no longer `running` and its log has stayed
//! read to the end for [`FOREIGN_POLL`] (a notification's outcome is logged just
//! after the run's last commit), an `end` event closes the stream.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, Stream, StreamExt};

use super::{ApiError, AppState};
use crate::domain::RunStatus;

const FOREIGN_POLL: Duration = Duration::from_secs(1);
/// The shortest time between two reads of a follower woken by its run: a busy
/// run commits several times per step, and one read then carries them all.
const MIN_INTERVAL: Duration = Duration::from_millis(200);
/// Events read at once; a long log arrives in several reads.
const BATCH: u32 = 500;
/// How many followers read the store at once. One commit wakes every follower
/// of the runs it touched; unbounded, a hundred of them would each take a
/// blocking thread and a reader connection (the pool keeps a few, the rest are
/// opened and closed again), which cost more than the reads. Queued followers
/// wait their turn on a warm connection instead; pages and the API keep the
/// rest of the pool.
pub(super) const STREAM_READS: usize = 2;

/// Where a (re)connecting client resumes: `Last-Event-ID` wins over `?after=`.
pub fn resume_after(headers: &HeaderMap, query: &HashMap<String, String>) -> i64 {
    headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .or_else(|| query.get("after").and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
        .max(0)
}

struct Follow {
    state: Arc<AppState>,
    run_id: String,
    after: i64,
    watch: crate::store::RunWatch,
    /// Since when the run has been finished with nothing left to send.
    finished_quiet: Option<Instant>,
    last_read: Instant,
    done: bool,
}

impl Follow {
    /// Until this process commits to the run's log, or the poll is due; never
    /// sooner than [`MIN_INTERVAL`] after the last read.
    async fn wait(&mut self) {
        tokio::select! {
            _ = self.watch.changed() => {}
            _ = tokio::time::sleep(FOREIGN_POLL) => {}
        }
        let since = self.last_read.elapsed();
        if since < MIN_INTERVAL {
            tokio::time::sleep(MIN_INTERVAL - since).await;
        }
    }

    /// Waits until there may be something new, then reads it. `None` ends the
    /// stream.
    async fn next_batch(&mut self) -> Option<Vec<SseEvent>> {
        loop {
            if self.done || !self.state.accepting.load(Ordering::SeqCst) {
                return None;
            }
            let state = Arc::clone(&self.state);
            let Ok(turn) = state.stream_reads.acquire().await else {
                return None;
            };
            self.last_read = Instant::now();
            let store = state.engine.store.clone();
            let (id, after) = (self.run_id.clone(), self.after);
            // The status is read after the events: a run that finished has its
            // last events committed with its status, so nothing can follow.
            let read = tokio::task::spawn_blocking(move || {
                store.events_after_and_status(&id, after, BATCH)
            })
            .await;
            drop(turn);
            let (events, status) = match read {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    tracing::warn!(run_id = %self.run_id, error = %e, "The events stream could not read the store; retrying.");
                    tokio::time::sleep(FOREIGN_POLL).await;
                    continue;
                }
                Err(_) => return None,
            };
            if let Some(last) = events.last() {
                self.after = last.id;
                self.finished_quiet = None;
                let out = events
                    .iter()
                    .map(|e| {
                        SseEvent::default()
                            .id(e.id.to_string())
                            .data(crate::view::log_entry_json(e))
                    })
                    .collect();
                return Some(out);
            }
            if status != Some(RunStatus::Running) {
                let quiet = *self.finished_quiet.get_or_insert_with(Instant::now);
                if quiet.elapsed() >= FOREIGN_POLL {
                    self.done = true;
                    return Some(vec![SseEvent::default().event("end").data(
                        serde_json::json!({"status": status.map(|s| s.as_str())}).to_string(),
                    )]);
                }
            }
            self.wait().await;
        }
    }
}

pub async fn stream(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if state.engine.store.run(&id)?.is_none() {
        return Err(ApiError::new(StatusCode::NOT_FOUND, "run not found"));
    }
    let follow = Follow {
        watch: state.engine.store.watch_run(&id),
        after: resume_after(&headers, &q),
        state,
        run_id: id,
        finished_quiet: None,
        last_read: Instant::now(),
        done: false,
    };
    Ok(Sse::new(events(follow))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

fn events(follow: Follow) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    stream::unfold(follow, |mut f| async move {
        let batch = f.next_batch().await?;
        Some((stream::iter(batch.into_iter().map(Ok)), f))
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_event_id_wins_over_the_query() {
        let mut h = HeaderMap::new();
        let mut q = HashMap::new();
        assert_eq!(resume_after(&h, &q), 0);
        q.insert("after".to_string(), "7".to_string());
        assert_eq!(resume_after(&h, &q), 7);
        h.insert("last-event-id", "12".parse().expect("header"));
        assert_eq!(resume_after(&h, &q), 12);
        h.insert("last-event-id", "junk".parse().expect("header"));
        assert_eq!(resume_after(&h, &q), 7);
        q.insert("after".to_string(), "-5".to_string());
        h.remove("last-event-id");
        assert_eq!(resume_after(&h, &q), 0);
    }
}
