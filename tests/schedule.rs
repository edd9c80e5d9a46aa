//! Schedules through the real server: a `schedule.cron` pipeline fires on time with
//! source `scheduler`, and a schedule missed while the service was down fires once
//! at start, not once per missed tick.

mod common;
use common::crash_support;

use std::time::{Duration, Instant};

use crash_support::{Scratch, Service};
use vectorstep::store::Write;

const EVERY_SECOND: &str = "name: tick\ntrigger: {match: {source: scheduler}}\nstage: production\nschedule:\n  cron: \"* * * * * *\"\n  summary: every second\n  severity: info\n  labels: {job: tick}\nsteps:\n  - {name: a, executor: mock}\n";

/// A daily pipeline whose tick is twelve hours from now, so no real tick can fall
/// inside a test (an hourly one did, when a run crossed the top of the hour).
fn daily_far_from_now() -> String {
    use chrono::Timelike;
    let hour = (chrono::Utc::now().hour() + 12) % 24;
    format!(
        "name: daily\ntrigger: {{match: {{source: scheduler}}}}\nstage: production\nschedule: {{cron: \"0 {hour} * * *\", summary: daily report}}\nsteps:\n  - {{name: a, executor: mock}}\n"
    )
}

async fn runs_of(svc: &Service, pipeline: &str) -> Vec<serde_json::Value> {
    svc.list_runs()
        .await
        .into_iter()
        .filter(|r| r["pipeline_name"] == pipeline)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_on_time_as_the_scheduler() {
    let s = Scratch::new();
    s.write_pipeline("tick", EVERY_SECOND);
    let svc = Service::start(&s.root).await;
    svc.wait_ready().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let runs = loop {
        let runs = runs_of(&svc, "tick").await;
        if runs.len() >= 2 || Instant::now() > deadline {
            break runs;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        runs.len() >= 2,
        "a once-a-second schedule fired {} time(s) in 10 s",
        runs.len()
    );
    for r in &runs {
        assert_eq!(r["source"], "scheduler");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_missed_while_down_fires_once_at_start() {
    let s = Scratch::new();
    s.write_pipeline("daily", &daily_far_from_now());
    {
        // The last fire was five days ago: five ticks were missed while down.
        let store = s.open_store();
        let five_days_ago = chrono::Utc::now().timestamp_millis() - 5 * 86_400_000;
        store
            .commit(vec![Write::SetKv {
                key: "schedule:last_fire:daily".into(),
                value: five_days_ago.to_string(),
            }])
            .await
            .unwrap();
    }
    let svc = Service::start(&s.root).await;
    svc.wait_ready().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while runs_of(&svc, "daily").await.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Give a wrongly repeating catch-up time to show itself.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let runs = runs_of(&svc, "daily").await;
    assert_eq!(
        runs.len(),
        1,
        "missed ticks fire once, not once each: {runs:?}"
    );
    assert_eq!(runs[0]["source"], "scheduler");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_does_not_fire_past_ticks() {
    let s = Scratch::new();
    s.write_pipeline("daily", &daily_far_from_now());
    let svc = Service::start(&s.root).await;
    svc.wait_ready().await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        runs_of(&svc, "daily").await.is_empty(),
        "nothing was missed before the first start"
    );
}
