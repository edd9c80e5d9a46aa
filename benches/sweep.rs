//! Start-up sweep and resume planning for 10,000 `running` runs.
//!
//! Run: `cargo bench --bench sweep`. Target: deciding every run and starting the
//! resumable ones takes under 2 seconds. Each run has 2 completed steps and 1 in
//! flight out of 5, so planning reads real step records.

use std::sync::Arc;
use std::time::Instant;

use vectorstep::clock::SystemClock;
use vectorstep::config::Config;
use vectorstep::domain::{RunStatus, StepKind, StepStatus};
use vectorstep::executor::Executors;
use vectorstep::runner::{records, sweep, DriveMode, Engine};
use vectorstep::store::{RunRecord, StepRecord, Store, Write};

const RUNS: usize = 10_000;

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pdir = dir.path().join("pipelines");
    std::fs::create_dir_all(&pdir).expect("mkdir");
    let mut yaml = String::from("name: p\ntrigger: {}\nstage: production\ndurable: true\nsteps:\n");
    for i in 0..5 {
        yaml.push_str(&format!(
            "  - name: s{i}\n    executor: mock\n    executor_config: {{output: {{confidence: 0.9, summary: \"s{i}\"}}}}\n"
        ));
    }
    std::fs::write(pdir.join("p.yaml"), yaml).expect("write");
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "pipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\ndatabase: {path: ./sweep.db}\n").expect("write");
    let config = Arc::new(Config::load(&cfg, true).expect("config").0);
    let (set, d) = vectorstep::pipeline::load(&[pdir], &config);
    let set = set.unwrap_or_else(|| panic!("{d}"));
    let fingerprint = set.get("p").expect("p").fingerprint.clone();
    let store = Store::open(&config.database_path).expect("store");

    let now = chrono::Utc::now().timestamp_millis();
    let t = Instant::now();
    let mut writes = Vec::new();
    for n in 0..RUNS {
        let id = format!("run-{n:05}");
        writes.push(Write::InsertRun(RunRecord {
            id: id.clone(),
            pipeline_name: "p".into(),
            status: RunStatus::Running,
            source: "bench".into(),
            team: None,
            stage: "production".into(),
            triggered_at: now,
            completed_at: None,
            resumed_at: None,
            resume_count: 0,
            config_fingerprint: fingerprint.clone(),
            parent_run_id: None,
            parent_step_path: None,
            dedup_fingerprint: None,
            context_json: r#"{"source":"bench","received_at":""}"#.into(),
            payload_json: "{}".into(),
            tokens_used: 0,
            cost_usd: 0.0,
            terminal_step: None,
            reason: None,
            final_output_json: None,
            replay_of: None,
        }));
        for s in 0..3 {
            let path = format!("s{s}");
            let mut rec: StepRecord = records::running(records::NewRecord {
                run_id: &id,
                path: &path,
                index: records::step_index(s, None),
                kind: StepKind::Step,
                action: None,
                started_at: now,
                attempt: 1,
                iteration: 1,
            });
            if s < 2 {
                rec.status = StepStatus::Completed;
                rec.output_json = Some(format!(
                    r#"{{"confidence":0.9,"summary":"s{s}","next_step_context":""}}"#
                ));
            }
            writes.push(Write::UpsertStep(rec));
        }
        if writes.len() > 4000 {
            store
                .commit_blocking(std::mem::take(&mut writes))
                .expect("seed");
        }
    }
    store.commit_blocking(writes).expect("seed");
    println!(
        "seeded {RUNS} running runs in {:.2}s",
        t.elapsed().as_secs_f64()
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let engine = Engine::new(config.clone(), set.clone(), store.clone(), Executors::standard(&config), Arc::new(SystemClock));
        let t = Instant::now();
        let resumable = sweep::sweep(&engine).await.expect("sweep");
        let decided = t.elapsed();
        let t_plan = Instant::now();
        let p = set.get("p").expect("p");
        let mut in_flight = 0;
        for run in &resumable {
            let plan = vectorstep::run::plan::plan(p, &store.steps(&run.id).expect("steps"));
            in_flight += plan.in_flight.len();
        }
        let planned = t_plan.elapsed();
        println!(
            "sweep decided {} runs in {:.3}s; planning all of them took {:.3}s ({} in flight)",
            resumable.len(),
            decided.as_secs_f64(),
            planned.as_secs_f64(),
            in_flight
        );
        let t = Instant::now();
        let handles: Vec<_> = resumable.into_iter().map(|r| engine.spawn(r.id, DriveMode::Resume)).collect();
        let spawned = t.elapsed();
        for h in handles {
            h.await.expect("join").expect("drive");
        }
        println!(
            "started {RUNS} resumes in {:.3}s; decide + start = {:.3}s (target < 2s); all finished after {:.2}s",
            spawned.as_secs_f64(),
            (decided + spawned).as_secs_f64(),
            t.elapsed().as_secs_f64()
        );
        assert_eq!(store.count_runs_with_status(RunStatus::Completed).expect("count"), RUNS as u64);
    });
}
