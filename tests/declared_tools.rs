//! Declared tools (SPEC 10) against real peers: a local HTTP server that counts
//! and records every call, and real child processes that write down the argv
//! they were given. The tools are declared in a real `config.yaml`, so what is
//! tested is what an operator writes.

mod common;
use common::support::{FakeServer, Reply};

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vectorstep::agent::declared::{self, CallIdentity, Error, ToolOutput};
use vectorstep::config::Config;
use vectorstep::executor::http;

fn config(dir: &Path, text: &str) -> Config {
    let p = dir.join("config.yaml");
    std::fs::write(&p, text).unwrap();
    match Config::load(&p, true) {
        Ok((c, _)) => c,
        Err(e) => panic!("config does not load: {e}"),
    }
}

fn webhook_config(dir: &Path, url: &str) -> Config {
    config(
        dir,
        &format!(
            "tools:
  restart_service:
    description: Restart one deployment
    parameters:
      type: object
      properties: {{service: {{type: string}}, force: {{type: boolean}}}}
      required: [service]
      additionalProperties: false
    webhook: {{url: \"{url}/restart\", headers: {{X-Team: sre}}, timeout_seconds: 2}}
"
        ),
    )
}

async fn call(
    c: &Config,
    tool: &str,
    args: Value,
    key: &str,
    attempt: u32,
) -> Result<ToolOutput, Error> {
    let id = CallIdentity {
        effect_key: key,
        attempt,
    };
    declared::run(&http::client(), &c.tools[tool], &args, id).await
}

const KEY: &str = "run-1:investigate:1:2:1";

#[tokio::test]
async fn a_webhook_tool_posts_its_arguments_with_the_effect_key() {
    let dir = tempfile::tempdir().unwrap();
    let peer = FakeServer::start(vec![Reply::text(200, "restarted checkout")]).await;
    let c = webhook_config(dir.path(), &peer.url());
    let args = json!({"service": "checkout", "force": true});

    let out = call(&c, "restart_service", args.clone(), KEY, 1)
        .await
        .unwrap();

    assert_eq!(
        out,
        ToolOutput {
            text: "restarted checkout".into(),
            failed: false
        }
    );
    assert_eq!(peer.count(), 1);
    let r = &peer.requests()[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/restart"));
    assert_eq!(r.header("Idempotency-Key"), Some(KEY));
    assert_eq!(r.header("X-Vectorstep-Attempt"), Some("1"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("X-Team"), Some("sre"));
    assert_eq!(r.json(), args);

    // Run again after a crash: the same key, the next attempt.
    call(&c, "restart_service", args, KEY, 2).await.unwrap();
    assert_eq!(peer.count(), 2);
    let r = &peer.requests()[1];
    assert_eq!(r.header("Idempotency-Key"), Some(KEY));
    assert_eq!(r.header("X-Vectorstep-Attempt"), Some("2"));
}

#[tokio::test]
async fn a_webhook_error_status_is_a_failed_result_with_an_excerpt() {
    let dir = tempfile::tempdir().unwrap();
    let peer = FakeServer::start(vec![Reply::text(503, "deploy controller unavailable")]).await;
    let c = webhook_config(dir.path(), &peer.url());

    let out = call(&c, "restart_service", json!({"service": "api"}), KEY, 1)
        .await
        .unwrap();

    assert!(out.failed);
    assert_eq!(out.text, "HTTP 503: deploy controller unavailable");
    assert_eq!(peer.count(), 1);
}

#[tokio::test]
async fn arguments_that_do_not_fit_the_schema_never_reach_the_peer() {
    let dir = tempfile::tempdir().unwrap();
    let peer = FakeServer::start(vec![]).await;
    let c = webhook_config(dir.path(), &peer.url());

    let out = call(
        &c,
        "restart_service",
        json!({"service": 42, "all": true}),
        KEY,
        1,
    )
    .await
    .unwrap();

    assert!(out.failed);
    assert!(
        out.text
            .starts_with("invalid arguments for `restart_service`:"),
        "{}",
        out.text
    );
    assert!(
        out.text
            .contains("argument `service`: expected string, got integer"),
        "{}",
        out.text
    );
    assert!(out.text.contains("unknown argument `all`"), "{}", out.text);
    assert_eq!(peer.count(), 0);
}

#[tokio::test]
async fn an_unreachable_webhook_is_an_error_not_a_result() {
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = webhook_config(dir.path(), &format!("http://127.0.0.1:{port}"));

    let err = call(&c, "restart_service", json!({"service": "api"}), KEY, 1)
        .await
        .unwrap_err();

    assert!(matches!(err, Error::Transport { .. }), "{err:?}");
    assert!(err.is_retriable());
    assert!(
        err.to_string()
            .starts_with("tool `restart_service`: POST to http://127.0.0.1:"),
        "{err}"
    );
}

/// A script that writes each argument it got on its own line, then its effect
/// key and attempt, to `record`, and prints `out` (or fails with `err`).
fn recorder(dir: &Path) -> String {
    let script = dir.join("record.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nrecord=\"$1\"; shift\nfor a in \"$@\"; do printf 'arg:%s\\n' \"$a\"; done > \"$record\"\n\
         printf 'key:%s\\nattempt:%s\\n' \"$VECTORSTEP_IDEMPOTENCY_KEY\" \"$VECTORSTEP_ATTEMPT\" >> \"$record\"\n\
         if [ \"$1\" = fail ]; then echo 'kubectl: deployment not found' >&2; exit 3; fi\n\
         echo \"restarted $1\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script.display().to_string()
}

fn shell_config(dir: &Path) -> Config {
    let script = recorder(dir);
    let record = dir.join("argv.txt").display().to_string();
    config(
        dir,
        &format!(
            "tools:
  restart_service:
    description: Restart one deployment
    parameters: {{type: object, properties: {{service: {{type: string}}}}, required: [service]}}
    shell: {{command: [\"{script}\", \"{record}\", \"{{{{ args.service }}}}\", \"deploy/{{{{ args.service }}}}\"]}}
  hang:
    description: Never finishes
    parameters: {{type: object}}
    shell: {{command: [\"/bin/sh\", \"-c\", \"sleep 30 & echo $! > {dir}/child.pid; wait\"], timeout_seconds: 0.5}}
",
            dir = dir.display()
        ),
    )
}

#[tokio::test]
async fn shell_metacharacters_in_an_argument_stay_one_literal_argv_entry() {
    let dir = tempfile::tempdir().unwrap();
    let c = shell_config(dir.path());
    let pwned = dir.path().join("pwned");
    let evil = format!(
        "x; touch {p} && $(touch {p}) `touch {p}` | tee {p}",
        p = pwned.display()
    );

    let out = call(&c, "restart_service", json!({"service": evil}), KEY, 1)
        .await
        .unwrap();

    assert!(!out.failed, "{}", out.text);
    assert_eq!(out.text, format!("restarted {evil}\n"));
    let record = std::fs::read_to_string(dir.path().join("argv.txt")).unwrap();
    assert_eq!(
        record,
        format!("arg:{evil}\narg:deploy/{evil}\nkey:{KEY}\nattempt:1\n"),
        "two arguments, each exactly as rendered"
    );
    assert!(!pwned.exists(), "an argument reached a shell");
}

#[tokio::test]
async fn an_argument_a_command_prints_but_the_model_left_out_is_told_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = shell_config(dir.path());
    // The schema allows it (no `required`), the template needs it.
    if let Some(t) = c.tools.get_mut("restart_service") {
        t.parameters = json!({"type": "object"});
    }

    let out = call(&c, "restart_service", json!({}), KEY, 1)
        .await
        .unwrap();

    assert!(out.failed);
    assert!(
        out.text
            .starts_with("cannot run `restart_service`: cannot render `command[2]`"),
        "{}",
        out.text
    );
    assert!(!dir.path().join("argv.txt").exists(), "the command ran");
}

#[tokio::test]
async fn a_failing_command_is_a_failed_result_with_its_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let c = shell_config(dir.path());

    let out = call(&c, "restart_service", json!({"service": "fail"}), KEY, 3)
        .await
        .unwrap();

    assert!(out.failed);
    assert_eq!(out.text, "exit status 3: kubectl: deployment not found");
    let record = std::fs::read_to_string(dir.path().join("argv.txt")).unwrap();
    assert!(record.ends_with("attempt:3\n"), "{record}");
}

#[tokio::test]
async fn a_shell_tool_past_its_timeout_is_killed_with_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let c = shell_config(dir.path());
    let started = Instant::now();

    let err = call(&c, "hang", json!({}), KEY, 1).await.unwrap_err();

    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::TimedOut { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("timed out after 0.5s and was killed"),
        "{err}"
    );
    let pid = std::fs::read_to_string(dir.path().join("child.pid")).unwrap();
    let pid = pid.trim();
    // The grandchild (`sleep 30`) died with the group: gone, or a zombie waiting
    // for a reaper.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit(") ").next().and_then(|r| r.chars().next()));
        match state {
            None | Some('Z') | Some('X') => break,
            Some(s) if Instant::now() > deadline => panic!("sleep {pid} still alive (state {s})"),
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
