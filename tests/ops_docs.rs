//! The deployment snippets in docs/operations.md are checked as the tools that read
//! them would: the systemd unit by `systemd-analyze verify` (Debian package
//! `systemd`; `bash tests/run.sh` installs it), and for what `verify` does not
//! catch, such as an end-of-line comment that systemd would take as part of a value;
//! the Alertmanager section's alertmanager.yml by `amtool` (Debian package
//! `prometheus-alertmanager`), its prometheus.yml and rule file by `promtool`
//! (Debian package `prometheus`), and its pipeline and config.yaml snippets by
//! `vectorstep validate --strict`. A missing tool fails the test naming its package.

use std::process::Command;

/// The unit from docs/operations.md, the block that starts with its path.
fn documented_unit() -> String {
    let doc = include_str!("../docs/operations.md");
    let start = doc
        .find("# /etc/systemd/system/vectorstep.service")
        .expect("docs/operations.md shows the systemd unit");
    let body = &doc[start..];
    let end = body.find("```").expect("the unit's code block ends");
    body[..end].to_string()
}

#[test]
fn the_documented_systemd_unit_has_no_end_of_line_comments() {
    let unit = documented_unit();
    for (i, line) in unit.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || !line.contains('=') {
            continue;
        }
        assert!(
            !line.contains(" #") && !line.contains("\t#"),
            "unit line {}: systemd has no end-of-line comments, `{line}` would keep the comment in its value",
            i + 1
        );
    }
    for key in [
        "EnvironmentFile=",
        "LimitNOFILE=",
        "Restart=on-failure",
        "NoNewPrivileges=yes",
    ] {
        assert!(unit.contains(key), "the unit sets {key}");
    }
}

#[test]
fn the_documented_systemd_unit_passes_systemd_analyze_verify() {
    let found = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "systemd-analyze is missing: install it with `apt-get install -y systemd` \
         (or run the suite with `bash tests/run.sh`, which does)"
    );
    // `verify` requires ExecStart's program to exist: point it at the binary under
    // test; every other line is checked as documented.
    let unit = documented_unit().replace(
        "ExecStart=/opt/vectorstep/vectorstep",
        &format!("ExecStart={}", env!("CARGO_BIN_EXE_vectorstep")),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vectorstep.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Warnings about this machine's own units are not the unit's problem.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("vectorstep.service") || l.contains(&*path.to_string_lossy()))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify failed (exit {:?}):\n{stderr}",
        out.status.code()
    );
}

// --- The `## Alertmanager` section: alertmanager.yml by `amtool` (Debian package
// `prometheus-alertmanager`), prometheus.yml and the rule file by `promtool` (Debian
// package `prometheus`), the pipeline and config.yaml snippets by `vectorstep
// validate --strict`. Each block is found by its first line, the comment naming the
// file it is (`# alertmanager.yml`), not by its position in the section.

/// The `## Alertmanager` section of docs/operations.md, up to the next `## ` heading.
fn alertmanager_section() -> &'static str {
    let doc = include_str!("../docs/operations.md");
    let start = doc
        .find("\n## Alertmanager\n")
        .expect("docs/operations.md has an `## Alertmanager` section");
    let body = &doc[start + 1..];
    let end = body[3..].find("\n## ").map_or(body.len(), |i| i + 4);
    &body[..end]
}

/// The bodies of the section's fenced blocks whose first line starts with `first_line`.
fn blocks_starting_with(first_line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut lines = alertmanager_section().lines();
    while let Some(line) = lines.next() {
        if !line.starts_with("```") {
            continue;
        }
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        if body.first().is_some_and(|l| l.starts_with(first_line)) {
            found.push(body.join("\n") + "\n");
        }
    }
    found
}

/// The one block of the section whose first line starts with `first_line`.
fn block(first_line: &str) -> String {
    let mut found = blocks_starting_with(first_line);
    assert_eq!(
        found.len(),
        1,
        "docs/operations.md's Alertmanager section should have one block starting `{first_line}`"
    );
    found.remove(0)
}

const ALERTMANAGER_YML: &str = "# alertmanager.yml";
const PROMETHEUS_YML: &str = "# prometheus.yml";
const RULE_FILE: &str = "/etc/prometheus/rules/vectorstep.yml";
const RESOLVED_PIPELINE: &str = "# pipelines/checkout-5xx-resolved.yaml";
const ONCE_PER_INCIDENT: &str = "# a pipeline that should act once per incident";
const VECTORSTEP_CONFIG: &str = "# vectorstep config.yaml";

/// Fails, naming the Debian package to install, when `tool` does not run.
fn require(tool: &str, package: &str) {
    let found = Command::new(tool).arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "{tool} is missing: install it with `apt-get install -y {package}` \
         (or run the suite with `bash tests/run.sh`, which does)"
    );
}

/// Runs `program args`, failing with its output unless it exits 0; returns stdout.
fn run_ok(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "`{program} {}` failed (exit {:?}):\n{stdout}\n{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The value of the first `key: value` in `text` (up to `,`, `}` or the line's end).
fn value_of<'a>(text: &'a str, key: &str) -> &'a str {
    let at = text
        .find(&format!("{key}: "))
        .unwrap_or_else(|| panic!("`{key}:` in\n{text}"));
    let rest = &text[at + key.len() + 2..];
    let end = rest.find([',', '}', '\n']).unwrap_or(rest.len());
    rest[..end].trim().trim_matches('"')
}

/// alertmanager.yml, written into `dir`. Its `credentials_file` is kept as
/// documented: `amtool check-config` does not open it (Alertmanager 0.25 reads it
/// per notification), so it need not exist here.
fn documented_alertmanager_yml(dir: &std::path::Path) -> String {
    let config = block(ALERTMANAGER_YML);
    for key in [
        "send_resolved: true",
        "credentials_file: /etc/alertmanager/vectorstep-token",
        "group_by:",
        "group_wait:",
        "group_interval:",
        "repeat_interval:",
    ] {
        assert!(config.contains(key), "alertmanager.yml sets {key}");
    }
    let path = dir.join("alertmanager.yml");
    std::fs::write(&path, config).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn the_documented_alertmanager_config_passes_amtool_check_config() {
    require("amtool", "prometheus-alertmanager");
    let dir = tempfile::tempdir().unwrap();
    let path = documented_alertmanager_yml(dir.path());
    let said = run_ok("amtool", &["check-config", &path]);
    assert!(said.contains("SUCCESS"), "amtool check-config:\n{said}");
}

#[test]
fn the_documented_route_sends_pipeline_alerts_to_vectorstep_and_its_own_alerts_to_people() {
    require("amtool", "prometheus-alertmanager");
    let dir = tempfile::tempdir().unwrap();
    let path = documented_alertmanager_yml(dir.path());
    let config = format!("--config.file={path}");
    let route = |expect: &str, labels: &[String]| {
        let mut args = vec![
            "config",
            "routes",
            "test",
            &config,
            // `--verify.receivers` makes amtool exit 1 on any other receiver.
            "--verify.receivers",
            expect,
        ];
        args.extend(labels.iter().map(String::as_str));
        let said = run_ok("amtool", &args);
        assert_eq!(said.trim(), expect, "amtool routes {labels:?} to:\n{said}");
    };
    // The alert the documented resolved pipeline takes, with the group_by labels.
    let pipeline = block(RESOLVED_PIPELINE);
    let alertname = value_of(&pipeline, "alertname");
    route(
        "vectorstep",
        &[format!("alertname={alertname}"), "service=checkout".into()],
    );
    // The documented rule's alert is about vectorstep itself: the child route
    // `alertname =~ "Vectorstep.*"` sends it to `oncall`, not back into vectorstep.
    let rules = block(&format!("# {RULE_FILE}"));
    let alert = value_of(&rules, "- alert");
    assert!(
        alert.starts_with("Vectorstep"),
        "the rule's alert is `{alert}`"
    );
    route(
        "oncall",
        &[
            format!("alertname={alert}"),
            format!("severity={}", value_of(&rules, "severity")),
            format!("pipeline={}", value_of(&pipeline, "name")),
        ],
    );
}

/// prometheus.yml and its rule file, written into `dir`. `promtool check config`
/// requires the files it names to exist: the rule file (which it checks too) and
/// the scrape job's `credentials_file`. Both are written into `dir` and only those
/// two paths are rewritten; the rule file is the documented one.
fn documented_prometheus_yml(dir: &std::path::Path) -> String {
    let rules = dir.join("vectorstep.yml");
    std::fs::write(&rules, block(&format!("# {RULE_FILE}"))).unwrap();
    let token = dir.join("vectorstep-token");
    std::fs::write(&token, "a-scraper-token").unwrap();
    let documented = block(PROMETHEUS_YML);
    let token_path = "/etc/prometheus/vectorstep-token";
    for named in [RULE_FILE, token_path] {
        assert!(documented.contains(named), "prometheus.yml names {named}");
    }
    let config = documented
        .replace(RULE_FILE, &rules.to_string_lossy())
        .replace(token_path, &token.to_string_lossy());
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, config).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn the_documented_prometheus_config_passes_promtool_check_config() {
    require("promtool", "prometheus");
    let dir = tempfile::tempdir().unwrap();
    let path = documented_prometheus_yml(dir.path());
    let said = run_ok("promtool", &["check", "config", &path]);
    assert!(
        said.contains("1 rule files found"),
        "promtool check config:\n{said}"
    );
}

#[test]
fn the_documented_alert_rule_passes_promtool_check_rules() {
    require("promtool", "prometheus");
    let rules = block(&format!("# {RULE_FILE}"));
    assert!(
        rules.contains("vectorstep_step_duration_seconds_bucket")
            && rules.contains("histogram_quantile("),
        "the rule is on vectorstep's step duration histogram:\n{rules}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vectorstep.yml");
    std::fs::write(&path, rules).unwrap();
    let said = run_ok("promtool", &["check", "rules", &path.to_string_lossy()]);
    assert!(
        said.contains("SUCCESS: 1 rules found"),
        "promtool check rules:\n{said}"
    );
}

/// `vectorstep validate --strict` of the pipeline files in `dir` under `config`.
fn validate_strict(config: &std::path::Path, dir: &std::path::Path, env: &[(&str, &str)]) {
    let out = Command::new(env!("CARGO_BIN_EXE_vectorstep"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("--config")
        .arg(config)
        .args(["validate", "--strict"])
        .arg(dir)
        .envs(env.iter().copied())
        .output()
        .expect("vectorstep runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("pipelines OK"),
        "vectorstep validate --strict failed (exit {:?}):\n{stdout}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}

const FIXTURE_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/config.yaml");

#[test]
fn the_documented_pipeline_snippets_pass_vectorstep_validate_strict() {
    let dir = tempfile::tempdir().unwrap();
    let resolved = block(RESOLVED_PIPELINE);
    assert!(resolved.contains("status: resolved"), "{resolved}");
    std::fs::write(dir.path().join("checkout-5xx-resolved.yaml"), resolved).unwrap();
    // The once-per-incident block shows only a `trigger`: it is completed into a
    // pipeline with a name and one step; its trigger is checked as documented.
    let trigger = block(ONCE_PER_INCIDENT);
    assert!(trigger.contains("\ntrigger:\n"), "{trigger}");
    let once = format!(
        "name: disk-full-once\nstage: production\n{trigger}steps:\n  - name: announce\n    \
         executor: notify\n    executor_config: {{channel: log}}\n    \
         prompt_template: \"{{{{ labels.alertname }}}}\"\n"
    );
    std::fs::write(dir.path().join("disk-full-once.yaml"), once).unwrap();
    validate_strict(FIXTURE_CONFIG.as_ref(), dir.path(), &[]);
}

#[test]
fn the_documented_config_snippets_pass_vectorstep_validate_strict() {
    // tests/fixtures/config.yaml with each snippet's top-level keys in place of its
    // own (the fixture writes those on one line each). Its relative paths are made
    // absolute, as the copy lives in a temporary folder.
    let fixture = std::fs::read_to_string(FIXTURE_CONFIG).unwrap();
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/");
    let snippets = blocks_starting_with(VECTORSTEP_CONFIG);
    assert!(
        snippets.len() >= 3,
        "the section's config.yaml snippets: {snippets:?}"
    );
    let pipelines = tempfile::tempdir().unwrap();
    std::fs::write(
        pipelines.path().join("checkout-5xx-resolved.yaml"),
        block(RESOLVED_PIPELINE),
    )
    .unwrap();
    for snippet in snippets {
        let keys: Vec<&str> = snippet
            .lines()
            .filter(|l| !l.starts_with([' ', '#']) && l.contains(':'))
            .map(|l| &l[..l.find(':').unwrap() + 1])
            .collect();
        assert!(!keys.is_empty(), "{snippet}");
        let mut config = String::new();
        let mut lines = fixture.lines().peekable();
        while let Some(line) = lines.next() {
            if keys.iter().any(|k| line.starts_with(k)) {
                let next = lines.peek().copied().unwrap_or("");
                assert!(!next.starts_with(' '), "the fixture's `{line}` is one line");
                continue;
            }
            config += &line.replace(": ./", &format!(": {fixtures}"));
            config += "\n";
        }
        config += &snippet;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, &config).unwrap();
        // The tokens the snippets take from the environment.
        let env = [
            ("ALERTMANAGER_TOKEN", "an-alertmanager-token-of-32-chars"),
            ("PROMETHEUS_TOKEN", "a-prometheus-token-of-32-chars-xx"),
        ];
        validate_strict(&path, pipelines.path(), &env);
    }
}
