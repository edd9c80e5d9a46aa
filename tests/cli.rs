//! The `vectorstep` binary's one-shot commands: `run`, `runs list|show`,
//! `sweep --dry-run`, exit codes, and untrusted input never reaching a shell.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use vectorstep::domain::{RunStatus, StepKind, StepStatus};
use vectorstep::runner::records;
use vectorstep::store::{RunRecord, Store, Write};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vectorstep"))
}

/// A scratch folder with a config, a pipelines folder and an empty step library.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new(pipelines: &[(&str, &str)]) -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("pipelines")).unwrap();
        std::fs::create_dir_all(dir.path().join("steps")).unwrap();
        for (name, yaml) in pipelines {
            std::fs::write(
                dir.path().join("pipelines").join(format!("{name}.yaml")),
                yaml,
            )
            .unwrap();
        }
        std::fs::write(
            dir.path().join("config.yaml"),
            "pipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\ndatabase: {path: ./data/db.sqlite}\nlogging: {level: warn}\n",
        )
        .unwrap();
        Scratch { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn config(&self) -> PathBuf {
        self.path().join("config.yaml")
    }

    fn run(&self, args: &[&str]) -> Output {
        bin()
            .arg("--config")
            .arg(self.config())
            .args(args)
            .current_dir(self.path())
            .output()
            .unwrap()
    }

    fn store(&self) -> Store {
        Store::open(&self.path().join("data/db.sqlite")).unwrap()
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const OK_PIPELINE: &str = "name: ok\ntrigger: {}\nsteps:\n  - name: a\n    executor: mock\n  - name: b\n    executor: mock\n    executor_config: {output: {confidence: 0.9, summary: \"b done\"}}\n";
const ESCALATING: &str = "name: low\ntrigger: {}\nsteps:\n  - name: a\n    executor: mock\n    executor_config: {output: {confidence: 0.2, summary: \"unsure\"}}\n  - name: never\n    executor: mock\n";

#[test]
fn run_prints_the_step_table_and_exits_by_status() {
    let s = Scratch::new(&[("ok", OK_PIPELINE), ("low", ESCALATING)]);
    let o = s.run(&["run", "ok"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = stdout(&o);
    assert!(out.lines().next().unwrap().starts_with("STEP"), "{out}");
    assert!(out.contains("a ") && out.contains("completed"), "{out}");
    assert!(out.contains("finished: completed"), "{out}");

    let o = s.run(&["run", "low"]);
    assert_eq!(o.status.code(), Some(2));
    let out = stdout(&o);
    assert!(out.contains("finished: escalated"), "{out}");
    assert!(
        !out.contains("never"),
        "a step after the escalation must not run: {out}"
    );

    let o = s.run(&["run", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no pipeline named `nope`"));
}

#[test]
fn runs_list_and_show_read_the_store() {
    let s = Scratch::new(&[("ok", OK_PIPELINE)]);
    let o = s.run(&["run", "ok", "--json"]);
    assert_eq!(o.status.code(), Some(0));
    let run: Value = serde_json::from_slice(&o.stdout).unwrap();
    let id = run["id"].as_str().unwrap().to_string();
    assert_eq!(run["status"], "completed");
    let steps = run["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0]["idempotency_key"], format!("{id}:a:1"));
    let events: Vec<&str> = run["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["event"].as_str().unwrap())
        .collect();
    assert_eq!(events.first(), Some(&"run_started"));
    assert_eq!(events.last(), Some(&"run_finished"));
    let started = events.iter().position(|e| *e == "step_started").unwrap();
    let completed = events.iter().position(|e| *e == "step_completed").unwrap();
    assert!(started < completed);

    let list: Value = serde_json::from_slice(&s.run(&["runs", "list", "--json"]).stdout).unwrap();
    assert_eq!(list["runs"][0]["id"], id.as_str());
    let show = stdout(&s.run(&["runs", "show", &id]));
    assert!(show.contains("run_finished"), "{show}");
    assert!(show.contains("status completed"), "{show}");
    assert_eq!(s.run(&["runs", "show", "missing"]).status.code(), Some(1));
}

#[test]
fn an_alert_label_never_reaches_a_shell() {
    let pipeline = "name: echo\ntrigger: {}\nsteps:\n  - name: say\n    executor: shell\n    executor_config:\n      command: [\"printf\", \"%s\", \"label={{ labels.evil }}\"]\n";
    let s = Scratch::new(&[("echo", pipeline)]);
    let evil = "$(touch PWNED); touch PWNED; `touch PWNED`";
    let o = s.run(&["run", "echo", "--json", "--set", &format!("evil={evil}")]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        !s.path().join("PWNED").exists(),
        "the label was executed by a shell"
    );
    let run: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        run["steps"][0]["output"]["summary"],
        format!("label={evil}")
    );
}

fn running_run(id: &str, pipeline: &str, fingerprint: &str) -> RunRecord {
    RunRecord {
        id: id.into(),
        pipeline_name: pipeline.into(),
        status: RunStatus::Running,
        source: "test".into(),
        team: None,
        stage: "production".into(),
        triggered_at: chrono::Utc::now().timestamp_millis(),
        completed_at: None,
        resumed_at: None,
        resume_count: 0,
        config_fingerprint: fingerprint.into(),
        parent_run_id: None,
        parent_step_path: None,
        dedup_fingerprint: None,
        context_json: r#"{"source":"test"}"#.into(),
        payload_json: "{}".into(),
        tokens_used: 0,
        cost_usd: 0.0,
        terminal_step: None,
        reason: None,
        final_output_json: None,
        replay_of: None,
    }
}

#[test]
fn sweep_dry_run_explains_and_changes_nothing() {
    let durable = "name: dur\ntrigger: {}\ndurable: true\nsteps:\n  - {name: a, executor: mock}\n  - {name: b, executor: mock}\n  - {name: c, executor: mock}\n";
    let plain = "name: plain\ntrigger: {}\nsteps:\n  - {name: a, executor: mock}\n";
    let s = Scratch::new(&[("dur", durable), ("plain", plain)]);
    let fp = |name: &str| stdout(&s.run(&["fingerprint", name])).trim().to_string();
    let (fp_dur, fp_plain) = (fp("dur"), fp("plain"));
    assert_eq!(fp_dur.len(), 64);
    {
        let store = s.store();
        let mut writes = vec![
            Write::InsertRun(running_run("r-dur", "dur", &fp_dur)),
            Write::InsertRun(running_run("r-plain", "plain", &fp_plain)),
            Write::InsertRun(running_run("r-changed", "dur", "0000")),
        ];
        for (i, (path, status)) in [("a", StepStatus::Completed), ("b", StepStatus::Running)]
            .into_iter()
            .enumerate()
        {
            let mut rec = records::running(records::NewRecord {
                run_id: "r-dur",
                path,
                index: records::step_index(i, None),
                kind: StepKind::Step,
                action: None,
                started_at: 0,
                attempt: 1,
                iteration: 1,
            });
            rec.status = status;
            writes.push(Write::UpsertStep(rec));
        }
        store.commit_blocking(writes).unwrap();
    }
    let o = s.run(&["sweep", "--dry-run"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    let line = |id: &str| {
        out.lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("r-dur ").contains("resume: 1 step(s)"), "{out}");
    assert!(line("r-dur ").contains("in flight: b"), "{out}");
    assert!(
        line("r-plain").contains("interrupt (run_interrupted)"),
        "{out}"
    );
    assert!(
        line("r-changed").contains("resume_skipped_config_changed"),
        "{out}"
    );
    let store = s.store();
    for id in ["r-dur", "r-plain", "r-changed"] {
        assert_eq!(
            store.run(id).unwrap().unwrap().status,
            "running",
            "dry run changed {id}"
        );
    }
}

const FAN_OUT: &str = "name: fan\ntrigger: {}\nsteps:\n  - name: a\n    executor: mock\n    executor_config: {output: {confidence: 0.9, summary: \"line one\\nline two\"}}\n  - fan_out:\n      name: per-service\n      over: '[{\"name\": \"checkout\"}, {\"name\": \"payments\"}]'\n      executor: mock\n      executor_config: {output: {confidence: 0.9, summary: \"looked at {{ item.name }}\"}}\n";

#[test]
fn usage_errors_exit_64_and_help_exits_0() {
    let s = Scratch::new(&[("ok", OK_PIPELINE)]);
    for args in [
        &["runs", "list", "--no-such-flag"][..],
        &["run"][..],
        &["run", "ok", "--set", "no-equals-sign"][..],
        &["nonsense"][..],
        &["store", "copy", "--from", "x.db"][..],
        &["runs", "replay", "r1"][..],
        &["completions", "powershell-classic"][..],
    ] {
        let o = s.run(args);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {o:?}");
        assert!(!o.stderr.is_empty(), "{args:?}: a usage error says why");
    }
    let o = s.run(&["runs", "list", "--help"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        stdout(&o).contains("Only runs of this pipeline"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn output_to_a_closed_pipe_ends_quietly_with_0() {
    let s = Scratch::new(&[("ok", OK_PIPELINE)]);
    for _ in 0..3 {
        assert_eq!(s.run(&["run", "ok"]).status.code(), Some(0));
    }
    // The read end is closed before the command writes: what `| head -1` does
    // once it has its line.
    let mut child = bin()
        .arg("--config")
        .arg(s.config())
        .args(["runs", "list"])
        .current_dir(s.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.trim().is_empty(), "quiet: {err}");
    // And through a real shell pipeline.
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -o pipefail; {} --config {} runs list | head -1",
            env!("CARGO_BIN_EXE_vectorstep"),
            s.config().display()
        ))
        .current_dir(s.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert_eq!(stdout(&o).lines().count(), 1, "{}", stdout(&o));
}

#[test]
fn payload_from_stdin_and_show_with_summaries_item_names_and_verbose() {
    let s = Scratch::new(&[("fan", FAN_OUT)]);
    let mut child = bin()
        .arg("--config")
        .arg(s.config())
        .args(["run", "fan", "--payload", "-", "--json"])
        .current_dir(s.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(br#"{"labels": {"service": "from-stdin"}}"#)
            .unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let run: Value = serde_json::from_slice(&o.stdout).unwrap();
    let id = run["id"].as_str().unwrap().to_string();
    let stored = s.store().run(&id).unwrap().unwrap();
    assert!(
        stored.context_json.contains("from-stdin"),
        "the payload read from stdin reached the trigger: {}",
        stored.context_json
    );

    let show = stdout(&s.run(&["runs", "show", &id]));
    assert!(show.contains("SUMMARY"), "{show}");
    assert!(
        show.contains("line one line two"),
        "one line per summary: {show}"
    );
    assert!(show.contains("per-service/0 (checkout)"), "{show}");
    assert!(show.contains("per-service/1 (payments)"), "{show}");
    assert!(show.contains("looked at payments"), "{show}");
    assert!(
        !show.contains("\"confidence\""),
        "no outputs without --verbose: {show}"
    );
    let verbose = stdout(&s.run(&["runs", "show", &id, "--verbose"]));
    assert!(
        verbose.contains("== per-service/1 (payments) (completed)"),
        "{verbose}"
    );
    assert!(verbose.contains("\"confidence\": 0.9"), "{verbose}");
}

#[test]
fn completions_for_each_shell() {
    let s = Scratch::new(&[]);
    for shell in ["bash", "zsh", "fish"] {
        let o = s.run(&["completions", shell]);
        assert_eq!(o.status.code(), Some(0), "{shell}: {o:?}");
        let text = stdout(&o);
        assert!(text.contains("vectorstep"), "{shell}: {text}");
        assert!(
            text.contains("replay"),
            "{shell}: subcommands are completed"
        );
    }
}

#[test]
fn validate_fails_on_unknown_filters_and_steps_and_strict_fails_on_warnings() {
    let typo_filter = "name: f\ntrigger: {}\nsteps:\n  - name: triage\n    executor: mock\n    prompt_template: |\n      Alert:\n      {{ summary | upper_case }}\n";
    let typo_step = "name: s\ntrigger: {}\nsteps:\n  - name: triage\n    executor: mock\n  - name: report\n    executor: mock\n    prompt_template: \"{{ steps.triag.summary }}\"\n";
    let later_step = "name: l\ntrigger: {}\nsteps:\n  - name: report\n    executor: mock\n    prompt_template: \"{{ steps.triage.summary }}\"\n  - name: triage\n    executor: mock\n";
    let bad_when = "name: w\ntrigger: {}\nsteps:\n  - name: a\n    executor: mock\n    when: \"labels.x is definedd\"\n";
    for (yaml, wants) in [
        (
            typo_filter,
            &[
                "f.yaml:8:",
                "error:",
                "unknown filter `upper_case`",
                "did you mean `upper`?",
            ][..],
        ),
        (
            typo_step,
            &[
                "s.yaml:8:",
                "error:",
                "`steps.triag` refers to no step",
                "did you mean `steps.triage`?",
            ][..],
        ),
        (
            bad_when,
            &[
                "error:",
                "unknown test `definedd`",
                "did you mean `defined`?",
            ][..],
        ),
    ] {
        let s = Scratch::new(&[]);
        let file = s.path().join(format!("{}.yaml", &yaml[6..7]));
        std::fs::write(&file, yaml).unwrap();
        let o = s.run(&["validate", file.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        for want in wants {
            assert!(err.contains(want), "{want:?} missing in:\n{err}");
        }
    }
    // A step that exists but runs later stays a warning; --strict fails on it.
    let s = Scratch::new(&[]);
    let file = s.path().join("l.yaml");
    std::fs::write(&file, later_step).unwrap();
    let o = s.run(&["validate", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("warning:") && err.contains("does not run before `report`"),
        "{err}"
    );
    assert!(stdout(&o).contains("1 pipelines OK"), "{}", stdout(&o));
    let o = s.run(&["validate", "--strict", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--strict"), "{err}");

    // A pipeline without `stage` that matches alerts is warned about: every alert
    // it matches would be answered skipped_testing.
    for (stage, warned) in [
        ("", true),
        ("stage: testing\n", true),
        ("stage: production\n", false),
    ] {
        let s = Scratch::new(&[]);
        let file = s.path().join("t.yaml");
        let yaml = format!("name: t\n{stage}trigger:\n  match: {{severity: critical}}\nsteps:\n  - name: a\n    executor: mock\n");
        std::fs::write(&file, yaml).unwrap();
        let o = s.run(&["validate", file.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{err}");
        assert_eq!(err.contains("skipped_testing"), warned, "{stage:?}: {err}");
    }
}

#[test]
fn run_with_a_human_step_and_nobody_to_answer_fails_fast() {
    let human = "name: ask\ntrigger: {}\nsteps:\n  - name: approve\n    executor: human\n    prompt_template: \"Restart?\"\n    timeout_seconds: 900\n";
    let s = Scratch::new(&[("ask", human)]);
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = bin()
        .arg("--config")
        .arg(s.config())
        .args(["run", "ask"])
        .env("VECTORSTEP_URL", format!("http://127.0.0.1:{port}"))
        .current_dir(s.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("has a human step") && err.contains("not a terminal"),
        "{err}"
    );
    let all = vectorstep::store::RunFilter {
        limit: 100,
        ..Default::default()
    };
    assert_eq!(s.store().runs(&all).unwrap().len(), 0, "no run was started");
}
