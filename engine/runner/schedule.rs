//! Cron schedules: pipelines with `schedule.cron` fire on time with source
//! `scheduler`. Times are UTC.
//!
//! Each schedule's next due tick is kept in the store (`schedule_ticks`), and a
//! tick fires only through a compare-and-set of that row from the tick to the
//! next one (`Write::AdvanceSchedule`), committed in the same batch as the tick's
//! run (`Engine::create_tick_run`): of several replicas waking for the same tick,
//! exactly one advances it and so records the run; the others see it raced,
//! write nothing, and wait for the next. A crash can lose neither half alone. A
//! tick missed while every process was down fires once at the next start (the
//! row still names it), not once per missed tick: the fire advances to the first
//! tick after now. The run's id is derived from (pipeline, tick) by
//! [`tick_run_id`], and its trigger carries the tick (`scheduled_for`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Engine;
use crate::pipeline::Pipeline;
use crate::run::context::Normalised;
use crate::store::Write;

/// Where an older build kept a schedule's last fire; read once, when a schedule
/// has no tick row yet, so a tick it missed still fires after an upgrade.
fn legacy_kv_key(pipeline: &str) -> String {
    format!("schedule:last_fire:{pipeline}")
}

/// How long a scheduler waits before reading its schedule again after the store
/// failed to answer.
const RETRY: Duration = Duration::from_secs(1);

/// The next tick strictly after `after`.
pub fn next_tick(cron: &str, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let c = croner::Cron::new(cron)
        .with_seconds_optional()
        .parse()
        .ok()?;
    c.find_next_occurrence(&after, false).ok()
}

/// The id of the run of tick `due` (unix ms) of `pipeline`: a version 7 UUID
/// whose time is the tick and whose other bits are a hash of (pipeline, tick), so
/// it sorts with the runs of its time like any other run id and every replica
/// names the tick's run alike.
pub fn tick_run_id(pipeline: &str, due: i64) -> String {
    let hash = blake3::hash(format!("vectorstep tick {pipeline}\0{due}").as_bytes());
    let mut bits = [0u8; 10];
    bits.copy_from_slice(&hash.as_bytes()[..10]);
    let ms = u64::try_from(due).unwrap_or(0);
    uuid::Builder::from_unix_timestamp_millis(ms, &bits)
        .into_uuid()
        .to_string()
}

fn next_ms(cron: &str, after_ms: i64) -> Option<i64> {
    let after = DateTime::<Utc>::from_timestamp_millis(after_ms)?;
    next_tick(cron, after).map(|t| t.timestamp_millis())
}

/// What a scheduler does next about one schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TickPlan {
    /// The schedule has no tick yet: record `next_due_at` (only if still none).
    Init { next_due_at: i64 },
    /// Nothing is due before `until` (unix ms).
    Wait { until: i64 },
    /// Tick `due` is due: advance it to `next_due_at` and, if that wins, fire.
    Fire { due: i64, next_due_at: i64 },
}

/// Decides for schedule `cron` at `now` (unix ms), given its stored next tick and,
/// when it has none, the last fire an older build recorded. `None`: the cron
/// has no tick after now (never fires again).
pub fn plan(
    cron: &str,
    due: Option<i64>,
    legacy_last_fire: Option<i64>,
    now: i64,
) -> Option<TickPlan> {
    match due {
        // From the last fire of an older build: a tick missed since fires once.
        None => Some(TickPlan::Init {
            next_due_at: next_ms(cron, legacy_last_fire.unwrap_or(now))?,
        }),
        Some(due) if due <= now => Some(TickPlan::Fire {
            due,
            // Strictly after now: every tick missed until now collapses into this fire.
            next_due_at: next_ms(cron, now)?,
        }),
        Some(due) => Some(TickPlan::Wait { until: due }),
    }
}

fn trigger_for(p: &Pipeline, now_ms: i64, due: i64) -> Option<Normalised> {
    let s = p.schedule.as_ref()?;
    let mut metadata = serde_json::Map::new();
    metadata.insert(
        "scheduled_for".into(),
        serde_json::Value::from(crate::clock::rfc3339(due)),
    );
    Some(Normalised {
        source: "scheduler".into(),
        pipeline: Some(p.name.clone()),
        severity: Some(s.severity.clone()),
        labels: s.labels.clone(),
        summary: (!s.summary.is_empty()).then(|| s.summary.clone()),
        fingerprint: None,
        team: s.team.clone(),
        metadata,
        received_at: crate::clock::rfc3339(now_ms),
        ..Normalised::default()
    })
}

/// Fires tick `due` by recording its run with the advance to `next_due_at`; a
/// tick another replica fired starts nothing here.
async fn fire(engine: &Arc<Engine>, p: &Pipeline, due: i64, next_due_at: i64) -> Fired {
    let now = engine.now_ms();
    let Some(trigger) = trigger_for(p, now, due) else {
        return Fired::Raced;
    };
    let advance = Write::AdvanceSchedule {
        pipeline: p.name.clone(),
        expected_due_at: Some(due),
        next_due_at,
    };
    match engine.create_tick_run(p, &trigger, due, advance).await {
        Ok(Some(id)) => {
            tracing::info!(run_id = %id, pipeline = %p.name, "Scheduled run started.");
            engine.spawn(id, super::DriveMode::New);
            Fired::Started
        }
        Ok(None) => Fired::Raced,
        Err(e) => {
            tracing::error!(pipeline = %p.name, error = %e, "Cannot record a schedule tick and its run; trying again shortly.");
            Fired::Failed
        }
    }
}

/// What trying to fire a tick came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fired {
    Started,
    /// Another replica fired (or recorded) this tick; read again.
    Raced,
    /// The store did not answer; nothing was written.
    Failed,
}

/// Runs every schedule until shutdown. Fires missed schedules once first. A
/// reload that replaces the pipelines stops every schedule at its next wait (never
/// between a tick's commit and its run's start) and starts those of the new set.
pub async fn run(engine: Arc<Engine>) {
    let mut shutdown = engine.shutdown_signal();
    loop {
        let mut reloaded = engine.reloads();
        reloaded.borrow_and_update();
        let pipelines: Vec<Arc<Pipeline>> = engine
            .pipelines()
            .pipelines
            .iter()
            .filter(|p| p.schedule.is_some())
            .cloned()
            .collect();
        let mut tasks = Vec::new();
        for p in pipelines {
            let engine = engine.clone();
            let stop = reloaded.clone();
            tasks.push(tokio::spawn(async move { run_one(engine, p, stop).await }));
        }
        for t in tasks {
            let _ = t.await;
        }
        if engine.is_shutting_down() {
            return;
        }
        // Every schedule stopped: for a reload, or because none can fire again.
        tokio::select! {
            _ = reloaded.changed() => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// The stored next tick of `p` and, when it has none, an older build's last fire.
fn read_due(
    engine: &Engine,
    p: &Pipeline,
) -> Result<(Option<i64>, Option<i64>), crate::store::Error> {
    let due = engine.store.schedule_due(&p.name)?;
    let legacy = match due {
        Some(_) => None,
        None => engine
            .store
            .kv(&legacy_kv_key(&p.name))?
            .and_then(|v| v.parse::<i64>().ok()),
    };
    Ok((due, legacy))
}

async fn run_one(
    engine: Arc<Engine>,
    p: Arc<Pipeline>,
    mut reloaded: tokio::sync::watch::Receiver<u64>,
) {
    let Some(cron) = p.schedule.as_ref().map(|s| s.cron.clone()) else {
        return;
    };
    let mut shutdown = engine.shutdown_signal();
    let mut first = true;
    loop {
        if engine.is_shutting_down() {
            return;
        }
        let (due, legacy) = match read_due(&engine, &p) {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(pipeline = %p.name, error = %e, "Cannot read the schedule's next tick; trying again shortly.");
                tokio::select! {
                    _ = tokio::time::sleep(RETRY) => continue,
                    _ = shutdown.changed() => return,
                    _ = reloaded.changed() => return,
                }
            }
        };
        let now = engine.now_ms();
        let Some(next) = plan(&cron, due, legacy, now) else {
            return;
        };
        let fired = match next {
            TickPlan::Wait { until } => {
                first = false;
                let wait = Duration::from_millis(u64::try_from(until - now).unwrap_or(0));
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => return,
                    _ = reloaded.changed() => return,
                }
                continue;
            }
            TickPlan::Init { next_due_at } => {
                let init = Write::AdvanceSchedule {
                    pipeline: p.name.clone(),
                    expected_due_at: None,
                    next_due_at,
                };
                match engine.store.commit(vec![init]).await {
                    Ok(_) => Fired::Raced,
                    Err(e) => {
                        tracing::error!(pipeline = %p.name, error = %e, "Cannot record a schedule's first tick; trying again shortly.");
                        Fired::Failed
                    }
                }
            }
            TickPlan::Fire { due, next_due_at } => {
                if first && now - due > 1_000 {
                    tracing::warn!(pipeline = %p.name, "A schedule was missed while the service was down; firing it once now.");
                }
                fire(&engine, &p, due, next_due_at).await
            }
        };
        first = false;
        if fired == Fired::Failed {
            tokio::select! {
                _ = tokio::time::sleep(RETRY) => {}
                _ = shutdown.changed() => return,
                _ = reloaded.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .map(|d| d.with_timezone(&Utc))
            .unwrap()
    }

    #[test]
    fn plans() {
        let ms = |s: &str| t(s).timestamp_millis();
        let hourly = "0 * * * *";
        let rows = [
            (
                "a new schedule starts counting from now",
                None,
                None,
                "2026-12-01T10:07:00Z",
                Some(TickPlan::Init {
                    next_due_at: ms("2026-12-01T11:00:00Z"),
                }),
            ),
            (
                "an older build's last fire: the tick missed since is next (and due)",
                None,
                Some(ms("2026-12-01T05:07:00Z")),
                "2026-12-01T10:07:00Z",
                Some(TickPlan::Init {
                    next_due_at: ms("2026-12-01T06:00:00Z"),
                }),
            ),
            (
                "not due yet",
                Some(ms("2026-12-01T11:00:00Z")),
                None,
                "2026-12-01T10:07:00Z",
                Some(TickPlan::Wait {
                    until: ms("2026-12-01T11:00:00Z"),
                }),
            ),
            (
                "due on the dot",
                Some(ms("2026-12-01T11:00:00Z")),
                None,
                "2026-12-01T11:00:00Z",
                Some(TickPlan::Fire {
                    due: ms("2026-12-01T11:00:00Z"),
                    next_due_at: ms("2026-12-01T12:00:00Z"),
                }),
            ),
            (
                "five ticks missed: one fire, and the next tick is after now",
                Some(ms("2026-12-01T06:00:00Z")),
                None,
                "2026-12-01T10:07:00Z",
                Some(TickPlan::Fire {
                    due: ms("2026-12-01T06:00:00Z"),
                    next_due_at: ms("2026-12-01T11:00:00Z"),
                }),
            ),
        ];
        for (what, due, legacy, now, want) in rows {
            assert_eq!(plan(hourly, due, legacy, ms(now)), want, "{what}");
        }
    }

    #[test]
    fn next_ticks() {
        assert_eq!(
            next_tick("*/15 * * * *", t("2026-12-01T10:07:00Z")),
            Some(t("2026-12-01T10:15:00Z"))
        );
        assert_eq!(
            next_tick("*/15 * * * *", t("2026-12-01T10:15:00Z")),
            Some(t("2026-12-01T10:30:00Z")),
            "strictly after"
        );
    }

    #[test]
    fn a_ticks_run_id_is_the_same_everywhere_and_sorts_by_its_tick() {
        let due = t("2026-12-01T10:15:00Z").timestamp_millis();
        let id = tick_run_id("nightly", due);
        assert_eq!(
            id,
            tick_run_id("nightly", due),
            "every replica names it alike"
        );
        assert_ne!(id, tick_run_id("nightly", due + 1_000), "one run per tick");
        assert_ne!(id, tick_run_id("hourly", due), "one run per schedule");
        let uuid = uuid::Uuid::parse_str(&id).unwrap();
        assert_eq!(uuid.get_version_num(), 7);
        let (secs, nanos) = uuid.get_timestamp().unwrap().to_unix();
        assert_eq!(secs as i64 * 1000 + nanos as i64 / 1_000_000, due);
        assert!(
            tick_run_id("nightly", due - 60_000) < id,
            "ordered like v7 ids"
        );
    }
}
