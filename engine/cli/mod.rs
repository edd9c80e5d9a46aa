//! Command-line interface (docs/reference.md). Exit status: 0 success, 1 a
//! config, store or server error, 2 a run that ended in a non-success status,
//! 64 (`EX_USAGE`) a usage error (unknown flag, missing or malformed argument).
//! Output to a closed pipe (`runs list | head -1`) ends quietly with 0.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Exit status of a usage error (`EX_USAGE` of sysexits.h).
pub const USAGE: i32 = 64;

mod approvals;
mod completions;
mod demo_mcp;
mod healthcheck;
pub mod logging;
#[cfg(test)]
mod reference_doc;
mod replicas;
mod run;
mod runs;
mod schema;
mod serve;
mod store;
mod test;
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
        /// Fail (exit 1) on warnings too, for CI.
        #[arg(long)]
        strict: bool,
    },
    /// Trigger one run in this process and drive it to the end.
    Run {
        /// A pipeline name or a pipeline file.
        pipeline: String,
        /// A JSON payload file, or `-` to read it from standard input.
        #[arg(long, value_name = "FILE")]
        payload: Option<PathBuf>,
        /// How to read the payload.
        #[arg(long, default_value = "generic", value_parser = ["generic", "alertmanager"])]
        source: String,
        /// Set a label: `--set service=checkout` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE", value_parser = key_value)]
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
    /// Exit 0 when the server's `GET /readyz` answers 200 within 3 s, else 1 with
    /// the reason on stderr (a container's health check; needs no config file).
    Healthcheck {
        /// The server's base URL (default: from config.yaml `server` when the file
        /// exists, else http://127.0.0.1:8000).
        #[arg(long, env = "VECTORSTEP_URL")]
        url: Option<String>,
    },
    /// Print the JSON Schema of pipeline files (default) or of config.yaml, for
    /// editors and CI: `vectorstep schema > vectorstep.schema.json`.
    Schema {
        /// Which files the schema describes.
        #[arg(value_enum, default_value_t = schema::SchemaKind::Pipeline)]
        which: schema::SchemaKind,
    },
    /// Run a pipeline against scripted executor answers from fixture files (no
    /// network, no side effects, a store in a temp folder) and compare each run
    /// with its expectations; exit 0 when every case passes, 1 otherwise.
    Test {
        /// The pipeline: a name in the configured folder, or a file.
        pipeline: String,
        /// The folder of cases, one YAML file each (default: fixtures/<name>/
        /// beside the pipeline's file).
        #[arg(long, value_name = "DIR")]
        fixtures: Option<PathBuf>,
    },
    /// Print shell completions: `vectorstep completions bash > /etc/bash_completion.d/vectorstep`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
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
        /// Print the body of `GET /approvals` instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending approval.
    Approve {
        /// The approval's token (from `approvals list` or the approval link).
        token: String,
        /// Who decides, when the server has no auth (with an operator token the
        /// server records the operator).
        #[arg(long)]
        by: Option<String>,
    },
    /// Reject a pending approval.
    Reject {
        /// The approval's token (from `approvals list` or the approval link).
        token: String,
        /// Who decides, when the server has no auth (with an operator token the
        /// server records the operator).
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
        /// Only runs with this status (running, completed, failed, ...).
        #[arg(long)]
        status: Option<String>,
        /// Only runs of this pipeline.
        #[arg(long)]
        pipeline: Option<String>,
        /// At most this many runs.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print JSON (`{"runs": [...]}`, as `GET /runs`) instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// One run with its steps and run log.
    Show {
        /// The run's id (`runs list` shows them).
        run_id: String,
        /// Print the run as JSON (the shape of `GET /runs/{id}`).
        #[arg(long)]
        json: bool,
        /// Also print each step's output and error.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Cancel a running run at its next step boundary, through the running server.
    Cancel {
        /// The run's id.
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
        /// The run to replay.
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

/// Installs the log subscriber (`logging::init`).
pub fn init_logging(config: &vectorstep::config::Config, default_level: &str) {
    logging::init(config, default_level);
}

/// `--set`'s `KEY=VALUE`, refused by the parser (a usage error) otherwise.
fn key_value(s: &str) -> Result<String, String> {
    match s.split_once('=') {
        Some((k, _)) if !k.trim().is_empty() => Ok(s.to_string()),
        _ => Err(format!("expected KEY=VALUE, got `{s}`")),
    }
}

/// Output to a closed pipe (`runs list | head -1`) ends the command quietly with
/// 0: what was wanted has been read. `print!` panics on a write error, so the
/// panic hook recognises that one case; every other panic keeps the default
/// report.
fn quiet_on_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to std") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        if logging::is_json() {
            let mut fields = serde_json::Map::new();
            if let Some(at) = info.location() {
                fields.insert("location".into(), serde_json::Value::from(at.to_string()));
            }
            logging::line(tracing::Level::ERROR, &format!("panic: {message}"), fields);
            return;
        }
        default(info);
    }));
}

/// Whether `--config` was given explicitly (a missing explicit file is an error).
fn config_is_explicit() -> bool {
    std::env::args().any(|a| a == "--config" || a.starts_with("--config="))
        || std::env::var_os("VECTORSTEP_CONFIG").is_some()
}

pub fn load_config(path: &std::path::Path) -> anyhow::Result<vectorstep::config::Config> {
    load_config_counting(path).map(|(config, _)| config)
}

/// [`load_config`] with its warnings and errors printed as printed by [`logging`].
pub fn load_config_counting(
    path: &std::path::Path,
) -> anyhow::Result<(vectorstep::config::Config, usize)> {
    load_config_as(path, false)
}

/// Loads the config, printing its warnings (as log lines in its log format for an
/// `acting` command); the number of warnings.
fn load_config_as(
    path: &std::path::Path,
    acting: bool,
) -> anyhow::Result<(vectorstep::config::Config, usize)> {
    match vectorstep::config::Config::load(path, config_is_explicit()) {
        Ok((config, warnings)) => {
            // An acting command's warnings are log lines, in its log format.
            if acting {
                logging::use_format_of(&config);
            }
            for w in warnings.iter() {
                logging::diagnostic(w);
            }
            Ok((config, warnings.iter().count()))
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
    let (config, _) = load_config_as(path, true)?;
    if let Err(d) = config.require_secrets() {
        for e in d.iter() {
            logging::diagnostic(e);
        }
        anyhow::bail!(
            "{} secret(s) in {} expand to nothing; refusing to start with them disabled",
            d.error_count(),
            path.display()
        );
    }
    Ok(config)
}

pub fn main() -> i32 {
    quiet_on_closed_pipe();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            // `--help` and `--version` are not errors.
            return if e.use_stderr() { USAGE } else { 0 };
        }
    };
    let result = match &cli.command {
        Command::Serve => serve::serve(&cli),
        Command::Validate { paths, strict } => validate::validate(&cli, paths, *strict),
        Command::Completions { shell } => Ok(completions::print(*shell)),
        Command::Schema { which } => schema::print(*which),
        Command::Test { pipeline, fixtures } => test::test(&cli, pipeline, fixtures.as_ref()),
        Command::Healthcheck { url } => healthcheck::check(&cli, url.as_deref()),
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
            command:
                RunsCommand::Show {
                    run_id,
                    json,
                    verbose,
                },
        } => run::show(&cli, run_id, *json, *verbose),
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
            logging::line(tracing::Level::ERROR, &error_text(&e), Default::default());
            1
        }
    }
}

/// An error with its causes, each said once: many of the library's messages
/// already end with their source's text (`cannot read x: No such file`), which
/// `{:#}` would repeat.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let said = cause.to_string();
        if text.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn an_error_says_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory");
        let e = anyhow::Error::new(io).context("cannot read nope.yaml: No such file or directory");
        assert_eq!(
            super::error_text(&e),
            "cannot read nope.yaml: No such file or directory"
        );
        let e = anyhow::anyhow!("disk full").context("cannot open the store");
        assert_eq!(super::error_text(&e), "cannot open the store: disk full");
    }

    /// Every command, flag and argument explains itself in `--help`.
    #[test]
    fn every_command_flag_and_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let builtin = matches!(a.get_id().as_str(), "help" | "version");
                if !builtin && !a.is_hide_set() && a.get_help().is_none() {
                    missing.push(format!("{path} {}", a.get_id()));
                }
            }
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
                let name = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    missing.push(name.clone());
                }
                walk(sub, &name, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "vectorstep", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:#?}");
    }

    #[test]
    fn set_takes_key_equals_value_only() {
        for (arg, ok) in [
            ("a=b", true),
            ("a=", true),
            ("a==b", true),
            ("=b", false),
            ("ab", false),
        ] {
            assert_eq!(super::key_value(arg).is_ok(), ok, "{arg}");
        }
    }
}
