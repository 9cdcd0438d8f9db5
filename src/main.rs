//! The `dxdp` binary: command-line edge of the library (argument parsing, exit codes, anyhow).

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
