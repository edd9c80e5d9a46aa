//! `logging.format: json` through the real server: every line `serve` writes to
//! stderr and stdout parses as JSON, from the config warning printed before the
//! subscriber exists to the last line of the drain; lists and maps are logged as
//! JSON, not as Debug text; an approval decision is an INFO line saying who.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const GATE: &str = "name: gate\nstage: production\ntrigger: {match: {source: generic}}\nsteps:\n  - {name: ask, executor: human, timeout_seconds: 60, prompt_template: \"Go on?\"}\n";
/// `first` names a step that runs later: a load warning, not an error.
const LATER_REF: &str = "name: early\nstage: production\ntrigger: {match: {source: generic}}\nsteps:\n  - {name: first, executor: mock, prompt_template: \"{{ steps.second.summary }}\"}\n  - {name: second, executor: mock}\n";
const ADDED: &str = "name: added\nstage: production\ntrigger: {match: {source: generic}}\nsteps:\n  - {name: a, executor: mock}\n";

fn spawn(root: &Path) -> Child {
    let stdout = std::fs::File::create(root.join("stdout.log")).unwrap();
    let stderr = std::fs::File::create(root.join("stderr.log")).unwrap();
    Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .args(["--config", "config.yaml", "serve"])
        .current_dir(root)
        .env_remove("VECTORSTEP_CONFIG")
        .env_remove("RUST_LOG")
        .env_remove("VS_TEST_UNSET_SUFFIX")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("spawn serve")
}

/// The port from the JSON listening line on stdout; kills `child` if none comes.
fn port_of(root: &Path, child: &mut Child) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(root.join("stdout.log")).unwrap_or_default();
        let port = text.lines().find_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            v["fields"]["address"]
                .as_str()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()
        });
        if let Some(port) = port {
            return port;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "no JSON listening line on stdout: {text}\n{}",
                std::fs::read_to_string(root.join("stderr.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn lines(path: &Path) -> Vec<Value> {
    BufReader::new(std::fs::File::open(path).unwrap())
        .lines()
        .map_while(Result::ok)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(&l)
                .unwrap_or_else(|e| panic!("not JSON ({e}) in {}: {l}", path.display()))
        })
        .collect()
}

fn find<'a>(lines: &'a [Value], message: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(message))
        })
        .unwrap_or_else(|| panic!("no line saying {message:?} in {lines:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_format_json_every_line_is_json() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("pipelines")).unwrap();
    std::fs::write(root.join("pipelines/gate.yaml"), GATE).unwrap();
    std::fs::write(root.join("pipelines/early.yaml"), LATER_REF).unwrap();
    std::fs::write(
        root.join("config.yaml"),
        "server: {host: 127.0.0.1, port: 0}\npipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\n\
         database: {path: ./data/vectorstep.db}\nlogging: {level: info, format: json}\n\
         human_approval: {ui_base_url: \"http://127.0.0.1:8000/${VS_TEST_UNSET_SUFFIX}\"}\n",
    )
    .unwrap();
    let mut child = spawn(root);
    let port = port_of(root, &mut child);
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");
    let http = reqwest::Client::new();

    // An Alertmanager notification nobody takes: logged with its labels.
    let answer = http
        .post(url("/webhook?source=alertmanager"))
        .json(&json!({"status": "firing", "alerts": [{"status": "firing", "labels": {"alertname": "Nobody", "team": "x"}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    // A decided approval.
    let run: Value = http
        .post(url("/pipelines/gate/run"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = run["run_id"].as_str().expect("run_id").to_string();
    let token = loop {
        let list: Value = http
            .get(url("/approvals"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(t) = list["approvals"][0]["token"].as_str() {
            break t.to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let decided = http
        .post(url(&format!("/approvals/{token}")))
        .json(&json!({"decision": "approve", "by": "alice"}))
        .send()
        .await
        .unwrap();
    assert_eq!(decided.status().as_u16(), 200);
    // A reload that adds a pipeline.
    std::fs::write(root.join("pipelines/added.yaml"), ADDED).unwrap();
    let reloaded = http.post(url("/-/reload")).send().await.unwrap();
    assert_eq!(reloaded.status().as_u16(), 200);

    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = child.wait().unwrap();
    assert!(status.success(), "serve exited with {status}");

    let err = lines(&root.join("stderr.log"));
    let out = lines(&root.join("stdout.log"));
    assert!(err.len() > 5, "{err:#?}");
    let unset = find(&err, "VS_TEST_UNSET_SUFFIX");
    assert_eq!(unset["level"], "WARN", "{unset}");
    assert_eq!(
        unset["fields"]["line"], 6,
        "at the line that uses it: {unset}"
    );
    let later = find(&err, "steps.second");
    assert_eq!(later["level"], "WARN", "{later}");
    assert!(
        later["fields"]["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("early.yaml")),
        "{later}"
    );
    assert_eq!(later["fields"]["line"], 5, "{later}");
    let unmatched = find(&err, "Webhook matched no pipeline.");
    assert_eq!(
        unmatched["fields"]["labels"]["alertname"], "Nobody",
        "{unmatched}"
    );
    let decision = find(&err, "Approval approved by alice.");
    assert_eq!(decision["level"], "INFO", "{decision}");
    assert_eq!(decision["fields"]["by"], "alice", "{decision}");
    assert_eq!(decision["fields"]["run_id"], run_id.as_str(), "{decision}");
    assert_eq!(decision["fields"]["step"], "ask", "{decision}");
    assert_eq!(decision["fields"]["decision"], "approved", "{decision}");
    let reload = find(&err, "Pipelines reloaded.");
    assert_eq!(reload["fields"]["added"], json!(["added"]), "{reload}");
    assert_eq!(reload["fields"]["removed"], json!([]), "{reload}");
    find(&err, "Stopped.");
    let listening = find(&out, "vectorstep listening on http://127.0.0.1:");
    assert_eq!(listening["level"], "INFO", "{listening}");
}

#[test]
fn a_refused_start_says_why_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("pipelines")).unwrap();
    std::fs::write(
        root.join("pipelines/broken.yaml"),
        "name: broken\nsteps: 3\n",
    )
    .unwrap();
    std::fs::write(
        root.join("config.yaml"),
        "server: {host: 127.0.0.1, port: 0}\npipeline_config_dir: ./pipelines\nstep_library_dir: ./steps\n\
         database: {path: ./data/vectorstep.db}\nlogging: {format: json}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .args(["--config", "config.yaml", "serve"])
        .current_dir(root)
        .env_remove("VECTORSTEP_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stderr);
    let all: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        all.iter().any(|l| l["level"] == "ERROR"
            && l["fields"]["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("broken.yaml"))),
        "{text}"
    );
    assert!(
        all.iter().any(|l| l["level"] == "ERROR"
            && l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("nothing was loaded"))),
        "{text}"
    );
}
