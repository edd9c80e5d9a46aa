//! The offline agent sample (README, docs/agents.md): the documented command is run
//! as written with the real binary, in a copy of `samples/`, and must complete with
//! the demo MCP server's tools really called; `runs show` lists the turns and tool
//! calls as a table that never passes a terminal escape through; `demo-mcp` stays
//! out of `--help`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use vectorstep::domain::ApprovalStatus;
use vectorstep::store::Store;

/// The command as README.md and docs/agents.md show it.
const DOCUMENTED: &str = "cargo run -- --config samples/agents/config.yaml run agent-triage --payload samples/alerts/checkout-crashloop.json";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The binary with `args`, in `dir`, stdin closed (no terminal: the testing stage
/// approves at the deadline), and a `PATH` without vectorstep on it, so the sample
/// must find its MCP server as the running binary itself.
fn vectorstep(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .args(args)
        .current_dir(dir)
        .env_remove("VECTORSTEP_CONFIG")
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .output()
        .expect("the binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let name = entry.file_name();
        let path = entry.path();
        if path.is_dir() {
            // A store a local run of the sample left behind is not part of it.
            if name != "data" {
                copy_tree(&path, &to.join(&name));
            }
        } else {
            std::fs::copy(&path, to.join(&name)).expect("copy");
        }
    }
}

/// A scratch copy of the repository's `samples/`, laid out as in a checkout.
fn checkout() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_tree(&repo().join("samples"), &dir.path().join("samples"));
    dir
}

/// The documented command's arguments after `cargo run --`.
fn documented_args() -> Vec<&'static str> {
    let args = DOCUMENTED
        .strip_prefix("cargo run -- ")
        .expect("the command is a `cargo run --`");
    args.split_whitespace().collect()
}

fn run_id_of(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("run ")?.split_whitespace().next())
        .unwrap_or_else(|| panic!("no `run <id>` line in:\n{stdout}"))
        .to_string()
}

#[test]
fn the_documented_command_is_in_the_readme_and_the_agents_page() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let agents = std::fs::read_to_string(repo().join("docs/agents.md")).expect("docs/agents.md");
    assert!(
        readme.contains(DOCUMENTED),
        "README.md shows `{DOCUMENTED}`"
    );
    assert!(
        agents.contains(DOCUMENTED),
        "docs/agents.md shows `{DOCUMENTED}`"
    );
    // The first two commands stay the first two.
    let first = readme
        .find("```sh\ncargo run -- run offline-demo")
        .expect("first command");
    let second = readme
        .find("```sh\nbash tests/run.sh")
        .expect("second command");
    let ours = readme.find(DOCUMENTED).expect("ours");
    assert!(first < second && second < ours);
}

#[test]
fn the_agent_sample_runs_offline_and_calls_the_demo_mcp_tools() {
    let dir = checkout();
    let out = vectorstep(dir.path(), &documented_args());
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("finished: completed"), "{stdout}");
    let id = run_id_of(&stdout);

    let store = Store::open(&dir.path().join("samples/agents/data/vectorstep.db")).expect("store");
    let journals = store.journals_of_run(&id).expect("journals");
    let calls: Vec<_> = journals.iter().flat_map(|j| j.calls.iter()).collect();
    let tools: Vec<&str> = calls.iter().map(|c| c.tool.as_str()).collect();
    assert_eq!(
        tools,
        ["get_pods", "get_logs", "restart_service"],
        "{calls:#?}"
    );
    let result = |tool: &str| -> String {
        let c = calls.iter().find(|c| c.tool == tool).expect("call");
        assert_eq!(c.status.as_str(), "completed", "{c:#?}");
        let raw = c.result_json.as_deref().expect("a result");
        serde_json::from_str::<String>(raw).expect("a text result")
    };
    // The demo server's canned answers, through the real MCP session.
    let pods = result("get_pods");
    assert!(
        pods.contains("checkout-7d9f8-x2k4p   CrashLoopBackOff"),
        "{pods}"
    );
    let logs = result("get_logs");
    assert!(logs.contains("config reload failed: timeout"), "{logs}");
    assert_eq!(result("restart_service"), "restarted checkout\n");
    // The restart waited for its approval, which the testing stage gave at the deadline.
    let approvals = store.approvals_of_run(&id).expect("approvals");
    assert_eq!(approvals.len(), 1, "{approvals:#?}");
    assert_eq!(approvals[0].status, ApprovalStatus::Approved);
    assert_eq!(approvals[0].decided_by.as_deref(), Some("deadline"));
    assert_eq!(approvals[0].step_path, "triage");
    assert!(
        approvals[0].message.contains("<b>restart_service</b>"),
        "{approvals:#?}"
    );

    // `run` already printed the turns; `runs show` prints them from the store.
    assert!(
        stdout.contains("agent step triage (k8s-triage):"),
        "{stdout}"
    );
    let show = vectorstep(
        dir.path(),
        &[
            "--config",
            "samples/agents/config.yaml",
            "runs",
            "show",
            &id,
        ],
    );
    let shown = text(&show.stdout);
    assert_eq!(show.status.code(), Some(0), "{}", text(&show.stderr));
    let table: Vec<&str> = shown
        .lines()
        .skip_while(|l| !l.starts_with("agent step triage"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(table.len(), 5, "header, three calls, the answer:\n{shown}");
    let cells = |line: &str| -> Vec<String> {
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        cells(table[0]),
        ["TURN", "TOOL", "ARGUMENTS", "OUTCOME", "DURATION", "TOKENS"]
    );
    let rows: Vec<Vec<String>> = table[1..].iter().map(|l| cells(l)).collect();
    let (turn, tool, args, outcome, tokens) = (0, 1, 2, 3, 5);
    assert_eq!(rows[0][turn], "1");
    assert_eq!(rows[0][tool], "get_pods");
    assert_eq!(rows[0][args], r#"{"namespace":"shop"}"#);
    assert_eq!(rows[0][outcome], "completed");
    assert!(rows[0][4].ends_with("ms"), "{:?}", rows[0]);
    assert_eq!(rows[0][tokens], "662");
    assert_eq!(rows[1][tool], "get_logs");
    assert_eq!(
        rows[1][args],
        r#"{"pod":"checkout-7d9f8-x2k4p","lines":20}"#
    );
    assert_eq!(rows[2][turn], "3");
    assert_eq!(rows[2][tool], "restart_service");
    assert_eq!(rows[2][outcome], "completed");
    assert_eq!(rows[2][tokens], "1346");
    assert_eq!(rows[3], ["4", "(answer)", "-", "completed", "-", "1728"]);
}

#[test]
fn the_agent_samples_validate() {
    let out = vectorstep(
        &repo(),
        &["--config", "samples/agents/config.yaml", "validate"],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(text(&out.stdout).trim(), "2 pipelines OK");
    assert!(
        !stderr.contains("error") && !stderr.contains("warning"),
        "{stderr}"
    );
}

#[test]
fn demo_mcp_is_hidden_from_help() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = vectorstep(dir.path(), &["--help"]);
    let help = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        help.contains("tools"),
        "the real commands are listed:\n{help}"
    );
    assert!(!help.contains("demo"), "{help}");
}

/// A model that puts terminal escapes in a tool call's arguments: both tables show
/// them escaped, and no ESC, CSI (C1) or BEL byte reaches the terminal.
#[test]
fn tool_arguments_are_printed_without_terminal_escapes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, body: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, body).expect("write");
    };
    write(
        "config.yaml",
        "pipeline_config_dir: ./pipelines\ndatabase: {path: ./data/db.sqlite}\n\
         providers:\n  s: {kind: scripted, script: ./script.yaml}\n\
         tools:\n  note:\n    description: note\n    parameters: {type: object, properties: {text: {type: string}}, required: [text]}\n\
         \x20   shell: {command: [echo, ok]}\n    effect: read\n\
         agents:\n  a: {provider: s, model: scripted, system_prompt: x, tools: [note]}\n",
    );
    write(
        "script.yaml",
        "turns:\n  - tool_calls:\n      - name: note\n        arguments: {text: \"\\e[2J\\x9b31m\\a\\nwiped\"}\n  - final: {confidence: 0.9, summary: done}\n",
    );
    write(
        "pipelines/p.yaml",
        "name: p\ntrigger: {}\nsteps:\n  - name: s\n    executor: agent\n    executor_config: {agent: a}\n    prompt_template: go\n",
    );
    let out = vectorstep(dir.path(), &["run", "p"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let id = run_id_of(&stdout);
    let show = vectorstep(dir.path(), &["runs", "show", &id]);
    for (what, printed) in [("run", &out.stdout), ("runs show", &show.stdout)] {
        let s = text(printed);
        assert!(
            !printed.iter().any(|b| *b == 0x1b || *b == 0x07),
            "{what} printed a raw escape:\n{s:?}"
        );
        assert!(!s.contains('\u{9b}'), "{what} printed a raw CSI:\n{s:?}");
        let row = s
            .lines()
            .find(|l| l.starts_with("1 ") && l.contains("note"))
            .unwrap_or_else(|| panic!("{what}: no row for the call:\n{s}"));
        // serde_json escapes ESC and BEL itself; the C1 CSI and the newline are ours.
        assert!(
            row.contains(r#"{"text":"\u001b[2J\u{9b}31m\u0007\nwiped"}"#),
            "{what}: {row}"
        );
    }
}
