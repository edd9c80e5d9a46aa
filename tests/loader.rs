//! Pipeline and config loading, through the library and through the real binary.
//!
//! The invalid fixtures (`tests/fixtures/invalid/`, one mistake each) are rendered
//! and compared with `tests/snapshots/invalid/NAME.txt`, so the wording of every
//! error message is reviewed in diffs. Regenerate after an intended change with
//! `UPDATE_SNAPSHOTS=1 cargo test --test loader` and read the diff.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use vectorstep::config::{self, Config};
use vectorstep::diag::{Diagnostic, Diagnostics};
use vectorstep::pipeline;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures() -> PathBuf {
    repo().join("tests/fixtures")
}

fn fixture_config() -> Config {
    let path = fixtures().join("config.yaml");
    let (config, d) = Config::load(&path, true).expect("the fixture config loads");
    assert!(d.is_empty(), "the fixture config has diagnostics:\n{d}");
    config
}

/// Every `*.yaml` fixture of `tests/fixtures/invalid/` as (name without extension, path).
fn invalid_fixtures() -> Vec<(String, PathBuf)> {
    let dir = fixtures().join("invalid");
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .expect("read tests/fixtures/invalid")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    out.sort();
    out
}

/// Diagnostics as the CLI prints them, with the fixture folder prefix removed so a
/// snapshot reads `invalid/NAME.yaml:LINE:COL: ...` on every machine.
fn render(d: &Diagnostics) -> String {
    let prefix = format!("{}/", fixtures().display());
    d.to_string().replace(&prefix, "")
}

fn load_one(path: &Path, config: &Config) -> (Option<pipeline::PipelineSet>, Diagnostics) {
    pipeline::load(&[path.to_path_buf()], config)
}

#[test]
fn invalid_fixtures_match_their_snapshots() {
    let config = fixture_config();
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v == "1");
    let snap_dir = repo().join("tests/snapshots/invalid");
    if update {
        std::fs::create_dir_all(&snap_dir).unwrap();
    }
    let fixtures = invalid_fixtures();
    assert!(
        fixtures.len() >= 40,
        "expected the ~43 invalid fixtures, found {}",
        fixtures.len()
    );
    let mut failures = Vec::new();
    for (name, path) in &fixtures {
        let (set, d) = load_one(path, &config);
        if set.is_some() || !d.has_errors() {
            failures.push(format!("{name}: loaded without errors:\n{d}"));
            continue;
        }
        let actual = render(&d);
        let snap = snap_dir.join(format!("{name}.txt"));
        if update {
            std::fs::write(&snap, &actual).unwrap();
            continue;
        }
        match std::fs::read_to_string(&snap) {
            Ok(expected) if expected == actual => {}
            Ok(expected) => failures.push(format!(
                "{name}: output differs from {}\n--- expected\n{expected}--- actual\n{actual}",
                snap.display()
            )),
            Err(_) => failures.push(format!(
                "{name}: no snapshot at {} (run with UPDATE_SNAPSHOTS=1)\n--- actual\n{actual}",
                snap.display()
            )),
        }
    }
    // A snapshot whose fixture was deleted or renamed would otherwise rot silently.
    if !update {
        for entry in std::fs::read_dir(&snap_dir).expect("read tests/snapshots/invalid") {
            let p = entry.unwrap().path();
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            if !fixtures.iter().any(|(n, _)| *n == stem) {
                failures.push(format!("{}: snapshot without a fixture", p.display()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} snapshot failure(s):\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// Where each fixture's first (and only) error must point: (fixture, line, column,
/// field path, a piece of the message). Lines come from reading the fixtures: the
/// line the mistake is on. Rows marked `colon` point at a block mapping as a whole;
/// the engine places a block mapping at the `:` of its first key.
#[rustfmt::skip]
const FIRST_ERROR: &[(&str, usize, usize, &str, &str)] = &[
    ("agent-missing", 7, 22, "steps[0] (triage).executor_config", "the agent executor needs `executor_config.agent`"),
    ("agent-unknown", 8, 14, "steps[0] (triage).executor_config.agent", "unknown agent `sre-triage`"),
    ("bad-cron", 5, 9, "schedule.cron", "invalid cron expression `every 15 minutes`"),
    ("bad-durable-policy", 5, 19, "durable.on_interrupted", "`retry` is not one of: rerun, escalate"),
    ("bad-join", 7, 13, "steps[0] (gather).parallel.join", "`majority` is not one of: all_must_pass, any_must_pass, weighted_average"),
    ("bad-match-operator", 5, 16, "trigger.match.severity", "unknown match operator `like`"),
    ("bad-match-regex", 5, 22, "trigger.match.service.regex", "invalid regular expression `([a-z`"),
    ("bad-on-empty", 12, 17, "steps[1] (per-service).fan_out.on_empty", "`ignore` is not one of: complete, skip, abort"),
    ("bad-on-failure-string", 9, 17, "steps[0] (triage).on_failure", "`retry` is not one of: abort, continue"),
    ("bad-on-low-confidence", 9, 24, "steps[0] (triage).on_low_confidence", "`ignore` is not one of: escalate, abort, proceed"),
    ("bad-stage", 4, 8, "stage", "`staging` is not one of: testing, production"),
    ("bad-template-notification", 7, 15, "notifications.escalate.template", "template syntax error"),
    ("bad-template-over", 11, 13, "steps[1] (per-service).fan_out.over", "template syntax error"),
    ("bad-template-payload", 14, 17, "steps[0] (triage).on_failure.webhook.payload.text", "template syntax error"),
    // The block scalar's third line, where `{{ labels.x ` is left open.
    ("bad-template-prompt", 12, 7, "steps[0] (triage).prompt_template", "template syntax error"),
    ("bad-when", 13, 11, "steps[1] (b).when", "`steps.a.confidence >` is not a valid expression"),
    ("branch-retry-not-allowed", 13, 11, "steps[0] (gather).parallel.steps[0] (gather/logs)", "unknown key `retry`"),
    ("budget-without-limit", 5, 3, "budget", "a budget needs a limit"),
    ("budget-zero-limit", 5, 15, "budget.max_tokens", "a budget limit must be > 0"),
    ("duplicate-branch-name", 13, 17, "steps[0] (gather).parallel.steps[1] (gather/logs).name", "duplicate step name `gather/logs`"),
    ("duplicate-step-name", 9, 11, "steps[1] (triage).name", "duplicate step name `triage`"),
    ("fan-out-max-items-zero", 12, 18, "steps[1] (per-service).fan_out.max_items", "must be at least 1, found 0"),
    ("fan-out-missing-over", 10, 7, "steps[1] (per-service).fan_out", "missing required field `over`"),
    ("loop-confidence-out-of-range", 9, 30, "steps[0] (triage).loop_until.confidence", "1.2 is outside 0..1"),
    ("loop-max-iterations-zero", 9, 51, "steps[0] (triage).loop_until.max_iterations", "must be at least 1, found 0"),
    ("missing-executor", 5, 5, "steps[0] (triage)", "missing required field `executor`"),
    ("missing-name", 2, 1, "", "missing required field `name`"),
    ("mock-fail-wrong-type", 8, 13, "steps[0] (triage).executor_config.fail", "expected a boolean or a message, found an integer"),
    ("notification-missing-template", 6, 7, "notifications.escalate[0]", "missing required field `template`"),
    ("notify-unknown-channel", 8, 16, "steps[0] (announce).executor_config.channel", "unknown notify channel"),
    ("parallel-missing-steps", 6, 7, "steps[0] (gather).parallel", "missing required field `steps`"),
    ("retry-attempts-zero", 9, 23, "steps[0] (triage).retry.attempts", "must be at least 1, found 0"),
    ("retry-bad-backoff", 9, 35, "steps[0] (triage).retry.backoff", "`linear` is not one of: fixed, exponential"),
    ("shell-command-string", 8, 16, "steps[0] (disk).executor_config.command", "expected an argv list, found a string"),
    ("shell-env-not-a-mapping", 9, 12, "steps[0] (disk).executor_config.env", "expected a mapping, found a string"),
    ("step-missing-name", 9, 5, "steps[1]", "missing required field `name`"),
    ("subpipeline-unknown", 8, 17, "steps[0].executor_config.pipeline", "unknown pipeline `does-not-exist`"),
    ("threshold-out-of-range", 9, 27, "steps[0] (triage).confidence_threshold", "1.5 is outside 0..1"),
    ("unknown-executor", 6, 15, "steps[0] (triage).executor", "unknown executor `lambda`"),
    ("unknown-key-typo", 9, 5, "steps[0] (triage)", "unknown key `on_low_confidnce`"),
    ("unknown-top-level-key", 4, 1, "", "unknown key `step`"),
    ("unknown-use", 9, 10, "steps[1].use", "unknown library step `no-such-step`"),
    ("webhook-missing-url", 8, 7, "steps[0] (notify-deploy-tracker).executor_config", "the webhook executor needs `executor_config.url`"),
    ("wrong-type-steps", 5, 3, "steps", "expected a list of steps, found a mapping"),
    ("wrong-type-threshold", 9, 27, "steps[0] (triage).confidence_threshold", "expected a number, found a string"),
];

/// Fixtures left out of [`FIRST_ERROR`] because the engine does not yet point at
/// the mistake (reported; add their rows once fixed):
/// - `yaml-syntax-error`: the `[` left open on line 3 is reported at 4:8 as
///   "illegal placement of ':' indicator".
const NOT_YET_POINTING_AT_THE_MISTAKE: &[&str] = &["yaml-syntax-error"];

#[test]
fn every_invalid_fixture_fails_with_its_first_error_on_the_mistake() {
    let config = fixture_config();
    let mut failures = Vec::new();
    for (name, path) in invalid_fixtures() {
        let text = std::fs::read_to_string(&path).unwrap();
        if !text.starts_with("# mistake: ") {
            failures.push(format!(
                "{name}: the first line is not a `# mistake: ...` comment"
            ));
        }
        let (set, d) = load_one(&path, &config);
        if set.is_some() || d.error_count() == 0 {
            failures.push(format!("{name}: expected at least one error, got:\n{d}"));
            continue;
        }
        let row = FIRST_ERROR.iter().find(|r| r.0 == name);
        let Some(&(_, line, col, field, message)) = row else {
            if !NOT_YET_POINTING_AT_THE_MISTAKE.contains(&name.as_str()) {
                failures.push(format!("{name}: add a row to FIRST_ERROR"));
            }
            continue;
        };
        let first: &Diagnostic = d.errors().next().unwrap();
        let got = (first.span.line, first.span.col, first.path.as_str());
        if got != (line, col, field) || !first.message.contains(message) {
            failures.push(format!(
                "{name}: expected {line}:{col} `{field}` containing {message:?}, got {}:{} `{}` {:?}",
                first.span.line, first.span.col, first.path, first.message
            ));
        }
        if !first.span.file.ends_with(&format!("invalid/{name}.yaml")) {
            failures.push(format!("{name}: error names file {}", first.span.file));
        }
        // One mistake, one error: a second one is a knock-on the operator has to
        // reason away.
        if d.error_count() != 1 {
            failures.push(format!(
                "{name}: {} errors for one mistake:\n{d}",
                d.error_count()
            ));
        }
    }
    for row in FIRST_ERROR {
        if !fixtures().join(format!("invalid/{}.yaml", row.0)).is_file() {
            failures.push(format!("FIRST_ERROR names a missing fixture `{}`", row.0));
        }
    }
    assert!(
        FIRST_ERROR.len() >= 25,
        "the table must cover at least 25 fixtures"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn diagnostics_render_file_line_col_path_message_and_hint() {
    let config = fixture_config();
    let path = fixtures().join("invalid/unknown-key-typo.yaml");
    let (_, d) = load_one(&path, &config);
    let expected = format!(
        "{}:9:5: error: steps[0] (triage): unknown key `on_low_confidnce`\n    hint: did you mean `on_low_confidence`?\n",
        path.display()
    );
    assert_eq!(d.to_string(), expected);
}

#[test]
fn all_invalid_fixtures_at_once_report_every_file() {
    // Loading the folder reports each file's mistakes, not just the first file's.
    let config = fixture_config();
    let (set, d) = pipeline::load(&[fixtures().join("invalid")], &config);
    assert!(set.is_none());
    for (name, _) in invalid_fixtures() {
        let file = format!("invalid/{name}.yaml");
        assert!(
            d.errors().any(|e| e.span.file.ends_with(&file)),
            "no error for {file} when loading the folder:\n{}",
            render(&d)
        );
    }
}

// ---------------------------------------------------------------------------
// The binary, run from the repository root.

fn vectorstep(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .current_dir(repo())
        .args(args)
        .env_remove("VECTORSTEP_CONFIG")
        .env_remove("RUST_LOG")
        .output()
        .expect("start the vectorstep binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn yaml_count(dir: &str) -> usize {
    pipeline::loader::yaml_files(&repo().join(dir))
        .unwrap()
        .len()
}

/// `N pipelines OK` from stdout.
fn ok_count(out: &Output) -> usize {
    let stdout = text(&out.stdout);
    let n = stdout
        .trim()
        .strip_suffix(" pipelines OK")
        .unwrap_or_else(|| panic!("unexpected stdout {stdout:?}"));
    n.parse().unwrap()
}

fn lines_with<'a>(s: &'a str, needle: &str) -> Vec<&'a str> {
    s.lines().filter(|l| l.contains(needle)).collect()
}

#[test]
fn samples_validate_with_the_repo_config() {
    let out = vectorstep(&["--config", "config.yaml", "validate", "samples/pipelines"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{stderr}");
    let n = ok_count(&out);
    assert!(n >= 8, "only {n} sample pipelines");
    assert_eq!(
        n,
        yaml_count("samples/pipelines"),
        "every sample file is a pipeline"
    );
    // The samples are documentation: they should load clean.
    assert!(
        !stderr.contains(": error:") && !stderr.contains(": warning:"),
        "{stderr}"
    );
}

#[test]
fn live_pipeline_folder_validates() {
    let want = yaml_count("pipelines");
    assert!(want >= 1);
    // Explicitly, and as the configured default folder.
    for args in [
        &["--config", "config.yaml", "validate", "pipelines"][..],
        &["--config", "config.yaml", "validate"][..],
    ] {
        let out = vectorstep(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert_eq!(ok_count(&out), want, "{args:?}");
        assert!(!stderr.contains(": error:"), "{stderr}");
    }
}

#[test]
fn duplicate_pipeline_names_fail_and_point_at_the_second_file() {
    let out = vectorstep(&[
        "--config",
        "tests/fixtures/config.yaml",
        "validate",
        "tests/fixtures/duplicate-names",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!text(&out.stdout).contains("pipelines OK"));
    let errors = lines_with(&stderr, ": error:");
    assert_eq!(
        errors,
        vec!["tests/fixtures/duplicate-names/b.yaml:3:7: error: name: duplicate pipeline name `same-name`"],
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: already defined in tests/fixtures/duplicate-names/a.yaml"),
        "{stderr}"
    );
    assert!(
        stderr.contains("1 error(s); nothing was loaded"),
        "{stderr}"
    );
}

#[test]
fn warnings_do_not_fail_validation() {
    let out = vectorstep(&[
        "--config",
        "tests/fixtures/config.yaml",
        "validate",
        "tests/fixtures/warnings",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(ok_count(&out), 2);
    assert!(!stderr.contains(": error:"), "{stderr}");
    let warnings = lines_with(&stderr, ": warning: ");
    assert_eq!(warnings.len(), 3, "{stderr}");
    let one = |needle: &str| {
        let hits = lines_with(&stderr, needle);
        assert_eq!(hits.len(), 1, "`{needle}` should appear once:\n{stderr}");
    };
    one("verifier-and-grounding.yaml:11:5: warning: steps[0] (triage).verifier: `verifier` is a VectorStep feature");
    one("verifier-and-grounding.yaml:16:5: warning: steps[0] (triage).grounding: `grounding` is a VectorStep feature");
    one("forward-step-reference.yaml:10:22: warning: steps[0] (first).prompt_template: `steps.later_step` refers to a step that does not run before `first`");
}

/// Keys an executor does not read load with a warning that names the key, where
/// it is and what was probably meant; the pipeline still loads.
#[test]
fn unknown_executor_config_keys_are_warnings_with_a_suggestion() {
    let out = vectorstep(&[
        "--config",
        "tests/fixtures/config.yaml",
        "validate",
        "tests/fixtures/executor-config-warnings",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(ok_count(&out), 1);
    assert!(!stderr.contains(": error:"), "{stderr}");
    let warnings = lines_with(&stderr, ": warning: ");
    assert_eq!(
        warnings,
        [
            "tests/fixtures/executor-config-warnings/misspelt-key.yaml:10:7: warning: steps[0] (tell-tracker).executor_config.methd: unknown key `methd` for the webhook executor; it is ignored",
            "tests/fixtures/executor-config-warnings/misspelt-key.yaml:13:23: warning: steps[1] (approve).executor_config.channel: unknown key `channel` for the human executor; it is ignored",
        ],
        "{stderr}"
    );
    assert!(stderr.contains("hint: did you mean `method`?"), "{stderr}");
    assert!(
        stderr.contains("hint: the human executor takes no `executor_config` keys"),
        "{stderr}"
    );
}

#[test]
fn warnings_through_the_library() {
    let (set, d) = pipeline::load(&[fixtures().join("warnings")], &fixture_config());
    let set = set.expect("warnings alone do not stop loading");
    assert_eq!(set.len(), 2);
    assert!(set.get("forward-step-reference").is_some());
    assert!(set.get("verifier-and-grounding").is_some());
    assert_eq!(d.error_count(), 0);
    assert_eq!(d.warnings().count(), 3, "{d}");
}

#[test]
fn a_missing_path_is_an_error() {
    let missing = fixtures().join("no-such-folder");
    let (set, d) = pipeline::load(std::slice::from_ref(&missing), &fixture_config());
    assert!(set.is_none());
    let first = d.errors().next().expect("an error");
    assert_eq!(&*first.span.file, missing.display().to_string());
    assert_eq!(first.message, "no such file or folder");
}

// ---------------------------------------------------------------------------
// config.yaml

fn write_config(dir: &Path, body: &str) -> PathBuf {
    let p = dir.join("config.yaml");
    std::fs::write(&p, body).unwrap();
    p
}

fn invalid_config(path: &Path) -> Diagnostics {
    match Config::load(path, true) {
        Err(config::Error::Invalid(d)) => d,
        Err(e) => panic!("expected an invalid config, got {e}"),
        Ok((_, d)) => panic!("expected an invalid config, it loaded:\n{d}"),
    }
}

#[test]
fn config_unknown_key_has_position_and_did_you_mean() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_config(
        dir.path(),
        "server:\n  host: 127.0.0.1\n  prot: 8000\nlogging: {level: info}\n",
    );
    let d = invalid_config(&p);
    assert_eq!(
        d.to_string(),
        format!(
            "{}:3:3: error: server: unknown key `prot`\n    hint: did you mean `port`?\n",
            p.display()
        )
    );

    // The binary prints the same and exits 1 before loading any pipeline.
    let out = vectorstep(&[
        "--config",
        p.to_str().unwrap(),
        "validate",
        "tests/fixtures/warnings",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}:3:3: error: server: unknown key `prot`",
            p.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("did you mean `port`?"), "{stderr}");
}

#[test]
fn config_env_vars_expand_inside_longer_strings() {
    let var = format!("VECTORSTEP_LOADER_TEST_{}", std::process::id());
    let unset = format!("{var}_UNSET");
    let empty = format!("{var}_EMPTY");
    std::env::set_var(&var, "from-env");
    std::env::set_var(&empty, "");
    std::env::remove_var(&unset);
    let dir = tempfile::tempdir().unwrap();
    let p = write_config(
        dir.path(),
        &format!(
            r#"database: {{path: "/var/lib/${{{var}}}/db-${{{unset}:-fallback}}.sqlite"}}
providers:
  local:
    base_url: "http://${{{var}:-ignored}}:11434/v1"
    api_key: "Bearer ${{{empty}:-dflt}}"
agents:
  a: {{provider: local, model: "m-${{{var}}}"}}
human_approval:
  ui_base_url: "https://${{{var}}}.example/${{{var}}}/x"
"#
        ),
    );
    let (c, d) = Config::load(&p, true).expect("config loads");
    assert!(d.is_empty(), "{d}");
    assert_eq!(
        c.database_path,
        PathBuf::from("/var/lib/from-env/db-fallback.sqlite")
    );
    let local = &c.providers["local"];
    // A set variable wins over its default.
    assert_eq!(local.base_url, "http://from-env:11434/v1");
    // An empty variable takes the default.
    assert_eq!(local.api_key.as_deref(), Some("Bearer dflt"));
    assert_eq!(c.agents["a"].model, "m-from-env");
    assert_eq!(
        c.human_approval.ui_base_url,
        "https://from-env.example/from-env/x"
    );

    // An unset variable without a default expands to "" and is a warning.
    let p = write_config(
        dir.path(),
        &format!("human_approval: {{ui_base_url: \"http://host${{{unset}}}:1\"}}\n"),
    );
    let (c, d) = Config::load(&p, true).expect("config loads");
    assert_eq!(c.human_approval.ui_base_url, "http://host:1");
    let warnings: Vec<String> = d.warnings().map(|w| w.message.clone()).collect();
    assert_eq!(
        warnings,
        vec![format!(
            "environment variable `{unset}` is not set; it expands to an empty string"
        )]
    );
}

#[test]
fn config_errors_after_expansion_keep_the_value_position() {
    let var = format!("VECTORSTEP_LOADER_LEVEL_{}", std::process::id());
    std::env::set_var(&var, "loud");
    let dir = tempfile::tempdir().unwrap();
    let p = write_config(
        dir.path(),
        &format!("server: {{host: 127.0.0.1}}\nlogging:\n  level: \"${{{var}}}\"\n"),
    );
    let d = invalid_config(&p);
    let first = d.errors().next().unwrap();
    assert_eq!((first.span.line, first.span.col), (3, 10), "{d}");
    assert_eq!(first.path, "logging.level");
    assert!(first.message.contains("`loud` is not one of"), "{d}");
}
