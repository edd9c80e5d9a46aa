//! The runner's ports out: `engine/runner/` never imports `telegram/` (chat
//! front-ends reach the engine through `runner::ports`), and what the engine keeps
//! per run in memory (cancellations, approval wake-ups, used approvals) is dropped
//! when the run's driver ends.

mod common;
use common::engine_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use engine_support::Scratch;
use vectorstep::runner::{Created, DriveMode, RetainedSizes, RunEnd};
use vectorstep::store::Outcome;

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// A line's code without its `//` comment and with string literals blanked, so a
/// message or a doc that mentions Telegram is not an import.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut in_str = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if in_str => {
                chars.next();
            }
            '"' => {
                in_str = !in_str;
                out.push('"');
            }
            '/' if !in_str && chars.peek() == Some(&'/') => break,
            _ if in_str => {}
            _ => out.push(c),
        }
    }
    out
}

/// `file:line: code` for each line of `engine/<dir>` that names the module `module`
/// in a path: `use` items (also inside a `{...}` group across lines) and
/// qualified paths such as `crate::telegram::Client`.
fn imports_of(dir: &str, module: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("engine")
        .join(dir);
    let path = regex::Regex::new(&format!(
        r"\b(crate|super|self|vectorstep)(::\w+)*::{module}\b"
    ))
    .expect("regex");
    let word = regex::Regex::new(&format!(r"\b{module}\b")).expect("regex");
    let mut found = Vec::new();
    for file in rust_files(&root) {
        let text = std::fs::read_to_string(&file).expect("read source");
        let mut in_use = false;
        for (n, raw) in text.lines().enumerate() {
            let code = code_of(raw);
            let trimmed = code.trim_start();
            if trimmed.starts_with("use ") || trimmed.starts_with("pub use ") {
                in_use = true;
            }
            let names = if in_use {
                word.is_match(&code)
            } else {
                path.is_match(&code)
            };
            if names {
                let rel = file
                    .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                    .unwrap_or(&file);
                found.push(format!("{}:{}: {}", rel.display(), n + 1, raw.trim()));
            }
            if in_use && code.contains(';') {
                in_use = false;
            }
        }
    }
    found
}

#[test]
fn the_runner_never_imports_telegram() {
    let found = imports_of("runner", "telegram");
    assert!(
        found.is_empty(),
        "engine/runner/ must reach chat front-ends through runner::ports, not telegram/:\n{}",
        found.join("\n")
    );
}

/// The files that run a unit. They work with `Services` (store, executors, clock,
/// config, HTTP client, approval signals) and reach the engine only through
/// `unit::ChildRuns`; only the driver files (`mod`, `drive`, `sweep`, `park`,
/// `ports`, `schedule`, `retention`) hold the `Engine`.
const UNIT_FILES: &[&str] = &[
    "branch.rs",
    "call.rs",
    "ending.rs",
    "group.rs",
    "outbox.rs",
    "persist.rs",
    "records.rs",
    "services.rs",
    "signals.rs",
    "step.rs",
    "subpipeline.rs",
    "unit.rs",
    "human/mod.rs",
    "human/delivery.rs",
    "human/wait.rs",
];

/// `file:line: code` for each line of `engine/runner/<file>` whose code names `word`.
fn lines_naming(files: &[&str], word: &str) -> Vec<String> {
    let mut found = Vec::new();
    for f in files {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("engine/runner")
            .join(f);
        let Ok(text) = std::fs::read_to_string(&path) else {
            panic!("cannot read {}", path.display());
        };
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("#[cfg(test)]") {
                break;
            }
            let code = code_of(line);
            let named = code
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|w| w == word);
            if named {
                found.push(format!("engine/runner/{f}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn units_work_with_services_and_never_name_the_engine() {
    let found = lines_naming(UNIT_FILES, "Engine");
    assert!(
        found.is_empty(),
        "a unit must use `Services` (and `ChildRuns` for a child run), not the engine:\n{}",
        found.join("\n")
    );
    // The scan can fail: the driver holds the engine.
    assert!(!lines_naming(&["drive.rs"], "Engine").is_empty());
}

#[test]
fn the_import_scan_finds_an_import() {
    // The scan above must be able to fail: telegram/ itself imports the runner.
    let found = imports_of("telegram", "runner");
    assert!(
        found.iter().any(|l| l.contains("mod.rs")),
        "expected telegram/mod.rs to import runner: {found:?}"
    );
    assert_eq!(
        code_of(r#"let s = "crate::telegram::x"; // telegram::y"#),
        r#"let s = ""; "#
    );
}

const GATE: &str = concat!(
    "name: gate\nstage: production\ndurable: true\ntrigger: {}\nsteps:\n",
    "  - name: approve\n    executor: human\n    timeout_seconds: 600\n    prompt_template: \"go?\"\n",
    "  - name: after\n    executor: mock\n",
    "    executor_config: {output: {confidence: 0.9, summary: after, next_step_context: \"\"}}\n",
);

const PLAIN: &str = concat!(
    "name: plain\ntrigger: {}\nsteps:\n",
    "  - name: one\n    executor: mock\n",
    "    executor_config: {output: {confidence: 0.9, summary: one, next_step_context: \"\"}}\n",
);

async fn create(s: &Scratch, pipeline: &str) -> String {
    match engine_support::create(&s.engine, pipeline, None).await {
        Created::Inserted(id) => id,
        other => panic!("create_run: {other:?}"),
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < Duration::from_secs(30), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn first_token(s: &Scratch, id: &str) -> String {
    until("the approval is requested", || {
        s.store
            .approvals_of_run(id)
            .map(|a| !a.is_empty())
            .unwrap_or(false)
    })
    .await;
    s.store.approvals_of_run(id).expect("approvals")[0]
        .token
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_engine_keeps_per_run_is_dropped_when_the_run_ends() {
    const N: usize = 4;
    let s = engine_support::engine_with(&[("gate", GATE), ("plain", PLAIN)]);
    let mut drivers = Vec::new();

    // Human steps waiting in their task, decided in this process: each leaves a
    // wake-up and a used approval behind while it runs.
    for _ in 0..N {
        let id = create(&s, "gate").await;
        drivers.push((id.clone(), s.engine.spawn(id, DriveMode::New)));
    }
    for (id, _) in &drivers {
        let token = first_token(&s, id).await;
        let decided = s
            .engine
            .decide_approval(&token, true, "alice")
            .await
            .expect("decide");
        assert_eq!(decided, Outcome::ApprovalDecided);
    }
    // Runs cancelled while waiting for a human.
    let mut cancelled = Vec::new();
    for _ in 0..N {
        let id = create(&s, "gate").await;
        cancelled.push((id.clone(), s.engine.spawn(id, DriveMode::New)));
    }
    for (id, _) in &cancelled {
        first_token(&s, id).await;
        s.engine.cancel_by(id, Some("bob"));
    }
    // Runs cancelled before their first step.
    for _ in 0..N {
        let id = create(&s, "plain").await;
        s.engine.cancel(&id);
        let end = s.engine.drive(&id, DriveMode::New).await.expect("drive");
        assert_eq!(
            end,
            RunEnd::Finished(vectorstep::domain::RunStatus::Cancelled)
        );
    }
    for (_, d) in drivers {
        let end = d.await.expect("task").expect("drive");
        assert_eq!(
            end,
            RunEnd::Finished(vectorstep::domain::RunStatus::Completed)
        );
    }
    for (_, d) in cancelled {
        let end = d.await.expect("task").expect("drive");
        assert_eq!(
            end,
            RunEnd::Finished(vectorstep::domain::RunStatus::Cancelled)
        );
    }
    assert_eq!(s.engine.active_runs(), 0);
    assert_eq!(s.engine.retained_sizes(), RetainedSizes::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_run_keeps_its_cancellation_until_its_driver_ends() {
    let s = engine_support::engine_with(&[("gate", GATE)]);
    s.engine.enable_parking();
    let id = create(&s, "gate").await;
    let end = s.engine.drive(&id, DriveMode::New).await.expect("drive");
    assert_eq!(end, RunEnd::Parked);
    s.engine.cancel(&id);
    until("the cancelled run's driver ends", || {
        s.store
            .run(&id)
            .ok()
            .flatten()
            .is_some_and(|r| r.status == "cancelled")
            && s.engine.active_runs() == 0
    })
    .await;
    assert_eq!(s.engine.retained_sizes(), RetainedSizes::default());
}
