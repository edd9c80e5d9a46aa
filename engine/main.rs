//! The `vectorstep` binary: argument parsing and exit codes. Everything it does is
//! a thin call into the library; errors become `anyhow` only here.

mod cli;

fn main() {
    let code = cli::main();
    std::process::exit(code);
}
