//! `dxdp config show` and `dxdp config check FILE`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use dxdp::config::file::{self, ConfigFile};
use dxdp::config::{Config, Inputs};

/// `dxdp config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the effective configuration and where each value came from.
    Show {
        /// Print JSON: {"file", "values": {key: {"value", "origin"}}}.
        #[arg(long)]
        json: bool,
    },
    /// Validate a configuration file; exit 1 with file:line:column and what is allowed.
    Check {
        /// The file.
        file: PathBuf,
    },
}

/// Runs a `config` subcommand.
pub fn run(cmd: &ConfigCommand, config: &Config, inputs: &Inputs) -> anyhow::Result<ExitCode> {
    match cmd {
        ConfigCommand::Show { json } => {
            let file = inputs.file.as_ref().map(|(p, _)| p.display().to_string());
            let text = if *json {
                let values = config.show_json();
                serde_json::to_string_pretty(&serde_json::json!({"file": file, "values": values}))?
                    + "\n"
            } else {
                let header = match &file {
                    Some(f) => format!("# configuration file: {f}\n"),
                    None => "# no configuration file\n".to_string(),
                };
                header + &config.show()
            };
            std::io::stdout().write_all(text.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Check { file: path } => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                anyhow::anyhow!("cannot read configuration file {}: {e}", path.display())
            })?;
            match file::parse::<ConfigFile>(&text, &path.display().to_string()) {
                Ok(_) => {
                    println!("{}: valid", path.display());
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("{e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}
