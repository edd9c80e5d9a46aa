//! `vectorstep test` through the real binary: the shipped fixtures pass; a case
//! whose expectation is wrong fails with a readable diff; a pipeline whose every
//! step has an effect (a model, an API, a shell command, an approval message, a
//! notification, a failure webhook) runs its cases with nothing reaching the
//! counting peer, no process run and no store written outside a temp folder.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::crash_support::HoldingPeer;
use common::peer::Reply;

fn vectorstep(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run vectorstep")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_shipped_fixtures_pass() {
    for pipeline in [
        "offline-demo",
        "human-approved-restart",
        "fan-out-service-health",
    ] {
        let file = format!("samples/pipelines/{pipeline}.yaml");
        let out = vectorstep(&["test", &file]);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(0), "{pipeline}:\n{said}");
        assert!(said.contains(" passed, 0 failed"), "{pipeline}:\n{said}");
        assert!(!said.contains("FAIL"), "{pipeline}:\n{said}");
    }
}

#[test]
fn a_wrong_expectation_fails_with_a_diff() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = root.join("samples/pipelines/fixtures/offline-demo/completes.yaml");
    let case = std::fs::read_to_string(&shipped)
        .unwrap()
        .replace(
            "payload_file: ../../../alerts/",
            &format!("payload_file: {}/samples/alerts/", root.display()),
        )
        .replace("status: completed", "status: failed")
        .replace(
            "\"Health of payments (2/2)\"",
            "\"Health of billing (2/2)\"",
        );
    std::fs::write(dir.path().join("wrong.yaml"), case).unwrap();
    let fixtures = dir.path().display().to_string();
    let out = vectorstep(&[
        "test",
        "samples/pipelines/offline-demo.yaml",
        "--fixtures",
        &fixtures,
    ]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("FAIL  wrong.yaml"), "{said}");
    assert!(
        said.contains("status: expected failed, got completed"),
        "{said}"
    );
    assert!(
        said.contains("prompts_contain.check-services/1: \"Health of billing (2/2)\" not in the prompt \"Health of payments (2/2)\""),
        "{said}"
    );
    assert!(said.contains("1 case(s): 0 passed, 1 failed"), "{said}");
}

#[test]
fn a_fixture_with_a_mistake_is_refused_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("typo.yaml"),
        "answers:\n  triage: {outptu: {confidence: 1.0, summary: x}}\nexpect: {status: completed}\n",
    )
    .unwrap();
    let fixtures = dir.path().display().to_string();
    let out = vectorstep(&[
        "test",
        "samples/pipelines/offline-demo.yaml",
        "--fixtures",
        &fixtures,
    ]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("typo.yaml:2:") && said.contains("unknown key `outptu`"),
        "{said}"
    );
    assert!(said.contains("did you mean `output`?"), "{said}");
}

/// A pipeline in which every step would reach `peer` or run a process.
fn effects_pipeline(peer: &str, marker: &Path) -> String {
    format!(
        r#"name: effects
stage: production
trigger: {{match: {{source: generic}}}}
steps:
  - name: ask-model
    executor: agent
    executor_config: {{agent: triage}}
    prompt_template: "What is wrong with {{{{ labels.service }}}}?"
  - name: touch
    executor: shell
    executor_config: {{command: ["touch", "{marker}"]}}
  - name: call-api
    executor: webhook
    executor_config: {{url: "{peer}/api", method: POST}}
    prompt_template: '{{"service": "x"}}'
    on_failure:
      policy: abort
      webhook: {{url: "{peer}/failed", method: POST}}
  - name: approve
    executor: human
    timeout_seconds: 60
    prompt_template: "Restart {{{{ labels.service }}}}?"
  - name: tell
    executor: notify
    executor_config: {{channel: webhook, url: "{peer}/notify"}}
    prompt_template: "restarted {{{{ labels.service }}}}"
notifications:
  escalate:
    channel: webhook
    template: "escalated at {{{{ current_step }}}}"
    config: {{url: "{peer}/escalate"}}
  abort:
    channel: webhook
    template: "aborted at {{{{ current_step }}}}"
    config: {{url: "{peer}/abort"}}
"#,
        marker = marker.display()
    )
}

const APPROVED: &str = r#"description: approved, everything answered
trigger: {labels: {service: checkout}}
answers:
  ask-model: {output: {confidence: 0.9, summary: "bad deploy"}, usage: {input_tokens: 100, output_tokens: 10}}
  touch: {output: {confidence: 1.0, summary: "touched"}}
  call-api: {output: {confidence: 1.0, summary: "accepted"}}
  approve: {decision: approve}
expect:
  status: completed
  steps_run: [ask-model, touch, call-api, approve, tell]
  prompts_contain: {ask-model: "What is wrong with checkout?", approve: "Restart checkout?", tell: "restarted checkout"}
  notifications: [webhook]
"#;

const API_FAILS: &str = r#"description: the API call fails; the failure webhook and the abort notification are recorded, not sent
trigger: {labels: {service: checkout}}
answers:
  ask-model: {output: {confidence: 0.9, summary: "bad deploy"}}
  touch: {output: {confidence: 1.0, summary: "touched"}}
  call-api: {fail: "HTTP 503"}
expect:
  status: failed
  step_status: {call-api: failed}
  steps_skipped: [approve, tell]
"#;

const NO_DECISION: &str = r#"description: the human step has no decision in the case
trigger: {labels: {service: checkout}}
answers:
  ask-model: {output: {confidence: 0.9, summary: "bad deploy"}}
  touch: {output: {confidence: 1.0, summary: "touched"}}
  call-api: {output: {confidence: 1.0, summary: "accepted"}}
expect: {status: completed}
"#;

/// `vectorstep test effects` with the config and fixtures of `root`, off the runtime.
async fn test_effects(root: &Path) -> Output {
    let config = root.join("config.yaml").display().to_string();
    let fixtures = root.join("fixtures").display().to_string();
    tokio::task::spawn_blocking(move || {
        vectorstep(&[
            "--config",
            &config,
            "test",
            "effects",
            "--fixtures",
            &fixtures,
        ])
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_leaves_the_process() {
    let peer = HoldingPeer::answering(Reply::ok()).await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let marker = root.join("touched-by-the-shell-step");
    let db = root.join("data").join("vectorstep.db");
    std::fs::create_dir_all(root.join("pipelines")).unwrap();
    std::fs::create_dir_all(root.join("fixtures")).unwrap();
    std::fs::write(
        root.join("config.yaml"),
        format!(
            "pipeline_config_dir: {pipelines:?}\nstep_library_dir: {steps:?}\ndatabase: {{path: {db:?}}}\n\
             providers: {{fake: {{base_url: \"{url}/v1\", api_key: k}}}}\n\
             agents: {{triage: {{provider: fake, model: m}}}}\n\
             human_approval: {{default: {{channel: webhook, url: \"{url}/approval\"}}}}\n",
            pipelines = root.join("pipelines").display().to_string(),
            steps = root.join("steps").display().to_string(),
            db = db.display().to_string(),
            url = peer.url(),
        ),
    )
    .unwrap();
    std::fs::write(
        root.join("pipelines").join("effects.yaml"),
        effects_pipeline(&peer.url(), &marker),
    )
    .unwrap();
    for (name, case) in [("approved.yaml", APPROVED), ("api-fails.yaml", API_FAILS)] {
        std::fs::write(root.join("fixtures").join(name), case).unwrap();
    }
    let out = test_effects(root).await;
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("2 case(s): 2 passed, 0 failed"), "{said}");
    assert_eq!(
        peer.count(),
        0,
        "the peer was called: {:?}",
        peer.requests()
    );
    assert!(!marker.exists(), "the shell step ran");
    assert!(!db.exists(), "the configured store was written");

    // A human step the case does not decide fails the case at once, saying what to add.
    std::fs::write(root.join("fixtures").join("no-decision.yaml"), NO_DECISION).unwrap();
    let out = test_effects(root).await;
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("step `approve` asks a human and the case has no decision; add `answers: {approve: {decision: approve}}`"),
        "{said}"
    );
    assert!(said.contains("3 case(s): 2 passed, 1 failed"), "{said}");
    assert_eq!(
        peer.count(),
        0,
        "the peer was called: {:?}",
        peer.requests()
    );
}
