//! `vectorstep completions bash|zsh|fish`: shell completions generated from the
//! same clap definitions that parse the command line, so they cannot drift.

use clap::CommandFactory;

pub fn print(shell: clap_complete::Shell) -> i32 {
    let mut command = super::Cli::command();
    clap_complete::generate(shell, &mut command, "vectorstep", &mut std::io::stdout());
    0
}
