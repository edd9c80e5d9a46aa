//! docs/quickstart.md followed as written: section 2's run, then section 4's shell
//! block (serve, start `slow-demo`, `kill -9` mid-run, `sweep --dry-run`, serve
//! again) through bash, in a copy of the repository's config, pipelines and
//! samples. The only change made to the block: `cargo build` is left out (the
//! test's binary is already built) and port 8000 becomes a free port, so a server
//! a developer runs does not answer instead. The run must end `completed` after
//! one resume, with its first step run once.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// The body of the first ```sh block after `heading` in the quickstart.
fn block_after(doc: &str, heading: &str) -> String {
    let at = doc
        .find(heading)
        .unwrap_or_else(|| panic!("the quickstart has `{heading}`"));
    let rest = &doc[at..];
    let start = rest.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let end = rest[start..].find("```").expect("the block ends");
    rest[start..start + end].to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn vectorstep(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .args(args)
        .current_dir(dir)
        .env_remove("VECTORSTEP_CONFIG")
        .env_remove("VECTORSTEP_URL")
        .output()
        .unwrap()
}

#[test]
fn the_quickstart_as_written_reaches_a_resumed_run() {
    let found = Command::new("curl").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "curl is missing: install it with `apt-get install -y curl` (bash tests/run.sh does)"
    );
    let doc = std::fs::read_to_string(repo().join("docs/quickstart.md")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let port = free_port().to_string();
    let config = std::fs::read_to_string(repo().join("config.yaml"))
        .unwrap()
        .replace("port: 8000", &format!("port: {port}"));
    std::fs::write(root.join("config.yaml"), config).unwrap();
    copy_dir(&repo().join("pipelines"), &root.join("pipelines"));
    copy_dir(&repo().join("samples"), &root.join("samples"));
    std::fs::create_dir_all(root.join("target/debug")).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_vectorstep"),
        root.join("target/debug/vectorstep"),
    )
    .unwrap();

    // Section 2, with the built binary for `cargo run --`.
    let section2 = block_after(&doc, "## 2. Run a pipeline end to end");
    let line = section2
        .trim()
        .strip_prefix("cargo run -- ")
        .expect("section 2 is one `cargo run --` line");
    let args: Vec<&str> = line.split_whitespace().collect();
    let out = vectorstep(root, &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "section 2: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("finished: completed"));

    // Section 4, as a script.
    let section4 = block_after(&doc, "## 4. Serve, and survive a kill");
    assert!(section4.contains("kill -9"), "{section4}");
    let script: String = section4
        .lines()
        .filter(|l| l.trim() != "cargo build")
        .map(|l| l.replace("8000", &port))
        .collect::<Vec<_>>()
        .join("\n");
    let out = Command::new("timeout")
        .args(["120", "bash", "-c", &script])
        .current_dir(root)
        .env_remove("VECTORSTEP_CONFIG")
        .env_remove("VECTORSTEP_URL")
        .output()
        .unwrap();
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "section 4 failed:\n{script}\n---\n{said}"
    );
    assert!(said.contains("\"status\":\"accepted\""), "{said}");

    let listed = vectorstep(root, &["runs", "list", "--pipeline", "slow-demo", "--json"]);
    let runs: Value = serde_json::from_slice(&listed.stdout).expect("runs list --json");
    let runs = runs
        .as_array()
        .cloned()
        .or_else(|| runs["runs"].as_array().cloned())
        .unwrap_or_default();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let id = runs[0]["id"].as_str().unwrap().to_string();
    let shown = vectorstep(root, &["runs", "show", &id, "--json"]);
    let run: Value = serde_json::from_slice(&shown.stdout).expect("runs show --json");
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["resume_count"], 1, "one kill, one resume: {run}");
    let steps = run["steps"].as_array().unwrap();
    let collect = steps
        .iter()
        .find(|s| s["step_name"] == "collect")
        .expect("collect");
    assert_eq!(
        collect["attempts"], 1,
        "collect finished before the kill and never ran again: {run}"
    );
    let logs = run["logs"].as_array().unwrap();
    assert!(logs.iter().any(|l| l["event"] == "run_resumed"), "{run}");
    // What section 4 says the dry run prints.
    assert!(
        said.contains("resume"),
        "sweep --dry-run says it resumes the run:\n{said}"
    );
}
