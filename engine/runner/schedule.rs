//! Cron schedules: pipelines with `schedule.cron` fire on time with source
//! `scheduler`. The last fire time is kept in the store, so a tick missed while the
//! service was down fires once at start, not once per missed tick. Times are UTC.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Created, Engine};
use crate::pipeline::Pipeline;
use crate::run::context::Normalised;
use crate::store::Write;

fn kv_key(pipeline: &str) -> String {
    format!("schedule:last_fire:{pipeline}")
}

/// The next tick strictly after `after`.
pub fn next_tick(cron: &str, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let c = croner::Cron::new(cron)
        .with_seconds_optional()
        .parse()
        .ok()?;
    c.find_next_occurrence(&after, false).ok()
}

/// Whether a tick happened in `(last, now]`: a missed schedule.
pub fn missed(cron: &str, last: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    next_tick(cron, last).is_some_and(|t| t <= now)
}

fn trigger_for(p: &Pipeline, now_ms: i64) -> Option<Normalised> {
    let s = p.schedule.as_ref()?;
    Some(Normalised {
        source: "scheduler".into(),
        pipeline: Some(p.name.clone()),
        severity: Some(s.severity.clone()),
        labels: s.labels.clone(),
        summary: (!s.summary.is_empty()).then(|| s.summary.clone()),
        fingerprint: None,
        team: s.team.clone(),
        metadata: Default::default(),
        received_at: crate::clock::rfc3339(now_ms),
    })
}

async fn fire(engine: &Arc<Engine>, p: &Pipeline) {
    let now = engine.now_ms();
    let Some(trigger) = trigger_for(p, now) else {
        return;
    };
    // Record the fire first: a crash right after must not fire it again at start.
    let mark = Write::SetKv {
        key: kv_key(&p.name),
        value: now.to_string(),
    };
    if let Err(e) = engine.store.commit(vec![mark]).await {
        tracing::error!(pipeline = %p.name, error = %e, "Cannot record a schedule fire; skipping it.");
        return;
    }
    match engine
        .create_run(p, &trigger, &serde_json::json!({}), None, None)
        .await
    {
        Ok(Created::Inserted(id)) => {
            tracing::info!(run_id = %id, pipeline = %p.name, "Scheduled run started.");
            engine.spawn(id, super::DriveMode::New);
        }
        Ok(Created::Duplicate { .. }) => {}
        Err(e) => tracing::error!(pipeline = %p.name, error = %e, "Scheduled run could not start."),
    }
}

/// Runs every schedule until shutdown. Fires missed schedules once first.
pub async fn run(engine: Arc<Engine>) {
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
        tasks.push(tokio::spawn(async move { run_one(engine, p).await }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

async fn run_one(engine: Arc<Engine>, p: Arc<Pipeline>) {
    let Some(cron) = p.schedule.as_ref().map(|s| s.cron.clone()) else {
        return;
    };
    let now = DateTime::<Utc>::from_timestamp_millis(engine.now_ms()).unwrap_or_else(Utc::now);
    let last = engine
        .store
        .kv(&kv_key(&p.name))
        .ok()
        .flatten()
        .and_then(|v| v.parse::<i64>().ok())
        .and_then(DateTime::<Utc>::from_timestamp_millis);
    match last {
        Some(last) if missed(&cron, last, now) => {
            tracing::warn!(pipeline = %p.name, "A schedule was missed while the service was down; firing it once now.");
            fire(&engine, &p).await;
        }
        Some(_) => {}
        None => {
            // First start with this schedule: start counting from now.
            let _ = engine
                .store
                .commit(vec![Write::SetKv {
                    key: kv_key(&p.name),
                    value: engine.now_ms().to_string(),
                }])
                .await;
        }
    }
    let mut shutdown = engine.shutdown_signal();
    loop {
        let now = DateTime::<Utc>::from_timestamp_millis(engine.now_ms()).unwrap_or_else(Utc::now);
        let Some(next) = next_tick(&cron, now) else {
            return;
        };
        let wait = (next - now).to_std().unwrap_or(Duration::ZERO);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
        if engine.is_shutting_down() {
            return;
        }
        fire(&engine, &p).await;
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
    fn next_and_missed() {
        assert_eq!(
            next_tick("*/15 * * * *", t("2026-12-01T10:07:00Z")),
            Some(t("2026-12-01T10:15:00Z"))
        );
        // Down from 10:07 to 11:02: four ticks missed, one fire.
        assert!(missed(
            "*/15 * * * *",
            t("2026-12-01T10:07:00Z"),
            t("2026-12-01T11:02:00Z")
        ));
        assert!(!missed(
            "*/15 * * * *",
            t("2026-12-01T10:07:00Z"),
            t("2026-12-01T10:14:59Z")
        ));
    }
}
