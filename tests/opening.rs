//! A new run's first step is recorded as started in the run's own commit
//! (`Engine::create_run`), saving a writer round trip per run. These tests pin what
//! that must not change: the records and run log read as before, the step runs
//! once with attempt 1, and a cancel arriving before the driver starts takes effect
//! at the boundary after that step, like a cancel during any other step.

mod common;
use common::engine_support;

use engine_support::{create, engine_with};
use vectorstep::domain::RunStatus;
use vectorstep::runner::{Created, DriveMode, RunEnd};
use vectorstep::store::Store;

const TWO_STEPS: &str = concat!(
    "name: two\nstage: production\ntrigger: {}\nsteps:\n",
    "  - name: first\n    executor: mock\n",
    "    executor_config: {output: {confidence: 0.9, summary: one, next_step_context: \"\"}}\n",
    "  - name: second\n    executor: mock\n",
    "    executor_config: {output: {confidence: 0.9, summary: two, next_step_context: \"\"}}\n",
);

const GUARDED: &str = concat!(
    "name: guarded\nstage: production\ntrigger: {}\nsteps:\n",
    "  - name: first\n    executor: mock\n    when: \"false\"\n",
    "    executor_config: {output: {confidence: 0.9, summary: one, next_step_context: \"\"}}\n",
);

fn setup() -> engine_support::Scratch {
    engine_with(&[("two", TWO_STEPS), ("guarded", GUARDED)])
}

fn event_names(store: &Store, id: &str) -> Vec<String> {
    store
        .events(id)
        .expect("events")
        .into_iter()
        .map(|e| e.event)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_step_is_recorded_with_the_run_and_runs_once() {
    let s = setup();
    let (engine, store) = (&s.engine, &s.store);
    let Created::Inserted(id) = create(engine, "two", None).await else {
        panic!("deduplicated")
    };
    // Before any driver: the run and its first step, started, in one commit.
    let steps = store.steps(&id).expect("steps");
    assert_eq!(steps.len(), 1);
    assert_eq!(
        (
            steps[0].step_path.as_str(),
            steps[0].status.as_str(),
            steps[0].attempts
        ),
        ("first", "running", 1)
    );
    assert_eq!(event_names(store, &id), ["run_started", "step_started"]);

    let end = engine.drive(&id, DriveMode::New).await.expect("drive");
    assert_eq!(end, RunEnd::Finished(RunStatus::Completed));
    let names = event_names(store, &id);
    let started: Vec<_> = names.iter().filter(|n| *n == "step_started").collect();
    assert_eq!(started.len(), 2, "one per step: {names:?}");
    let steps = store.steps(&id).expect("steps");
    assert_eq!(
        steps
            .iter()
            .map(|s| (s.step_path.as_str(), s.status.as_str(), s.attempts))
            .collect::<Vec<_>>(),
        [("first", "completed", 1), ("second", "completed", 1)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deduplicated_run_and_a_guarded_first_step_record_no_step() {
    let s = setup();
    let (engine, store) = (&s.engine, &s.store);
    let Created::Inserted(first) = create(engine, "two", Some("fp")).await else {
        panic!("first was deduplicated")
    };
    let Created::Duplicate { run_id, .. } = create(engine, "two", Some("fp")).await else {
        panic!("second was not deduplicated")
    };
    assert_eq!(run_id, first);
    let all = store.runs(&Default::default()).expect("runs");
    assert_eq!(all.len(), 1);
    assert_eq!(store.steps(&first).expect("steps").len(), 1);

    // A `when` is evaluated by the driver, so nothing is recorded up front.
    let Created::Inserted(guarded) = create(engine, "guarded", None).await else {
        panic!("deduplicated")
    };
    assert!(store.steps(&guarded).expect("steps").is_empty());
    let end = engine.drive(&guarded, DriveMode::New).await.expect("drive");
    assert_eq!(end, RunEnd::Finished(RunStatus::Completed));
    assert_eq!(store.steps(&guarded).expect("steps")[0].status, "skipped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_before_the_driver_starts_stops_after_the_recorded_step() {
    let s = setup();
    let (engine, store) = (&s.engine, &s.store);
    let Created::Inserted(id) = create(engine, "two", None).await else {
        panic!("deduplicated")
    };
    engine.cancel(&id);
    let end = engine.drive(&id, DriveMode::New).await.expect("drive");
    assert_eq!(end, RunEnd::Finished(RunStatus::Cancelled));
    let steps = store.steps(&id).expect("steps");
    assert_eq!(
        steps
            .iter()
            .map(|s| (s.step_path.as_str(), s.status.as_str()))
            .collect::<Vec<_>>(),
        [("first", "completed")],
        "no step may be left `running` in a cancelled run"
    );
}
