//! `vectorstep schema [pipeline|config]` through the real binary: the schemas it
//! prints accept every shipped pipeline and config file, and reject the invalid
//! fixtures whose mistake a JSON Schema can express.
//!
//! YAML is read with the crate's own parser (`vectorstep::yaml`, the tree the
//! decoders see) and checked with the `jsonschema` crate the engine already uses.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use serde_json::Value;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The binary, run in an empty folder: no config.yaml is there to be read.
fn run(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().expect("a scratch folder");
    Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .args(args)
        .current_dir(dir.path())
        .env_remove("VECTORSTEP_CONFIG")
        .output()
        .expect("the binary runs")
}

fn schema(args: &[&str]) -> jsonschema::Validator {
    let o = run(args);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {o:?}");
    let schema: Value = serde_json::from_slice(&o.stdout).expect("the schema is JSON");
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    jsonschema::validator_for(&schema).expect("the schema compiles")
}

/// The file as the decoders see it, as JSON; `None` when it is not YAML.
fn document(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).expect("read the file");
    let name: Arc<str> = Arc::from(path.display().to_string());
    vectorstep::yaml::parse(&name, &text)
        .ok()
        .map(|n| n.to_json())
}

/// The schema's complaints about `path`, one line each.
fn problems(v: &jsonschema::Validator, path: &Path) -> Vec<String> {
    let doc = document(path).unwrap_or_else(|| panic!("{} is not YAML", path.display()));
    v.iter_errors(&doc)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(repo().join(dir))
        .unwrap_or_else(|e| panic!("read {dir}: {e}"))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    out.sort();
    out
}

#[test]
fn the_pipeline_schema_accepts_every_shipped_pipeline() {
    let v = schema(&["schema"]);
    let mut files = Vec::new();
    for dir in ["samples/pipelines", "samples/agents/pipelines", "pipelines"] {
        files.extend(yaml_files(dir));
    }
    // Files that load with warnings only must be accepted too.
    for f in [
        "warnings/verifier-and-grounding.yaml",
        "warnings/forward-step-reference.yaml",
        "executor-config-warnings/misspelt-key.yaml",
        "duplicate-names/a.yaml",
        "duplicate-names/b.yaml",
    ] {
        files.push(repo().join("tests/fixtures").join(f));
    }
    assert!(files.len() >= 20, "found only {} files", files.len());
    let mut failures = Vec::new();
    for f in &files {
        let p = problems(&v, f);
        if !p.is_empty() {
            failures.push(format!("{}:\n  {}", f.display(), p.join("\n  ")));
        }
    }
    assert!(failures.is_empty(), "rejected:\n{}", failures.join("\n"));
}

#[test]
fn the_config_schema_accepts_the_shipped_configs() {
    let v = schema(&["schema", "config"]);
    for f in [
        "config.yaml",
        "samples/agents/config.yaml",
        "tests/fixtures/config.yaml",
    ] {
        let p = problems(&v, &repo().join(f));
        assert!(p.is_empty(), "{f} rejected:\n{}", p.join("\n"));
    }
}

/// Invalid fixtures whose first mistake a schema expresses (unknown key, wrong
/// type, bad enum word, missing required key, out of range).
const REJECTED: &[&str] = &[
    "agent-missing",
    "bad-durable-policy",
    "bad-join",
    "bad-match-operator",
    "bad-on-empty",
    "bad-on-failure-string",
    "bad-on-low-confidence",
    "bad-stage",
    "branch-retry-not-allowed",
    "budget-without-limit",
    "budget-zero-limit",
    "fan-out-max-items-zero",
    "fan-out-missing-over",
    "loop-confidence-out-of-range",
    "loop-max-iterations-zero",
    "missing-executor",
    "missing-name",
    "mock-fail-wrong-type",
    "notification-missing-template",
    "notify-unknown-channel",
    "parallel-missing-steps",
    "retry-attempts-zero",
    "retry-bad-backoff",
    "shell-command-string",
    "shell-env-not-a-mapping",
    "step-missing-name",
    "threshold-out-of-range",
    "unknown-executor",
    "unknown-key-typo",
    "unknown-top-level-key",
    "webhook-missing-url",
    "wrong-type-steps",
    "wrong-type-threshold",
];

/// Invalid fixtures a schema accepts, and why it cannot do better.
const NOT_EXPRESSIBLE: &[(&str, &str)] = &[
    ("agent-unknown", "the agent names live in config.yaml, another file"),
    ("bad-cron", "cron syntax needs a cron parser, not a pattern"),
    ("bad-match-regex", "no keyword compiles a Rust regex (`format: regex` is ECMA-262 and an annotation in editors)"),
    ("bad-template-notification", "Jinja syntax is checked by compiling the template"),
    ("bad-template-over", "Jinja syntax is checked by compiling the template"),
    ("bad-template-payload", "Jinja syntax is checked by compiling the template"),
    ("bad-template-prompt", "Jinja syntax is checked by compiling the template"),
    ("bad-when", "a `when` expression is checked by compiling it"),
    ("duplicate-branch-name", "uniqueness of one field across list items (uniqueItems compares whole items)"),
    ("duplicate-step-name", "uniqueness of one field across list items (uniqueItems compares whole items)"),
    ("subpipeline-unknown", "the pipeline names live in the other files of the folder"),
    ("unknown-use", "the library step names live in the step library folder"),
    ("yaml-syntax-error", "not YAML: there is no document to validate"),
];

#[test]
fn the_pipeline_schema_rejects_the_invalid_fixtures_it_can() {
    let v = schema(&["schema", "pipeline"]);
    let files = yaml_files("tests/fixtures/invalid");
    let mut failures = Vec::new();
    for f in &files {
        let name = f.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        let rejected = REJECTED.contains(&name);
        let reason = NOT_EXPRESSIBLE.iter().find(|(n, _)| *n == name);
        let Some(doc) = document(f) else {
            if reason.is_none() {
                failures.push(format!("{name}: not YAML; list it in NOT_EXPRESSIBLE"));
            }
            continue;
        };
        let valid = v.is_valid(&doc);
        match (rejected, reason) {
            (true, None) if valid => failures.push(format!("{name}: accepted, expected rejected")),
            (false, Some((_, why))) if !valid => failures.push(format!(
                "{name}: rejected, but listed as not expressible ({why}); move it to REJECTED"
            )),
            (true, Some(_)) => failures.push(format!("{name}: in both lists")),
            (false, None) => failures.push(format!(
                "{name}: a new fixture; list it in REJECTED or NOT_EXPRESSIBLE"
            )),
            _ => {}
        }
    }
    for name in REJECTED
        .iter()
        .chain(NOT_EXPRESSIBLE.iter().map(|(n, _)| n))
    {
        if !files
            .iter()
            .any(|f| f.file_stem().is_some_and(|s| s == *name))
        {
            failures.push(format!("{name}: no such fixture"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_config_schema_rejects_config_mistakes() {
    let v = schema(&["schema", "config"]);
    let dir = tempfile::tempdir().expect("a scratch folder");
    for (yaml, ok) in [
        (
            "server:\n  port: ${PORT:-8000}\nlogging:\n  level: \"${LOG_LEVEL:-info}\"\n",
            true,
        ),
        ("", true),
        ("sever: {port: 80}\n", false),
        ("server: {port: eighty}\n", false),
        ("logging: {level: loud}\n", false),
        ("providers: {p: {kind: scripted}}\n", false),
        (
            "mcp_servers: {m: {command: [x], url: \"http://h/mcp\"}}\n",
            false,
        ),
        (
            "tools: {t: {description: d, parameters: {type: object}}}\n",
            false,
        ),
    ] {
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).expect("write the config");
        let doc = document(&path).expect("YAML");
        assert_eq!(v.is_valid(&doc), ok, "{yaml}: {:?}", problems(&v, &path));
    }
}

#[test]
fn schema_needs_no_config_and_refuses_an_unknown_kind() {
    let o = run(&["--config", "no-such-config.yaml", "schema", "config"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let o = run(&["schema", "nonsense"]);
    assert_eq!(o.status.code(), Some(64), "{o:?}");
    assert!(o.stdout.is_empty());
}
