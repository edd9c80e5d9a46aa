//! Command-line interface (SPEC section 1). Exit status: 0 success, 1 usage or
//! config error, 2 a run that ended in a non-success status; `store copy` exits 2
//! on a usage error and 1 when the copy is refused or fails; `runs cancel` and
//! `runs replay` exit 64 (`EX_USAGE`) on a usage error and 1 on a server error.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod approvals;
mod demo_mcp;
mod replicas;
mod run;
mod runs;
mod serve;
mod store;
mod tools;
mod validate;

#[derive(Parser, Debug)]
#[command(
    name = "vectorstep",
    version,
    about = "Durable YAML ops-automation pipelines"
)]
pub struct Cli {
    /// The config file.
    #[arg(
        long,
        global = true,
        env = "VECTORSTEP_CONFIG",
        default_value = "./config.yaml"
    )]
    pub config: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the service: HTTP API, startup sweep and resume, graceful drain on SIGTERM.
    Serve,
    /// Load and validate pipelines (default: the configured pipeline folder) and the step library.
    Validate {
        /// Pipeline files or folders.
        paths: Vec<PathBuf>,
    },
    /// Trigger one run in this process and drive it to the end.
    Run {
        /// A pipeline name or a pipeline file.
        pipeline: String,
        /// A JSON payload file.
        #[arg(long)]
        payload: Option<PathBuf>,
        /// How to read the payload.
        #[arg(long, default_value = "generic", value_parser = ["generic", "alertmanager"])]
        source: String,
        /// Set a label: `--set service=checkout` (repeatable).
        #[arg(long = "set")]
        set: Vec<String>,
        /// Print the run as JSON (the shape of `GET /runs/{id}`).
        #[arg(long)]
        json: bool,
    },
    /// Inspect stored runs.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
    },
    /// Show what the next start would do with every `running` run.
    Sweep {
        /// Required: the sweep is only ever previewed from the CLI.
        #[arg(long, required = true)]
        dry_run: bool,
    },
    /// List and decide pending approvals through the running server.
    Approvals {
        /// The server's base URL (default: from config.yaml `server`).
        #[arg(long, global = true, env = "VECTORSTEP_URL")]
        url: Option<String>,
        /// The bearer token to send (an operator token when the server has auth).
        #[arg(
            long = "token",
            id = "bearer",
            global = true,
            env = "VECTORSTEP_TOKEN",
            hide_env_values = true
        )]
        bearer: Option<String>,
        #[command(subcommand)]
        command: ApprovalsCommand,
    },
    /// The replicas sharing the store (PostgreSQL), their heartbeats and the runs
    /// each holds, through the running server.
    Replicas {
        /// The server's base URL (default: from config.yaml `server`).
        #[arg(long, global = true, env = "VECTORSTEP_URL")]
        url: Option<String>,
        /// The bearer token to send (an operator token when the server has auth).
        #[arg(
            long = "token",
            id = "bearer",
            global = true,
            env = "VECTORSTEP_TOKEN",
            hide_env_values = true
        )]
        bearer: Option<String>,
        #[command(subcommand)]
        command: ReplicasCommand,
    },
    /// Print a pipeline's config fingerprint.
    Fingerprint {
        /// A pipeline name (from the configured folder) or a pipeline file.
        pipeline: String,
    },
    /// The tools of the agents in config.yaml (connects to their MCP servers).
    Tools {
        #[command(subcommand)]
        command: ToolsCommand,
    },
    /// Move a store's rows: `store copy --from sqlite:PATH --to postgres://...`.
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// A demo MCP server on stdin/stdout with canned ops tools, for the offline
    /// agent sample (samples/agents/). Hidden: it is a fixture, not a command.
    #[command(hide = true)]
    DemoMcp,
}

#[derive(Subcommand, Debug)]
pub enum StoreCommand {
    /// Copy every run, step, event, approval, notification and journal row from one
    /// store into another, empty one (e.g. to move a single node to replicas). Stop
    /// `serve` on the source first.
    Copy {
        /// The store to copy: `sqlite:PATH` (or a bare PATH) or `postgres://...`.
        #[arg(long)]
        from: String,
        /// The empty store to copy into: `sqlite:PATH` or `postgres://...`
        /// (`postgresql://` too).
        #[arg(long)]
        to: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum ToolsCommand {
    /// Every tool each agent (or AGENT) would be offered, with its effect class and
    /// approval rule; exit 1 when a server cannot be reached or lacks an `only` tool.
    List {
        /// One agent (default: every agent that lists tools).
        agent: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ApprovalsCommand {
    /// Pending approvals.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending approval.
    Approve {
        token: String,
        #[arg(long)]
        by: Option<String>,
    },
    /// Reject a pending approval.
    Reject {
        token: String,
        #[arg(long)]
        by: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ReplicasCommand {
    /// Every replica the store holds, live or not: id, kind, live, heartbeat age,
    /// runs held (an empty list on SQLite, where a single serve registers none).
    List {
        /// Print the body of `GET /replicas` instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// How a command reaches the running server (see `approvals::Server`).
#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// The server's base URL (default: from config.yaml `server`).
    #[arg(long, env = "VECTORSTEP_URL")]
    url: Option<String>,
    /// The bearer token to send (an operator token when the server has auth).
    #[arg(
        long = "token",
        id = "bearer",
        env = "VECTORSTEP_TOKEN",
        hide_env_values = true
    )]
    bearer: Option<String>,
}

impl ServerArgs {
    fn server(&self) -> approvals::Server<'_> {
        approvals::Server {
            url: self.url.as_deref(),
            token: self.bearer.as_deref(),
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum RunsCommand {
    /// List runs, newest first.
    List {
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        pipeline: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// One run with its steps and run log.
    Show {
        run_id: String,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a running run at its next step boundary, through the running server.
    Cancel {
        run_id: String,
        /// Who cancels, when the server has no auth (with an operator token the
        /// server records the operator). Default: `$USER`.
        #[arg(long)]
        by: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
    /// Start a new run of the same pipeline and trigger that reuses the recorded
    /// steps before STEP and runs from STEP on, through the running server.
    Replay {
        run_id: String,
        /// The top-level step to start from.
        #[arg(long = "from", value_name = "STEP")]
        from: String,
        /// Who asks, when the server has no auth (with an operator token the
        /// server records the operator). Default: `$USER`.
        #[arg(long)]
        by: Option<String>,
        #[command(flatten)]
        server: ServerArgs,
    },
}

/// Installs the log subscriber: `RUST_LOG` wins, else `default_level` for one-shot
/// commands or the configured level for the server.
pub fn init_logging(config: &vectorstep::config::Config, default_level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if config.logging.json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Whether the command line is a `store` command (its usage errors exit 2): the
/// first argument that is neither an option nor `--config`'s value.
fn is_store_command() -> bool {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--config" {
            args.next();
        } else if !a.starts_with('-') {
            return a == "store";
        }
    }
    false
}

/// Whether the command line is `runs cancel` or `runs replay` (its usage errors
/// exit 64): the first two arguments that are neither options nor `--config`'s
/// value.
fn is_remote_runs_command() -> bool {
    let mut words = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--config" {
            args.next();
        } else if !a.starts_with('-') {
            words.push(a);
            if words.len() == 2 {
                break;
            }
        }
    }
    matches!(
        words.iter().map(String::as_str).collect::<Vec<_>>()[..],
        ["runs", "cancel" | "replay"]
    )
}

/// Whether `--config` was given explicitly (a missing explicit file is an error).
fn config_is_explicit() -> bool {
    std::env::args().any(|a| a == "--config" || a.starts_with("--config="))
        || std::env::var_os("VECTORSTEP_CONFIG").is_some()
}

pub fn load_config(path: &std::path::Path) -> anyhow::Result<vectorstep::config::Config> {
    match vectorstep::config::Config::load(path, config_is_explicit()) {
        Ok((config, warnings)) => {
            for w in warnings.iter() {
                eprintln!("{w}");
            }
            Ok(config)
        }
        Err(vectorstep::config::Error::Invalid(d)) => {
            eprint!("{d}");
            anyhow::bail!("{} error(s) in {}", d.error_count(), path.display())
        }
        Err(e) => Err(e.into()),
    }
}

/// The config for a command that acts on it (`serve`, `run`): besides loading,
/// every secret that expanded empty from a `${VAR}` without a default stops the
/// start, naming the key and the variable, instead of silently disabling a check.
pub fn load_acting_config(path: &std::path::Path) -> anyhow::Result<vectorstep::config::Config> {
    let config = load_config(path)?;
    if let Err(d) = config.require_secrets() {
        eprint!("{d}");
        anyhow::bail!(
            "{} secret(s) in {} expand to nothing; refusing to start with them disabled",
            d.error_count(),
            path.display()
        );
    }
    Ok(config)
}

pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match (e.use_stderr(), is_store_command()) {
                (false, _) => 0,
                (true, true) => store::USAGE,
                (true, false) if is_remote_runs_command() => runs::USAGE,
                (true, false) => 1,
            };
        }
    };
    let result = match &cli.command {
        Command::Serve => serve::serve(&cli),
        Command::Validate { paths } => validate::validate(&cli, paths),
        Command::Fingerprint { pipeline } => validate::fingerprint(&cli, pipeline),
        Command::Tools {
            command: ToolsCommand::List { agent },
        } => tools::list(&cli, agent.as_deref()),
        Command::Run {
            pipeline,
            payload,
            source,
            set,
            json,
        } => run::run(
            &cli,
            run::RunArgs {
                pipeline,
                payload: payload.as_ref(),
                source,
                set,
                json: *json,
            },
        ),
        Command::Runs {
            command:
                RunsCommand::List {
                    status,
                    pipeline,
                    limit,
                    json,
                },
        } => run::list(&cli, status.clone(), pipeline.clone(), *limit, *json),
        Command::Runs {
            command: RunsCommand::Show { run_id, json },
        } => run::show(&cli, run_id, *json),
        Command::Runs {
            command: RunsCommand::Cancel { run_id, by, server },
        } => runs::cancel(&cli, server.server(), run_id, by.as_deref()),
        Command::Runs {
            command:
                RunsCommand::Replay {
                    run_id,
                    from,
                    by,
                    server,
                },
        } => runs::replay(&cli, server.server(), run_id, from, by.as_deref()),
        Command::Sweep { .. } => run::sweep_dry_run(&cli),
        Command::DemoMcp => demo_mcp::serve(),
        Command::Replicas {
            url,
            bearer,
            command: ReplicasCommand::List { json },
        } => {
            let server = approvals::Server {
                url: url.as_deref(),
                token: bearer.as_deref(),
            };
            replicas::list(&cli, server, *json)
        }
        Command::Store {
            command: StoreCommand::Copy { from, to },
        } => Ok(store::copy(from, to)),
        Command::Approvals {
            url,
            bearer,
            command,
        } => {
            let server = approvals::Server {
                url: url.as_deref(),
                token: bearer.as_deref(),
            };
            match command {
                ApprovalsCommand::List { json } => approvals::list(&cli, server, *json),
                ApprovalsCommand::Approve { token, by } => {
                    approvals::decide(&cli, server, token, true, by.as_deref())
                }
                ApprovalsCommand::Reject { token, by } => {
                    approvals::decide(&cli, server, token, false, by.as_deref())
                }
            }
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

/// The store `config` names (SQLite file or PostgreSQL URL), with the place in the
/// error when it cannot be opened.
pub(crate) fn open_store(
    config: &vectorstep::config::Config,
) -> anyhow::Result<vectorstep::store::Store> {
    use anyhow::Context;
    let place = match &config.database_url {
        Some(url) => vectorstep::store::redact_url(url),
        None => config.database_path.display().to_string(),
    };
    config
        .open_store()
        .with_context(|| format!("cannot open the store at {place}"))
}
