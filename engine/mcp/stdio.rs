//! Stdio MCP servers as child processes.
//!
//! Rules (SPEC 10, "stdio servers run in their own process group and die with
//! `serve`"):
//! - `command` is an argv list run without a shell; `env` is added to ours.
//!   `command[0]` is looked up on `PATH`, except `vectorstep`, which is this very
//!   binary (see [`program`]).
//! - The child leads a process group of its own (`process_group(0)`), so a
//!   timeout or shutdown kills the server and everything it started, and a
//!   Ctrl-C in a terminal does not reach it before we decide.
//! - It is started with `PR_SET_PDEATHSIG = SIGKILL`, so it dies with us even
//!   when we are killed with SIGKILL and no cleanup code runs. Linux delivers
//!   that signal when the *thread* that forked the child exits, not the process:
//!   every child is therefore forked by one spawner thread that lives as long as
//!   the process, never by a tokio worker or blocking thread that may go away.
//! - Its stderr goes to the service log line by line, never to our stdout.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::mpsc;
use std::sync::OnceLock;

use rmcp::transport::TokioChildProcess;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{ChildStderr, Command};

/// The process group of a running stdio server (its id is the server's pid).
#[derive(Debug)]
pub(super) struct Group {
    pid: u32,
}

impl Group {
    /// Sends SIGKILL to the whole group. A group that is already gone is fine.
    pub(super) fn kill(&self) {
        let Ok(pid) = i32::try_from(self.pid) else {
            return;
        };
        if pid <= 1 {
            return;
        }
        // SAFETY: kill(2) with a negative pid signals that process group; it
        // touches no memory of ours.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The thread every stdio server is forked from (see the module comment).
fn spawner() -> &'static mpsc::Sender<Job> {
    static SPAWNER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("mcp-spawner".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            });
        if let Err(e) = started {
            // The receiver is gone with the failed thread: every spawn then
            // fails with a message instead of hanging.
            tracing::error!(error = %e, "Cannot start the MCP spawner thread.");
        }
        tx
    })
}

/// Starts the stdio server `name`: the rmcp transport over its stdin and
/// stdout, and its process group. Its stderr is forwarded to the log.
pub(super) async fn spawn(
    name: &str,
    command: &[String],
    env: &BTreeMap<String, String>,
) -> Result<(TokioChildProcess, Group), String> {
    let Some((program, args)) = command.split_first() else {
        return Err("empty command".into());
    };
    let mut cmd = Command::new(self::program(program));
    cmd.args(args).envs(env).process_group(0);
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe calls (prctl, getppid) and allocates nothing (after a
    // fork in a threaded process an allocation may deadlock).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then nobody
            // would ever kill this child.
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        // The child's pipes register with the caller's runtime.
        let _entered = handle.enter();
        let spawned = TokioChildProcess::builder(cmd)
            .stderr(Stdio::piped())
            .spawn();
        let _ = tx.send(spawned);
    });
    spawner()
        .send(job)
        .map_err(|_| "the MCP spawner thread is not running".to_string())?;
    let (child, stderr) = rx
        .await
        .map_err(|_| "the MCP spawner thread is not running".to_string())?
        .map_err(|e| format!("cannot start `{program}`: {e}"))?;
    let Some(pid) = child.id() else {
        return Err(format!("`{program}` exited at once"));
    };
    tracing::info!(server = %name, pid, program = %program, "MCP server started.");
    if let Some(stderr) = stderr {
        tokio::spawn(forward_stderr(name.to_string(), pid, stderr));
    }
    Ok((child, Group { pid }))
}

/// What runs for `command[0]`. `vectorstep` is the running binary itself, so a
/// server built into it (`vectorstep demo-mcp`) is the same build as the service,
/// under `cargo run` and from an unpacked release alike, without being on `PATH`.
/// Only when this process *is* vectorstep (a test harness is not) and its file
/// still exists (a deploy may have replaced it); otherwise `PATH` decides.
fn program(name: &str) -> std::ffi::OsString {
    if name == "vectorstep" {
        if let Ok(exe) = std::env::current_exe() {
            if exe.file_stem().is_some_and(|s| s == "vectorstep") && exe.is_file() {
                return exe.into_os_string();
            }
        }
    }
    name.into()
}

/// Logs each line the server writes to stderr until it closes.
async fn forward_stderr(server: String, pid: u32, stderr: ChildStderr) {
    let mut lines = BufReader::new(stderr).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                tracing::info!(server = %server, pid, stderr = %line, "MCP server stderr.")
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(server = %server, pid, error = %e, "MCP server stderr unreadable.");
                break;
            }
        }
    }
}
