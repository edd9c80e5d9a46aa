//! The config fingerprint (SPEC 6.7) changes exactly when what runs, in which
//! order, on which executor and agent changes, and stays put for every other edit,
//! so tuning a prompt or a threshold never blocks a durable run's resume.

use std::path::{Path, PathBuf};
use std::process::Command;

use vectorstep::config::{Agent, Config};
use vectorstep::pipeline;

/// Every kind of unit, each field the fingerprint must ignore set at least once.
const BASE: &str = r#"name: fp
description: base description
trigger: {}
budget: {max_tokens: 1000}
notifications:
  escalate:
    - channel: log
      template: "escalated {{ step_summary }}"
steps:
  - name: triage
    executor: agent
    executor_config: {agent: triage-agent}
    prompt_template: "Triage {{ labels.alertname }}"
    confidence_threshold: 0.7
    retry: {attempts: 2, backoff: fixed, delay_seconds: 1}
    on_failure: continue
  - name: check
    executor: mock
    executor_config:
      output: {confidence: 0.9, summary: "ok", next_step_context: "", services: [a, b]}
    when: "steps.triage.confidence < 0.9"
    loop_until: {confidence: 0.8, max_iterations: 3}
  - parallel:
      name: gather
      join: all_must_pass
      steps:
        - name: logs
          executor: mock
          executor_config: {output: {confidence: 0.9, summary: "l", next_step_context: ""}}
        - name: metrics
          executor: agent
          executor_config: {agent: triage-agent}
          prompt_template: "metrics for {{ labels.service }}"
  - fan_out:
      name: per-service
      over: "{{ steps.check.services | tojson }}"
      max_items: 5
      executor: mock
      executor_config: {output: {confidence: 0.9, summary: "s", next_step_context: ""}}
"#;

const TRIAGE: &str = r#"  - name: triage
    executor: agent
    executor_config: {agent: triage-agent}
    prompt_template: "Triage {{ labels.alertname }}"
    confidence_threshold: 0.7
    retry: {attempts: 2, backoff: fixed, delay_seconds: 1}
    on_failure: continue
"#;

const CHECK: &str = r#"  - name: check
    executor: mock
    executor_config:
      output: {confidence: 0.9, summary: "ok", next_step_context: "", services: [a, b]}
    when: "steps.triage.confidence < 0.9"
    loop_until: {confidence: 0.8, max_iterations: 3}
"#;

const EXTRA_STEP: &str = r#"  - name: extra
    executor: mock
    executor_config: {output: {confidence: 0.9, summary: "x", next_step_context: ""}}
"#;

const EXTRA_BRANCH: &str = r#"        - name: traces
          executor: mock
          executor_config: {output: {confidence: 0.9, summary: "t", next_step_context: ""}}
"#;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixture_config_path() -> PathBuf {
    repo().join("tests/fixtures/config.yaml")
}

/// The fixture config plus a second agent, so "another agent" is a valid edit.
fn config() -> Config {
    let (mut c, _) = Config::load(&fixture_config_path(), true).expect("fixture config");
    let mut other: Agent = c.agents["triage-agent"].clone();
    other.model = "other-model".into();
    c.agents.insert("other-agent".into(), other);
    c
}

/// Writes `yaml` as the only pipeline of a fresh folder and returns its path.
fn write(dir: &tempfile::TempDir, yaml: &str) -> PathBuf {
    let p = dir.path().join("p.yaml");
    std::fs::write(&p, yaml).unwrap();
    p
}

fn fingerprint_of(yaml: &str, config: &Config) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, yaml);
    let (set, d) = pipeline::load(&[path], config);
    let set = set.unwrap_or_else(|| panic!("does not load:\n{d}\n{yaml}"));
    assert_eq!(set.len(), 1);
    let fp = set.pipelines[0].fingerprint.clone();
    assert_eq!(fp.len(), 64, "{fp}");
    assert!(
        fp.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')),
        "not lowercase hex: {fp}"
    );
    fp
}

/// Applies one textual edit to BASE; `from` must occur exactly once.
fn edit(from: &str, to: &str) -> String {
    assert_eq!(BASE.matches(from).count(), 1, "edit anchor {from:?}");
    BASE.replacen(from, to, 1)
}

fn check(label: &str, base: &str, edited: &str, should_change: bool, config: &Config) {
    assert_ne!(base, edited, "{label}: the edit changed nothing");
    let (a, b) = (fingerprint_of(base, config), fingerprint_of(edited, config));
    if should_change {
        assert_ne!(a, b, "{label}: the fingerprint should change");
    } else {
        assert_eq!(a, b, "{label}: the fingerprint should not change");
    }
}

#[test]
fn fingerprint_follows_what_runs_and_nothing_else() {
    let config = config();
    let changes: Vec<(&str, String)> = vec![
        // Plain steps.
        ("step added", format!("{BASE}{EXTRA_STEP}")),
        // (A reference to a step that does not exist is a load error.)
        (
            "step removed",
            edit(CHECK, "").replace("steps.check.services", "steps.triage.services"),
        ),
        (
            "step renamed",
            edit("- name: check\n", "- name: verify\n").replace("steps.check.", "steps.verify."),
        ),
        ("steps reordered", edit(&format!("{TRIAGE}{CHECK}"), &format!("{CHECK}{TRIAGE}"))),
        (
            "step executor",
            edit("- name: check\n    executor: mock", "- name: check\n    executor: human"),
        ),
        // `gateway` runs the same kind as `agent`, but the name as written counts.
        (
            "step executor alias",
            edit("- name: triage\n    executor: agent", "- name: triage\n    executor: gateway"),
        ),
        (
            "step agent",
            edit(
                "executor: agent\n    executor_config: {agent: triage-agent}",
                "executor: agent\n    executor_config: {agent: other-agent}",
            ),
        ),
        // Parallel groups: the branch path is `group/branch`.
        ("group renamed", edit("name: gather", "name: collect")),
        ("branch renamed", edit("- name: logs", "- name: log-lines")),
        ("branch added", edit("        - name: metrics\n", &format!("{EXTRA_BRANCH}        - name: metrics\n"))),
        ("branch removed", edit("        - name: logs\n          executor: mock\n          executor_config: {output: {confidence: 0.9, summary: \"l\", next_step_context: \"\"}}\n", "")),
        (
            "branch executor",
            edit("- name: logs\n          executor: mock", "- name: logs\n          executor: human"),
        ),
        (
            "branch agent",
            edit(
                "- name: metrics\n          executor: agent\n          executor_config: {agent: triage-agent}",
                "- name: metrics\n          executor: agent\n          executor_config: {agent: other-agent}",
            ),
        ),
        // Fan-outs.
        ("fan-out renamed", edit("name: per-service", "name: per-svc")),
        (
            "fan-out executor",
            edit("max_items: 5\n      executor: mock", "max_items: 5\n      executor: human"),
        ),
    ];
    let same: Vec<(&str, String)> = vec![
        ("prompt_template", edit("Triage {{ labels.alertname }}", "Look at {{ labels.service }}")),
        ("branch prompt_template", edit("metrics for {{ labels.service }}", "metrics")),
        ("confidence_threshold", edit("confidence_threshold: 0.7", "confidence_threshold: 0.95")),
        ("confidence_threshold added", edit("max_iterations: 3}\n", "max_iterations: 3}\n    confidence_threshold: 0.2\n")),
        ("when", edit("when: \"steps.triage.confidence < 0.9\"", "when: \"steps.triage.confidence > 0.1\"")),
        ("when removed", edit("    when: \"steps.triage.confidence < 0.9\"\n", "")),
        ("retry", edit("retry: {attempts: 2, backoff: fixed, delay_seconds: 1}", "retry: {attempts: 7, backoff: exponential, delay_seconds: 30}")),
        ("retry removed", edit("    retry: {attempts: 2, backoff: fixed, delay_seconds: 1}\n", "")),
        ("budget", edit("budget: {max_tokens: 1000}", "budget: {max_tokens: 5, max_usd: 0.5}")),
        ("budget removed", edit("budget: {max_tokens: 1000}\n", "")),
        ("loop_until", edit("loop_until: {confidence: 0.8, max_iterations: 3}", "loop_until: {confidence: 0.99, max_iterations: 9}")),
        ("on_failure", edit("on_failure: continue", "on_failure: abort")),
        ("description", edit("description: base description", "description: something else entirely")),
        ("notifications", edit("template: \"escalated {{ step_summary }}\"", "template: \"paging: {{ step_summary }}\"")),
        ("notifications removed", edit("notifications:\n  escalate:\n    - channel: log\n      template: \"escalated {{ step_summary }}\"\n", "")),
        ("fan-out over", edit("over: \"{{ steps.check.services | tojson }}\"", "over: \"[\\\"x\\\", \\\"y\\\"]\"")),
        ("fan-out max_items", edit("max_items: 5", "max_items: 50")),
        ("join", edit("join: all_must_pass", "join: any_must_pass")),
        ("mock output", edit("summary: \"ok\"", "summary: \"changed\"")),
    ];
    for (label, edited) in &changes {
        check(label, BASE, edited, true, &config);
    }
    for (label, edited) in &same {
        check(label, BASE, edited, false, &config);
    }
}

#[test]
fn fingerprint_is_stable_across_loads_and_file_names() {
    let config = config();
    let a = fingerprint_of(BASE, &config);
    let b = fingerprint_of(BASE, &config);
    assert_eq!(a, b);
    // The pipeline's own name and file do not feed it either.
    assert_eq!(
        a,
        fingerprint_of(&edit("name: fp\n", "name: fp-renamed\n"), &config)
    );
}

#[test]
fn cli_prints_the_same_fingerprint() {
    // The binary gets the plain fixture config, so use only `triage-agent`.
    let (config, _) = Config::load(&fixture_config_path(), true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, BASE);
    let (set, d) = pipeline::load(std::slice::from_ref(&path), &config);
    let want = set.unwrap_or_else(|| panic!("{d}")).pipelines[0]
        .fingerprint
        .clone();
    let out = Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .current_dir(repo())
        .env_remove("VECTORSTEP_CONFIG")
        .args(["--config", "tests/fixtures/config.yaml", "fingerprint"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{want}\n"));
}
