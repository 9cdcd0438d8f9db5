//! Configuration: built-in defaults < configuration file < environment < command-line flags,
//! with where every value came from, and the reference plugin's environment variables and files
//! for drop-in compatibility.
//!
//! - this module: the effective [`Config`], the [`Inputs`] it is built from, and errors;
//! - [`file`]: the file formats (dxdp's and the reference plugin's), strict, with positions;
//! - `layers`: how each layer changes the configuration and records origins;
//! - `show`: `dxdp config show` (typed values, text and JSON).
//!
//! Reloading on file changes is the daemon's job (`plugin::reload`).

pub mod file;
mod layers;
mod show;

use layers::{apply_env, apply_file, apply_flags, apply_reference};
pub use layers::{parse_resources, process_env, reference_mapping};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::logging::LogFormat;
use dxdp_core::devices::Resource;
use dxdp_core::pipeline::PipelineConfig;
use dxdp_core::policy::ResourcePolicy;
use file::{Assignment, ConfigFile, ReferenceFile};

/// Settings of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceSettings {
    /// Serve it.
    pub enabled: bool,
    /// The resource name registered with the kubelet.
    pub name: String,
    /// IDs per physical device.
    pub replicas: u32,
    /// Extra resource names advertising the same devices.
    pub aliases: Vec<String>,
    /// `allocationPolicy`, `multiDevice` and `cudaVisibleDevices`.
    pub policy: ResourcePolicy,
}

/// The effective configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `resources.display` and `resources.compute`.
    pub resources: BTreeMap<Resource, ResourceSettings>,
    /// Pipeline settings (device selection, runtime files).
    pub pipeline: PipelineConfig,
    /// Assignment mode.
    pub assignment: Assignment,
    /// Log level or filter.
    pub log_level: String,
    /// Log format.
    pub log_format: LogFormat,
    /// Where each key's value came from (`default`, `file <path>`, `env NAME`, `flag --x`).
    pub origins: BTreeMap<String, String>,
}

impl Default for Config {
    fn default() -> Self {
        let mut c = Config {
            resources: Resource::ALL
                .iter()
                .map(|&r| {
                    (
                        r,
                        ResourceSettings {
                            enabled: true,
                            name: r.default_resource_name().to_string(),
                            replicas: 1,
                            aliases: Vec::new(),
                            policy: ResourcePolicy::default(),
                        },
                    )
                })
                .collect(),
            pipeline: PipelineConfig::default(),
            assignment: Assignment::Auto,
            log_level: "info".into(),
            log_format: LogFormat::Text,
            origins: BTreeMap::new(),
        };
        for key in c.keys() {
            c.origins.insert(key, "default".into());
        }
        c
    }
}

impl Config {
    fn resource(&mut self, r: Resource) -> &mut ResourceSettings {
        self.resources.entry(r).or_insert_with(|| ResourceSettings {
            enabled: true,
            name: r.default_resource_name().to_string(),
            replicas: 1,
            aliases: Vec::new(),
            policy: ResourcePolicy::default(),
        })
    }

    /// The enabled resources with every name they are advertised under (name first).
    pub fn endpoints(&self) -> Vec<(Resource, String)> {
        let mut out = Vec::new();
        for (r, s) in &self.resources {
            if !s.enabled {
                continue;
            }
            out.push((*r, s.name.clone()));
            out.extend(s.aliases.iter().map(|a| (*r, a.clone())));
        }
        out
    }

    /// This configuration with `n` replicas for every resource.
    pub fn with_replicas(mut self, n: u32) -> Self {
        for r in Resource::ALL {
            self.resource(r).replicas = n;
        }
        self
    }

    /// The allocation policy of a resource (the defaults when unknown).
    pub fn policy(&self, r: Resource) -> ResourcePolicy {
        self.resources.get(&r).map(|s| s.policy).unwrap_or_default()
    }

    /// Replicas of a resource (1 when unknown).
    pub fn replicas(&self, r: Resource) -> u32 {
        self.resources.get(&r).map(|s| s.replicas).unwrap_or(1)
    }

    fn set_origin(&mut self, key: &str, origin: &str) {
        self.origins.insert(key.to_string(), origin.to_string());
    }
}

/// Command-line flags that override the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// `--resources`.
    pub resources: Option<Vec<Resource>>,
    /// `--replicas` (both resources).
    pub replicas: Option<u32>,
    /// `--include-integrated`.
    pub include_integrated: bool,
    /// `--include-detachable`.
    pub include_detachable: bool,
    /// `--assignment`.
    pub assignment: Option<Assignment>,
    /// `--log-level`.
    pub log_level: Option<String>,
    /// `--log-format`.
    pub log_format: Option<LogFormat>,
}

/// Why the configuration cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A file is invalid.
    #[error(transparent)]
    File(#[from] file::FileError),
    /// A file cannot be read.
    #[error("cannot read configuration file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        reason: String,
    },
    /// An environment variable is invalid.
    #[error("environment variable {name}={}: {reason}", dxdp_core::quote::quote(.value))]
    Env {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
}

/// The environment variables dxdp reads, as a plain map (so tests need not touch the process).
pub type Env = BTreeMap<String, String>;

/// The default configuration file path on this OS.
pub fn default_path() -> PathBuf {
    if cfg!(windows) {
        PathBuf::from(r"C:\etc\directx-device-plugins\config.yaml")
    } else {
        PathBuf::from("/etc/directx-device-plugins/config.yaml")
    }
}

/// Which configuration file to read: `--config`, else `DXDP_CONFIG` (both must exist), else the
/// default path, read when it exists and watched so that it is loaded when it appears later.
/// The flag says whether the file must exist.
pub fn choose_path(flag: Option<&Path>, env: &Env) -> Option<(PathBuf, bool)> {
    if let Some(p) = flag {
        return Some((p.to_path_buf(), true));
    }
    if let Some(p) = env.get("DXDP_CONFIG").filter(|p| !p.is_empty()) {
        return Some((PathBuf::from(p), true));
    }
    Some((default_path(), false))
}

fn read(path: &Path) -> Result<String, ConfigError> {
    crate::backend::stable_read::read_settled(path, Default::default()).map_err(|e| {
        ConfigError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        }
    })
}

/// Everything the configuration is built from.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// dxdp's configuration file and whether it must exist.
    pub file: Option<(PathBuf, bool)>,
    /// The environment.
    pub env: Env,
    /// The flags.
    pub flags: Flags,
}

impl Inputs {
    /// The files whose changes trigger a reload.
    pub fn watched_files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.file.iter().map(|(p, _)| p.clone()).collect();
        for prefix in ["WDDM", "MCDM"] {
            if let Some(p) = self
                .env
                .get(&format!("{prefix}_DEVICE_PLUGIN_CONFIG_FILE"))
                .filter(|p| !p.is_empty())
            {
                files.push(PathBuf::from(p));
            }
        }
        files
    }

    /// Builds the effective configuration: defaults < reference files < file < env < flags.
    pub fn resolve(&self) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        for (prefix, r) in [("WDDM", Resource::Display), ("MCDM", Resource::Compute)] {
            let name = format!("{prefix}_DEVICE_PLUGIN_CONFIG_FILE");
            if let Some(p) = self.env.get(&name).filter(|p| !p.is_empty()) {
                let path = PathBuf::from(p);
                let text = read(&path)?;
                let f: ReferenceFile = file::parse(&text, &path.display().to_string())?;
                apply_reference(&mut c, r, &f, &format!("file {} ({name})", path.display()));
            }
        }
        if let Some((path, required)) = &self.file {
            match read(path) {
                Ok(text) => {
                    let f: ConfigFile = file::parse(&text, &path.display().to_string())?;
                    apply_file(&mut c, &f, &format!("file {}", path.display()));
                }
                Err(e) if *required => return Err(e),
                Err(_) => {}
            }
        }
        apply_env(&mut c, &self.env)?;
        apply_flags(&mut c, &self.flags);
        Ok(c)
    }
}

#[cfg(test)]
mod tests;
