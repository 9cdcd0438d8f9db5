//! Where a configuration value came from, typed: code decides on the kind of source (a default,
//! a file, a variable, a flag) and never on the words `config show` prints for people, which
//! [`Origin`]'s `Display` writes (`env DXDP_REPLICAS (overrides file C:\etc\dxdp\config.yaml: 2)`).

use std::fmt;
use std::path::PathBuf;

/// The source of one key's effective value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// dxdp's built-in default.
    Default,
    /// Which named configuration is in force, and why (the `configuration` key alone; the words
    /// are [`super::Selection::reason`], the kind is [`super::SelectedBy`]).
    Selection(String),
    /// A configuration file.
    File {
        /// The file, as named.
        path: PathBuf,
        /// Which part of which kind of file.
        part: FilePart,
    },
    /// An environment variable.
    Env {
        /// The variable.
        name: String,
        /// The values it hid, in the order they were hidden: each is named, so that an edit
        /// that changes nothing is explained.
        overrides: Vec<Overridden>,
    },
    /// A command-line flag (`--replicas`).
    Flag(&'static str),
}

/// Which part of which file set a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilePart {
    /// dxdp's file, its top level.
    TopLevel,
    /// dxdp's file, `configurations.<name>`.
    Configuration(String),
    /// A reference-plugin file that `variable` (`WDDM_DEVICE_PLUGIN_CONFIG_FILE`) names.
    Reference {
        /// The variable.
        variable: String,
    },
    /// The reference plugin's default file (`wddm.yaml`), read as if `variable` named it.
    ReferenceDefault {
        /// The variable that would name it.
        variable: String,
    },
}

/// A value an environment variable hid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overridden {
    /// One of the reference plugin's variables (`WDDM_DEVICE_PLUGIN_MULTITENANCY=4`).
    ReferenceEnv {
        /// The variable.
        name: String,
        /// Its value, as set.
        value: String,
    },
    /// A file's value, shown as `config show` shows values.
    File {
        /// Where the file's value came from.
        origin: Box<Origin>,
        /// The value.
        value: String,
    },
}

impl Origin {
    /// The plain origin of a variable.
    pub(crate) fn env(name: impl Into<String>) -> Origin {
        Origin::Env {
            name: name.into(),
            overrides: Vec::new(),
        }
    }

    /// The top level of dxdp's file at `path`.
    pub(crate) fn file(path: impl Into<PathBuf>) -> Origin {
        Origin::File {
            path: path.into(),
            part: FilePart::TopLevel,
        }
    }

    /// Whether the value is dxdp's built-in default.
    pub fn is_default(&self) -> bool {
        *self == Origin::Default
    }

    /// Whether a file set the value.
    pub(crate) fn is_file(&self) -> bool {
        matches!(self, Origin::File { .. })
    }

    /// The variable that set the value, when one did.
    pub(crate) fn variable(&self) -> Option<&str> {
        match self {
            Origin::Env { name, .. } => Some(name),
            _ => None,
        }
    }

    /// The reference plugin's variable that set the value, when one did
    /// (`WDDM_DEVICE_PLUGIN_*`, `MCDM_DEVICE_PLUGIN_*`).
    pub(crate) fn reference_variable(&self) -> Option<&str> {
        self.variable().filter(|v| is_reference_variable(v))
    }
}

/// Whether `name` is one of the reference plugin's variables.
pub(crate) fn is_reference_variable(name: &str) -> bool {
    name.starts_with("WDDM_DEVICE_PLUGIN_") || name.starts_with("MCDM_DEVICE_PLUGIN_")
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::Selection(reason) => f.write_str(reason),
            Origin::File { path, part } => {
                write!(f, "file {}", path.display())?;
                match part {
                    FilePart::TopLevel => Ok(()),
                    FilePart::Configuration(name) => write!(f, " (configuration {name})"),
                    FilePart::Reference { variable } => write!(f, " ({variable})"),
                    FilePart::ReferenceDefault { variable } => {
                        write!(f, " (the reference plugin's default file, as {variable})")
                    }
                }
            }
            Origin::Env { name, overrides } => {
                write!(f, "env {name}")?;
                for o in overrides {
                    match o {
                        Overridden::ReferenceEnv { name, value } => {
                            write!(f, " (overrides env {name}={value})")?
                        }
                        Overridden::File { origin, value } => {
                            write!(f, " (overrides {origin}: {value})")?
                        }
                    }
                }
                Ok(())
            }
            Origin::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

impl serde::Serialize for Origin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_reads_as_config_show_has_always_printed_it() {
        let file = Origin::file("/etc/dxdp/config.yaml");
        let table: Vec<(Origin, &str)> = vec![
            (Origin::Default, "default"),
            (
                Origin::Selection("default: no configuration selected".into()),
                "default: no configuration selected",
            ),
            (file.clone(), "file /etc/dxdp/config.yaml"),
            (
                Origin::File {
                    path: "/etc/dxdp/config.yaml".into(),
                    part: FilePart::Configuration("big".into()),
                },
                "file /etc/dxdp/config.yaml (configuration big)",
            ),
            (
                Origin::File {
                    path: "/r/wddm.yaml".into(),
                    part: FilePart::Reference {
                        variable: "WDDM_DEVICE_PLUGIN_CONFIG_FILE".into(),
                    },
                },
                "file /r/wddm.yaml (WDDM_DEVICE_PLUGIN_CONFIG_FILE)",
            ),
            (
                Origin::File {
                    path: "/r/mcdm.yaml".into(),
                    part: FilePart::ReferenceDefault {
                        variable: "MCDM_DEVICE_PLUGIN_CONFIG_FILE".into(),
                    },
                },
                "file /r/mcdm.yaml (the reference plugin's default file, as MCDM_DEVICE_PLUGIN_CONFIG_FILE)",
            ),
            (Origin::env("DXDP_REPLICAS"), "env DXDP_REPLICAS"),
            (
                Origin::Env {
                    name: "DXDP_REPLICAS".into(),
                    overrides: vec![
                        Overridden::ReferenceEnv {
                            name: "WDDM_DEVICE_PLUGIN_MULTITENANCY".into(),
                            value: "4".into(),
                        },
                        Overridden::File {
                            origin: Box::new(file),
                            value: "2".into(),
                        },
                    ],
                },
                "env DXDP_REPLICAS (overrides env WDDM_DEVICE_PLUGIN_MULTITENANCY=4) (overrides file /etc/dxdp/config.yaml: 2)",
            ),
            (Origin::Flag("--replicas"), "flag --replicas"),
        ];
        for (origin, want) in table {
            assert_eq!(origin.to_string(), want);
            assert_eq!(serde_json::to_value(&origin).ok(), Some(want.into()));
        }
    }

    #[test]
    fn the_kind_is_read_from_the_variant_not_the_words() {
        assert!(Origin::Default.is_default());
        // A selection whose words start with "default" is no default value.
        assert!(!Origin::Selection("default: node n1 has no label x".into()).is_default());
        assert!(Origin::file("env DXDP_X").is_file());
        assert_eq!(Origin::file("env DXDP_X").variable(), None);
        assert_eq!(
            Origin::env("WDDM_DEVICE_PLUGIN_MULTITENANCY").reference_variable(),
            Some("WDDM_DEVICE_PLUGIN_MULTITENANCY")
        );
        assert_eq!(Origin::env("DXDP_REPLICAS").reference_variable(), None);
        assert_eq!(Origin::Flag("--x").variable(), None);
    }
}
