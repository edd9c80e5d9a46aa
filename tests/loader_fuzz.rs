//! Loading never panics, whatever the file holds, and never fails silently.
//!
//! Properties, for pipelines (`pipeline::load`) and for `config.yaml`
//! (`Config::load`) alike:
//! - no panic (the harness reports a panic as a failed case, with the input);
//! - no result means at least one error, and a result means no errors;
//! - every diagnostic has a 1-based position inside the file it names.
//!
//! Inputs: random bytes, random text made of YAML punctuation and pipeline words,
//! every sample pipeline and config cut short at every 7th byte, and random JSON
//! trees (JSON is YAML) whose keys are mostly real pipeline and config keys.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value};
use vectorstep::config::{self, Config};
use vectorstep::diag::Diagnostics;
use vectorstep::pipeline;

const CASES: u32 = 256;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The fixture config (agent `triage-agent`, library step `check-disk`).
fn fixture_config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        Config::load(&repo().join("tests/fixtures/config.yaml"), true)
            .expect("fixture config")
            .0
    })
}

/// The repository config, whose agents the sample pipelines use.
fn repo_config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        Config::load(&repo().join("config.yaml"), true)
            .expect("repo config")
            .0
    })
}

/// Checks that every diagnostic about `file` points inside `bytes`.
fn positions_inside(d: &Diagnostics, file: &Path, bytes: &[u8]) -> Result<(), TestCaseError> {
    let name = file.display().to_string();
    // YAML breaks lines at `\n`, `\r\n` and a lone `\r`.
    let breaks = bytes
        .iter()
        .enumerate()
        .filter(|&(i, b)| *b == b'\n' || (*b == b'\r' && bytes.get(i + 1) != Some(&b'\n')))
        .count();
    let lines = breaks + 1;
    for x in d.iter() {
        prop_assert!(x.span.line >= 1 && x.span.col >= 1, "position 0 in {x}");
        if *x.span.file == name {
            prop_assert!(
                x.span.line <= lines,
                "line past the end ({lines} lines): {x}"
            );
        }
    }
    // Rendering must not panic either.
    let _ = d.to_string();
    Ok(())
}

thread_local! {
    /// One scratch folder per test thread: cases overwrite the same file, which
    /// keeps thousands of cases from spending their time creating folders.
    static SCRATCH: tempfile::TempDir = {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("pipelines")).unwrap();
        d
    };
}

/// Writes `bytes` to `name` in this thread's scratch folder.
fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = SCRATCH.with(|d| d.path().join(name));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Writes `bytes` as the only pipeline file and loads it.
/// Returns the loaded pipeline's name and number of step list entries.
fn check_pipeline(bytes: &[u8], config: &Config) -> Result<Option<(String, usize)>, TestCaseError> {
    let path = scratch_file("pipelines/p.yaml", bytes);
    let (set, d) = pipeline::load(std::slice::from_ref(&path), config);
    positions_inside(&d, &path, bytes)?;
    match set {
        None => {
            prop_assert!(d.has_errors(), "no pipeline and no error:\n{d}");
            Ok(None)
        }
        Some(set) => {
            prop_assert!(!d.has_errors(), "a result despite errors:\n{d}");
            prop_assert_eq!(set.len(), 1);
            let p = &set.pipelines[0];
            prop_assert_eq!(p.fingerprint.len(), 64);
            Ok(Some((p.name.clone(), p.steps.len())))
        }
    }
}

/// Writes `bytes` as a config file and loads it.
fn check_config(bytes: &[u8]) -> Result<(), TestCaseError> {
    let path = scratch_file("config.yaml", bytes);
    match Config::load(&path, true) {
        Ok((_, d)) => {
            prop_assert!(!d.has_errors(), "a config despite errors:\n{d}");
            positions_inside(&d, &path, bytes)?;
        }
        Err(config::Error::Invalid(d)) => {
            prop_assert!(d.has_errors(), "invalid without an error:\n{d}");
            positions_inside(&d, &path, bytes)?;
        }
        Err(config::Error::Read { .. }) => {
            prop_assert!(
                std::str::from_utf8(bytes).is_err(),
                "a UTF-8 file could not be read"
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Generators.

/// Pieces of YAML syntax and pipeline vocabulary, so random text gets past the
/// parser often enough to reach validation.
const ATOMS: &[&str] = &[
    "name: ",
    "steps:\n",
    "trigger: {}\n",
    "  - ",
    "    ",
    "\n",
    "- ",
    ": ",
    "{",
    "}",
    "[",
    "]",
    ", ",
    "? ",
    "&a ",
    "*a",
    "!!str ",
    "!!int ",
    "|\n",
    ">-\n",
    "'",
    "\"",
    "#",
    "---\n",
    "...\n",
    "~",
    "null",
    "true",
    "0.5",
    "-1",
    "1e999",
    "executor: mock\n",
    "executor: agent\n",
    "executor_config: {agent: triage-agent}\n",
    "parallel:\n",
    "fan_out:\n",
    "over: ",
    "{{ x }}",
    "{{",
    "}}",
    "{%",
    "%}",
    "when: ",
    "use: check-disk\n",
    "retry: {attempts: 0}\n",
    "\t",
    "\\",
    "%YAML 1.2\n",
    "<<: ",
    "é",
    "\u{feff}",
    "\r\n",
    "${HOME}",
    "${X:-y}",
    "server:\n",
    "agents:\n",
];

fn yamlish_text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            3 => proptest::sample::select(ATOMS).prop_map(str::to_string),
            1 => any::<char>().prop_map(String::from),
            1 => "[a-z_]{1,8}",
        ],
        0..80,
    )
    .prop_map(|parts| parts.concat())
}

const KEYS: &[&str] = &[
    // Pipeline keys.
    "name",
    "description",
    "tags",
    "version",
    "stage",
    "trigger",
    "match",
    "dedup",
    "window_seconds",
    "enabled",
    "vars",
    "context_template",
    "include",
    "steps",
    "notifications",
    "schedule",
    "cron",
    "summary",
    "severity",
    "labels",
    "team",
    "budget",
    "max_tokens",
    "max_usd",
    "max_cost",
    "include_approx_cost",
    "durable",
    "on_interrupted",
    "max_resume_age_seconds",
    "executor",
    "executor_config",
    "agent",
    "command",
    "url",
    "method",
    "headers",
    "pipeline",
    "output",
    "channel",
    "prompt_template",
    "confidence_threshold",
    "on_low_confidence",
    "on_abort",
    "timeout_seconds",
    "when",
    "retry",
    "attempts",
    "backoff",
    "delay_seconds",
    "loop_until",
    "confidence",
    "max_iterations",
    "on_failure",
    "policy",
    "webhook",
    "payload",
    "parallel",
    "fan_out",
    "over",
    "as",
    "as_var",
    "max_items",
    "on_empty",
    "join",
    "weight",
    "use",
    "template",
    "config",
    "verifier",
    "grounding",
    "readiness",
    "eq",
    "ne",
    "in",
    "not_in",
    "regex",
    "gt",
    "gte",
    "lt",
    "lte",
    // Config keys.
    "server",
    "host",
    "port",
    "max_body_bytes",
    "pipeline_config_dir",
    "step_library_dir",
    "database",
    "path",
    "durability",
    "max_resume_attempts",
    "shutdown_grace_seconds",
    "concurrency",
    "max_runs",
    "auth",
    "teams",
    "token",
    "providers",
    "base_url",
    "api_key",
    "agents",
    "provider",
    "model",
    "system_prompt",
    "temperature",
    "pricing",
    "input_per_mtok",
    "output_per_mtok",
    "telegram",
    "bot_token",
    "chat_id",
    "api_url",
    "human_approval",
    "ui_base_url",
    "approvers",
    "default",
    "logging",
    "level",
    "format",
    "retention",
    "days",
];

/// Strings that mean something somewhere in a pipeline or config.
const WORDS: &[&str] = &[
    "mock",
    "agent",
    "gateway",
    "shell",
    "webhook",
    "human",
    "notify",
    "pipeline",
    "lambda",
    "triage-agent",
    "check-disk",
    "local",
    "a",
    "b",
    "a-b",
    "a_b",
    "x/y",
    "",
    " ",
    "{{ labels.x }}",
    "{{ steps.a.summary }}",
    "{{ steps['a'].x }}",
    "{{",
    "{% if x %}",
    "{% endif %}",
    "steps.a.confidence > 0.5",
    "a >",
    "*/5 * * * *",
    "every day",
    "all_must_pass",
    "weighted_average",
    "abort",
    "continue",
    "escalate",
    "proceed",
    "rerun",
    "fixed",
    "exponential",
    "complete",
    "skip",
    "log",
    "telegram",
    "testing",
    "production",
    "([a-z",
    "^prod-",
    "${HOME}",
    "${VECTORSTEP_FUZZ_UNSET}",
    "${X:-y}",
    "line one\nline two",
    "http://127.0.0.1:1/x",
    "info",
    "json",
    "pretty",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(KEYS).prop_map(str::to_string),
        1 => "[a-z_]{1,10}",
        1 => any::<String>(),
    ]
}

fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(WORDS).prop_map(str::to_string),
        1 => any::<String>(),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-2i64..25).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1.5f64..2.5).prop_map(Value::from),
        any::<f64>().prop_map(Value::from), // NaN and infinities become null
        string().prop_map(Value::String),
    ]
}

fn object(entries: Vec<(String, Value)>) -> Value {
    Value::Object(entries.into_iter().collect::<Map<String, Value>>())
}

/// Any JSON tree, up to 5 levels deep.
fn tree() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 128, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..8).prop_map(object),
        ]
    })
}

/// One field of a step with a plausible value (right or nearly right), or any
/// key with any value.
fn step_field() -> impl Strategy<Value = (String, Value)> {
    let f = |k: &'static str| move |v: Value| (k.to_string(), v);
    prop_oneof![
        1 => string().prop_map(Value::String).prop_map(f("prompt_template")),
        1 => (-0.5f64..1.5).prop_map(Value::from).prop_map(f("confidence_threshold")),
        1 => proptest::sample::select(&["escalate", "abort", "proceed", "ignore"][..])
            .prop_map(Value::from)
            .prop_map(f("on_low_confidence")),
        1 => (-1.0f64..100.0).prop_map(Value::from).prop_map(f("timeout_seconds")),
        1 => string().prop_map(Value::String).prop_map(f("when")),
        1 => (0u64..4, proptest::sample::select(&["fixed", "exponential", "linear"][..]))
            .prop_map(|(n, b)| serde_json::json!({"attempts": n, "backoff": b}))
            .prop_map(f("retry")),
        1 => (-0.5f64..1.5, 0u64..4)
            .prop_map(|(c, n)| serde_json::json!({"confidence": c, "max_iterations": n}))
            .prop_map(f("loop_until")),
        1 => proptest::sample::select(&["abort", "continue", "retry"][..])
            .prop_map(Value::from)
            .prop_map(f("on_failure")),
        1 => (key(), tree()),
    ]
}

/// A step-shaped mapping: usually a name and an executor that needs no config,
/// then a few fields.
fn step() -> impl Strategy<Value = Value> {
    (
        proptest::option::weighted(0.95, prop_oneof![3 => "[a-z][a-z_-]{0,6}", 1 => string()]),
        proptest::option::weighted(
            0.95,
            prop_oneof![
                3 => proptest::sample::select(&["mock", "human", "notify"][..]),
                1 => proptest::sample::select(WORDS),
            ],
        ),
        proptest::collection::vec(step_field(), 0..4),
    )
        .prop_map(|(name, executor, rest)| {
            let mut m = Map::new();
            if let Some(n) = name {
                m.insert("name".into(), Value::String(n));
            }
            if let Some(e) = executor {
                m.insert("executor".into(), Value::String(e.into()));
            }
            for (k, v) in rest {
                m.insert(k, v);
            }
            Value::Object(m)
        })
}

/// A steps-list entry: a plain step, a `parallel:` group or a `fan_out:`.
fn entry() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => step(),
        1 => (string(), proptest::collection::vec(step(), 0..3), tree()).prop_map(
            |(name, branches, join)| {
                let group = object(vec![
                    ("name".into(), Value::String(name)),
                    ("steps".into(), Value::Array(branches)),
                    ("join".into(), join),
                ]);
                object(vec![("parallel".into(), group)])
            }
        ),
        1 => (step(), string()).prop_map(|(mut s, over)| {
            s.as_object_mut().unwrap().insert("over".into(), Value::String(over));
            object(vec![("fan_out".into(), s)])
        }),
    ]
}

/// A pipeline-shaped document, sometimes with a random extra key (which may replace
/// a shaped one).
fn pipeline_doc() -> impl Strategy<Value = Value> {
    (
        string(),
        proptest::collection::vec(entry(), 0..5),
        proptest::option::weighted(0.3, (key(), tree())),
    )
        .prop_map(|(name, steps, extra)| {
            let mut m = Map::new();
            m.insert("name".into(), Value::String(name));
            m.insert("trigger".into(), Value::Object(Map::new()));
            m.insert("steps".into(), Value::Array(steps));
            if let Some((k, v)) = extra {
                m.insert(k, v);
            }
            Value::Object(m)
        })
}

/// A config-shaped document: top-level config keys with random values.
fn config_doc() -> impl Strategy<Value = Value> {
    proptest::collection::vec((key(), tree()), 0..8).prop_map(object)
}

fn json_text(v: &Value, pretty: bool) -> String {
    if pretty {
        serde_json::to_string_pretty(v).unwrap()
    } else {
        serde_json::to_string(v).unwrap()
    }
}

// ---------------------------------------------------------------------------
// Properties.

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check_pipeline(&bytes, fixture_config())?;
        check_config(&bytes)?;
    }

    #[test]
    fn random_unicode_never_panics(text in any::<String>()) {
        check_pipeline(text.as_bytes(), fixture_config())?;
        check_config(text.as_bytes())?;
    }

    #[test]
    fn yaml_like_text_never_panics(text in yamlish_text()) {
        check_pipeline(text.as_bytes(), fixture_config())?;
        check_config(text.as_bytes())?;
    }

    #[test]
    fn json_trees_never_panic(doc in tree(), pretty in any::<bool>()) {
        let text = json_text(&doc, pretty);
        check_pipeline(text.as_bytes(), fixture_config())?;
        check_config(text.as_bytes())?;
    }

    #[test]
    fn pipeline_shaped_json_never_panics(doc in pipeline_doc(), pretty in any::<bool>()) {
        let text = json_text(&doc, pretty);
        if let Some((name, entries)) = check_pipeline(text.as_bytes(), fixture_config())? {
            // A pipeline that loads is the one that was written, every entry of it.
            prop_assert_eq!(Some(name.as_str()), doc["name"].as_str());
            prop_assert_eq!(Some(entries), doc["steps"].as_array().map(Vec::len));
        }
    }

    #[test]
    fn config_shaped_json_never_panics(doc in config_doc(), pretty in any::<bool>()) {
        check_config(json_text(&doc, pretty).as_bytes())?;
    }
}

fn samples() -> Vec<PathBuf> {
    pipeline::loader::yaml_files(&repo().join("samples/pipelines")).unwrap()
}

/// Runs a property check outside `proptest!`, turning a failure into a panic.
fn must(r: Result<(), TestCaseError>, what: &str) {
    if let Err(e) = r {
        panic!("{what}: {e}");
    }
}

#[test]
fn truncated_sample_pipelines_never_panic() {
    let files = samples();
    assert!(files.len() >= 8);
    let mut loaded_whole = 0;
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        for cut in (0..bytes.len()).step_by(7).chain([bytes.len()]) {
            let what = format!("{} cut at byte {cut}", file.display());
            let r = check_pipeline(&bytes[..cut], repo_config()).map(|_| ());
            must(r, &what);
        }
        // Sanity: the whole file loads (a sub-pipeline caller cannot load alone).
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("p.yaml");
        std::fs::write(&copy, &bytes).unwrap();
        let (set, d) = pipeline::load(&[copy], repo_config());
        if set.is_some() {
            loaded_whole += 1;
        } else {
            assert!(
                d.errors()
                    .all(|e| e.message.starts_with("unknown pipeline")),
                "{} does not load alone:\n{d}",
                file.display()
            );
        }
    }
    assert!(loaded_whole >= 8, "only {loaded_whole} samples load alone");
}

#[test]
fn truncated_configs_never_panic() {
    for file in [
        repo().join("config.yaml"),
        repo().join("tests/fixtures/config.yaml"),
    ] {
        let bytes = std::fs::read(&file).unwrap();
        for cut in (0..bytes.len()).step_by(7).chain([bytes.len()]) {
            must(
                check_config(&bytes[..cut]),
                &format!("{} cut at byte {cut}", file.display()),
            );
        }
    }
}
