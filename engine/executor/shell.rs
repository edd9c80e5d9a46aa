//! `shell`: runs an argv list without a shell.
//!
//! `executor_config`: `command` (argv list; each element a template the runner has
//! rendered into `command/<i>`), `env` (mapping; values `${VAR}`-expanded against the
//! service's environment), `cwd`.
//!
//! Rendered values come from alerts, so they are passed as separate arguments and
//! never reach `sh -c`: `$(rm -rf /)` in a label is just text. The command runs in
//! its own process group; on timeout, or when the runner drops the call, the whole
//! group is killed so no grandchild outlives the step.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};

use super::http::{excerpt, tail};
use super::{BoxFuture, Call, Error, Executor, Outcome};
use crate::config::expand_env;
use crate::pipeline::executor_config::ShellConfig;
use crate::pipeline::ExecutorConfig;
use crate::run::{StepOutput, Usage};

/// The most stdout and stderr kept per stream; the rest is read and discarded so
/// the child never blocks on a full pipe.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;
/// How long to keep reading after the command exits, for output still buffered in
/// the pipes. A background process that inherited them would otherwise keep the
/// step open until it exits.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);
/// How much stderr a failure message quotes.
const STDERR_EXCERPT_CHARS: usize = 1000;

pub struct Shell;

impl Executor for Shell {
    fn execute<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Outcome, Error>> {
        Box::pin(run(call))
    }
}

async fn run(call: Call<'_>) -> Result<Outcome, Error> {
    let ExecutorConfig::Shell(cfg) = &call.action.config else {
        return Err(super::wrong_config(&call, "shell"));
    };
    let argv = argv(&call, cfg)?;
    let mut envs = env(cfg);
    envs.extend([
        (
            "VECTORSTEP_IDEMPOTENCY_KEY".to_string(),
            call.idempotency_key.to_string(),
        ),
        ("VECTORSTEP_ATTEMPT".to_string(), call.attempt.to_string()),
        ("VECTORSTEP_RUN_ID".to_string(), call.run_id.to_string()),
        ("VECTORSTEP_STEP".to_string(), call.step_path.to_string()),
    ]);
    let done = run_argv(&argv, &envs, cwd(cfg)?, call.timeout).await?;
    interpret(done.status, &done.stdout, &done.stderr)
}

/// What a finished command left behind: its exit status and both streams, each
/// capped at [`MAX_OUTPUT_BYTES`].
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Captured,
    pub stderr: Captured,
}

/// Runs `argv` (program first) without a shell, in its own process group, with
/// `envs` added to the service's environment. On `timeout`, or when the future is
/// dropped, the whole group is killed. Also used by declared shell tools
/// (`agent::declared`), so both kill and cap the same way.
pub async fn run_argv(
    argv: &[String],
    envs: &[(String, String)],
    cwd: Option<String>,
    timeout: Option<Duration>,
) -> Result<Finished, Error> {
    let Some(program) = argv.first().cloned() else {
        return Err(Error::Config("the argv list is empty".into()));
    };
    let mut cmd = Command::new(&program);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .envs(envs.iter().map(|(k, v)| (k, v)));
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let child = cmd
        .spawn()
        .map_err(|e| Error::Transport(format!("cannot start `{program}`: {e}")))?;
    let mut group = Group::new(child);
    let (status, stdout, stderr) = match timeout {
        Some(limit) => match tokio::time::timeout(limit, group.collect()).await {
            Ok(r) => r,
            Err(_) => {
                group.kill().await;
                return Err(Error::Failed(format!(
                    "command `{program}` timed out after {}s and was killed",
                    limit.as_secs_f64()
                )));
            }
        },
        None => group.collect().await,
    }
    .map_err(|e| Error::Transport(format!("cannot wait for `{program}`: {e}")))?;
    Ok(Finished {
        status,
        stdout,
        stderr,
    })
}

/// Turns what the command printed into the step's outcome.
fn interpret(status: ExitStatus, stdout: &Captured, stderr: &Captured) -> Result<Outcome, Error> {
    let out = String::from_utf8_lossy(&stdout.bytes);
    let err = String::from_utf8_lossy(&stderr.bytes);
    let Some(code) = status.code() else {
        use std::os::unix::process::ExitStatusExt;
        let signal = status.signal().unwrap_or(0);
        return Err(Error::Failed(format!(
            "command was killed by signal {signal}: {}",
            tail(&err, STDERR_EXCERPT_CHARS)
        )));
    };
    if code != 0 {
        return Err(Error::Failed(format!(
            "command exited with status {code}: {}",
            tail(&err, STDERR_EXCERPT_CHARS)
        )));
    }
    let trimmed = out.trim();
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        if StepOutput::looks_like_output(&v) {
            let output = StepOutput::from_json(&v).map_err(|e| {
                Error::BadOutput(format!(
                    "command printed an invalid step output: {} (stdout: {})",
                    e.0,
                    excerpt(trimmed, 500)
                ))
            })?;
            return Ok(Outcome {
                output,
                usage: Usage::default(),
            });
        }
    }
    let mut output = StepOutput::new(1.0, trimmed);
    output.extra.insert("exit_code".into(), Value::from(code));
    output
        .extra
        .insert("stderr".into(), Value::from(err.trim().to_string()));
    if stdout.truncated {
        output
            .extra
            .insert("stdout_truncated".into(), Value::Bool(true));
    }
    Ok(Outcome {
        output,
        usage: Usage::default(),
    })
}

/// The rendered argv in index order. An element the runner did not render (a test
/// calling the executor directly) falls back to the configured string.
fn argv(call: &Call<'_>, cfg: &ShellConfig) -> Result<Vec<String>, Error> {
    if cfg.command.is_empty() {
        return Err(Error::Config(
            "the shell executor needs `executor_config.command` as a non-empty argv list".into(),
        ));
    }
    let argv: Vec<String> = cfg
        .command
        .iter()
        .enumerate()
        .map(
            |(i, raw)| match call.rendered.get(&format!("command/{i}")) {
                Some(text) => text.clone(),
                None => raw.clone(),
            },
        )
        .collect();
    if argv[0].trim().is_empty() {
        return Err(Error::Config(
            "`command[0]` (the program) rendered to an empty string".into(),
        ));
    }
    Ok(argv)
}

/// `executor_config.env` with `${VAR}` expanded against the service's environment.
fn env(cfg: &ShellConfig) -> Vec<(String, String)> {
    cfg.env
        .iter()
        .map(|(name, text)| (name.clone(), expand(text)))
        .collect()
}

fn cwd(cfg: &ShellConfig) -> Result<Option<String>, Error> {
    let Some(dir) = &cfg.cwd else {
        return Ok(None);
    };
    let dir = expand(dir);
    // Checked here because a missing cwd makes spawn fail with ENOENT, which would
    // read as if the program were missing.
    if !Path::new(&dir).is_dir() {
        return Err(Error::Config(format!(
            "`executor_config.cwd` `{dir}` is not a directory"
        )));
    }
    Ok(Some(dir))
}

fn expand(text: &str) -> String {
    let mut missing = Vec::new();
    let out = expand_env(text, &|k| std::env::var(k).ok(), &mut missing);
    for name in missing {
        tracing::warn!(variable = %name, "Environment variable for a shell step is not set; it expands to an empty string.");
    }
    out
}

/// The child and its process group. Dropping it before the child was reaped
/// kills the whole group: the runner enforces step timeouts by dropping the call.
struct Group {
    child: Child,
    /// The group id; `None` once the child has been reaped. After that the id may
    /// belong to an unrelated process, so it must never be signalled again.
    pgid: Option<libc::pid_t>,
}

impl Group {
    fn new(child: Child) -> Group {
        // With `process_group(0)` the child leads a group whose id is its pid.
        let pgid = child.id().and_then(|id| libc::pid_t::try_from(id).ok());
        Group { child, pgid }
    }

    /// Reads both streams and waits for the exit status.
    async fn collect(&mut self) -> std::io::Result<(ExitStatus, Captured, Captured)> {
        let mut out = Captured::default();
        let mut err = Captured::default();
        let stdout = self.child.stdout.take();
        let stderr = self.child.stderr.take();
        let status = {
            let readers = async { tokio::join!(out.fill(stdout), err.fill(stderr)) };
            tokio::pin!(readers);
            tokio::select! {
                _ = &mut readers => self.wait().await?,
                status = self.wait() => {
                    let status = status?;
                    let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, &mut readers).await;
                    status
                }
            }
        };
        Ok((status, out, err))
    }

    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child.wait().await?;
        self.pgid = None;
        Ok(status)
    }

    /// Kills the group and reaps the child.
    async fn kill(&mut self) {
        self.kill_group();
        let _ = self.wait().await;
    }

    fn kill_group(&mut self) {
        if let Some(pgid) = self.pgid {
            // SAFETY: kill(2) has no memory-safety preconditions; the child is not
            // reaped yet, so the group id cannot have been reused.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // Runs before `child` is dropped, whose `kill_on_drop` then reaps it.
        self.kill_group();
    }
}

/// One output stream, capped at [`MAX_OUTPUT_BYTES`].
#[derive(Debug, Default)]
pub struct Captured {
    pub bytes: Vec<u8>,
    /// More was written than kept.
    pub truncated: bool,
}

impl Captured {
    async fn fill(&mut self, stream: Option<impl AsyncRead + Unpin>) {
        let Some(mut stream) = stream else { return };
        let mut buf = [0u8; 8192];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let room = MAX_OUTPUT_BYTES - self.bytes.len();
                    self.bytes.extend_from_slice(&buf[..n.min(room)]);
                    self.truncated |= n > room;
                }
            }
        }
    }
}
