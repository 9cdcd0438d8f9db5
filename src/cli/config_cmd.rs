//! `dxdp config show` and `dxdp config check FILE`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use clap::ValueEnum;
use dxdp::config::file::{ConfigFile, ReferenceFile};
use dxdp::config::reference_mapping;
use dxdp::config::{file, parse};
use dxdp::config::{Inputs, Resolved};
use dxdp_core::devices::Resource;

/// `dxdp config` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Print the effective configuration and where each value came from.
    Show {
        /// Output: text, or one document {"apiVersion", "kind": "Configuration", "file",
        /// "values": {key: {"value", "origin"}}} as JSON or YAML (schema:
        /// docs/schemas/Configuration.schema.json).
        #[command(flatten)]
        output: super::OutputArgs,
    },
    /// Print the JSON Schema of the configuration file (for editors and CI; the Helm chart's
    /// `config` value is checked against the same schema).
    Schema,
    /// Validate a configuration file; exit 1 with file:line:column and what is allowed. A
    /// reference-plugin file (WDDM_/MCDM_DEVICE_PLUGIN_CONFIG_FILE) is detected, or named with
    /// --reference, and each of its keys is shown with the dxdp key it sets.
    Check {
        /// The file.
        file: PathBuf,
        /// Check it as the reference plugin's file of this plugin.
        #[arg(long, value_enum, value_name = "PLUGIN")]
        reference: Option<ReferencePlugin>,
    },
}

/// Runs a `config` subcommand.
pub(crate) fn run(
    cmd: &ConfigCommand,
    config: &Resolved,
    inputs: &Inputs,
) -> anyhow::Result<ExitCode> {
    match cmd {
        ConfigCommand::Show { output } => {
            // A file that does not exist is not shown as if it were read.
            let (file, missing) = match &inputs.file {
                Some((p, _)) if p.exists() => (Some(p.display().to_string()), None),
                Some((p, _)) => (None, Some(p.display().to_string())),
                None => (None, None),
            };
            let mut notes: Vec<String> = missing
                .iter()
                .map(|p| format!("configuration file: none (would read {p})"))
                .collect();
            notes.extend(config.notices.iter().cloned());
            notes.extend(config.selection.warning.iter().cloned());
            let text = if output.is_document() {
                let values = config
                    .entries()
                    .into_iter()
                    .map(|(key, value, origin)| {
                        let value = dxdp::output::ConfigValue {
                            value,
                            origin: origin.to_string(),
                        };
                        (key.to_string(), value)
                    })
                    .collect();
                output.document(&dxdp::output::ConfigurationDoc {
                    api_version: dxdp::output::ApiVersion,
                    kind: dxdp::output::ConfigurationKind,
                    file,
                    values,
                    notes,
                })?
            } else {
                let mut header = match (&file, &missing) {
                    (Some(f), _) => format!("# configuration file: {f}\n"),
                    (None, Some(p)) => format!("# configuration file: none (would read {p})\n"),
                    (None, None) => "# configuration file: none\n".to_string(),
                };
                header.push_str(&format!("# configuration: {}\n", config.selection.reason));
                for n in notes
                    .iter()
                    .filter(|n| !n.starts_with("configuration file: "))
                {
                    header.push_str(&format!("# note: {n}\n"));
                }
                header + &config.show()
            };
            std::io::stdout().write_all(text.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Schema => {
            let text = serde_json::to_string_pretty(&file::config_schema())? + "\n";
            std::io::stdout().write_all(text.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Check {
            file: path,
            reference,
        } => {
            // A regular file only, bounded, as the daemon reads it (a FIFO is an error, never
            // a read that blocks).
            let text = dxdp::config::read_file(path)?;
            let origin = path.display().to_string();
            let max = parse::MAX_ERRORS;
            let outcome = match reference {
                Some(plugin) => parse::parse_all::<ReferenceFile>(&text, &origin, max)
                    .map(|f| reference_report(&origin, &f, &[*plugin])),
                None => match parse::parse_all::<ConfigFile>(&text, &origin, max) {
                    Ok(_) => Ok(format!("{origin}: valid\n")),
                    // Not dxdp's format: maybe the reference plugin's.
                    Err(e) => match parse::parse_all::<ReferenceFile>(&text, &origin, max) {
                        Ok(f) if !text.trim().is_empty() => Ok(reference_report(
                            &origin,
                            &f,
                            &[ReferencePlugin::Wddm, ReferencePlugin::Mcdm],
                        )),
                        // A reference-plugin file with a mistake: name that mistake, not
                        // its valid reference keys.
                        Err(reference) if looks_like_reference(&text) => Err(reference),
                        _ => Err(e),
                    },
                },
            };
            match outcome {
                Ok(report) => {
                    std::io::stdout().write_all(report.as_bytes())?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(errors) => {
                    for e in &errors {
                        eprintln!("{e}");
                    }
                    if errors.len() >= max {
                        eprintln!(
                            "{origin}: stopped after {max} errors; fix these and check again"
                        );
                    }
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

/// Whether a file's top-level keys are the reference plugin's (`multitenancy`,
/// `additionalMounts`, ... and none of dxdp's own top-level keys).
fn looks_like_reference(text: &str) -> bool {
    const REFERENCE: [&str; 5] = [
        "multitenancy",
        "includeIntegrated",
        "includeDetachable",
        "additionalMounts",
        "additionalMountsWow64",
    ];
    let Ok(serde_json::Value::Object(map)) = serde_saphyr::from_str::<serde_json::Value>(text)
    else {
        return false;
    };
    map.keys().any(|k| REFERENCE.contains(&k.as_str()))
}

/// Which reference plugin a file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ReferencePlugin {
    /// The WDDM plugin (WDDM_DEVICE_PLUGIN_CONFIG_FILE): directx.microsoft.com/display.
    Wddm,
    /// The MCDM plugin (MCDM_DEVICE_PLUGIN_CONFIG_FILE): directx.microsoft.com/compute.
    Mcdm,
}

/// "valid", and how each key maps for each plugin the file may belong to.
fn reference_report(origin: &str, f: &ReferenceFile, plugins: &[ReferencePlugin]) -> String {
    let mut out = format!("{origin}: valid reference-plugin file\n");
    for plugin in plugins {
        let (var, resource) = match plugin {
            ReferencePlugin::Wddm => ("WDDM_DEVICE_PLUGIN_CONFIG_FILE", Resource::Display),
            ReferencePlugin::Mcdm => ("MCDM_DEVICE_PLUGIN_CONFIG_FILE", Resource::Compute),
        };
        out.push_str(&format!("as {var}:\n"));
        for line in reference_mapping(f, resource) {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}
