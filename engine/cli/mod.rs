//! Command-line interface (SPEC section 1). Exit status: 0 success, 1 usage or
//! config error, 2 a run that ended in a non-success status.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

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
    /// Load and validate pipelines (default: the configured pipeline folder) and the step library.
    Validate {
        /// Pipeline files or folders.
        paths: Vec<PathBuf>,
    },
    /// Print a pipeline's config fingerprint.
    Fingerprint {
        /// A pipeline name (from the configured folder) or a pipeline file.
        pipeline: String,
    },
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

pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 1 } else { 0 };
        }
    };
    let result = match &cli.command {
        Command::Validate { paths } => validate::validate(&cli, paths),
        Command::Fingerprint { pipeline } => validate::fingerprint(&cli, pipeline),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}
