//! The configuration a node last served, kept on the host: read at start only when the
//! configuration file is rejected, so that a bad edit that running daemons refuse does not stop
//! the node's GPUs at the next restart either (docs/configuration.md#the-last-served-configuration).
//!
//! The daemon keeps the text of the configuration file it serves (written beside the kept file,
//! then renamed over it), after a header saying what the file is; an empty text (no file read)
//! keeps the header alone, an empty configuration.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{ConfigError, Inputs, Resolved};

/// Where the last-served configuration is kept, and what was last written there. Clones share
/// what was written.
#[derive(Debug, Clone)]
pub struct KeptConfig {
    path: PathBuf,
    /// The text last written there (or found there), to write only what changed.
    written: Arc<Mutex<Option<String>>>,
}

/// The configuration to start with.
#[derive(Debug)]
pub struct Start {
    /// The configuration of the inputs, or the last-served one kept on the host.
    pub resolved: Resolved,
    /// Why the configuration of the inputs was rejected, when the kept one is served instead.
    pub rejected: Option<String>,
}

impl KeptConfig {
    /// The last-served configuration kept at `path`.
    pub fn at(path: PathBuf) -> Self {
        KeptConfig {
            path,
            written: Arc::default(),
        }
    }

    /// Where it is kept.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The text of the kept file for the configuration file `source` read as `text`.
    fn contents(source: Option<&Path>, text: &str) -> String {
        let from = source
            .map(|p| format!("from {}", p.display()))
            .unwrap_or_else(|| "no configuration file was read".to_string());
        let mut out = format!(
            "# Written by dxdp: the configuration this node last served ({from}).\n\
             # dxdp reads it only at start, when the configuration file is rejected, and replaces it\n\
             # whenever it serves a configuration. Edit the configuration file, not this one.\n"
        );
        out.push_str(text);
        out
    }

    /// Keeps `resolved` (a configuration read from `inputs` and served) unless the same text is
    /// kept already: written beside the kept file, then renamed over it. Returns whether it
    /// wrote.
    pub(crate) fn keep(&self, inputs: &Inputs, resolved: &Resolved) -> std::io::Result<bool> {
        let source = inputs.file.as_ref().map(|(p, _)| p.as_path());
        let text = Self::contents(source, resolved.source_text.as_deref().unwrap_or_default());
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        if written.is_none() {
            *written = std::fs::read_to_string(&self.path).ok();
        }
        if written.as_deref() == Some(text.as_str()) {
            return Ok(false);
        }
        if let Some(dir) = self.path.parent() {
            crate::util::host_acl::create_protected_dir(
                dir,
                crate::util::host_acl::Readers::AdministratorsOnly,
            )?;
        }
        // One name: one daemon per node writes here (it holds the node's lock), and a copy a
        // crash left is written over, never piled up.
        let mut temp = self.path.as_os_str().to_os_string();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&temp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            drop(f);
            std::fs::rename(&temp, &self.path)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
        *written = Some(text);
        Ok(true)
    }

    /// `inputs` reading the kept file instead of the configuration file, or `None` when nothing
    /// is kept. A kept file that exists is required: one that cannot be read is an error then.
    pub(crate) fn inputs(&self, inputs: &Inputs) -> Option<Inputs> {
        match std::fs::symlink_metadata(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            _ => Some(Inputs {
                file: Some((self.path.clone(), true)),
                ..inputs.clone()
            }),
        }
    }

    /// The configuration of `inputs`, or, when its configuration file is rejected (it does not
    /// parse, or cannot be read), the last-served configuration kept here, with the same
    /// environment and flags. An error when the configuration is rejected for another reason
    /// (an environment variable), when nothing is kept, or when the kept configuration is
    /// rejected too (both reasons said).
    pub fn resolve_or_kept(&self, inputs: &Inputs) -> Result<Start, String> {
        let rejected = match inputs.resolve() {
            Ok(resolved) => {
                return Ok(Start {
                    resolved,
                    rejected: None,
                })
            }
            Err(e @ (ConfigError::File(_) | ConfigError::Read { .. })) => e.to_string(),
            Err(e) => return Err(e.to_string()),
        };
        let Some(kept) = self.inputs(inputs) else {
            return Err(rejected);
        };
        match kept.resolve() {
            Ok(resolved) => Ok(Start {
                resolved,
                rejected: Some(rejected),
            }),
            Err(e) => Err(format!(
                "{rejected}; the last-served configuration kept at {} cannot be served instead: {e}",
                self.path.display()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(file: &Path) -> Inputs {
        Inputs {
            file: Some((file.to_path_buf(), true)),
            ..Inputs::default()
        }
    }

    #[test]
    fn a_served_configuration_is_kept_once_with_its_header_and_replaced_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        let kept = KeptConfig::at(dir.path().join("state").join("kept.yaml"));
        std::fs::write(&file, "resources: {display: {replicas: 2}}\n").unwrap();
        let i = inputs(&file);
        let r = i.resolve().unwrap();
        assert!(kept.keep(&i, &r).unwrap(), "written the first time");
        assert!(
            !kept.keep(&i, &r).unwrap(),
            "the same text is not written again"
        );
        assert_eq!(
            std::fs::read_to_string(kept.path()).unwrap(),
            format!(
                "# Written by dxdp: the configuration this node last served (from {}).\n\
                 # dxdp reads it only at start, when the configuration file is rejected, and replaces it\n\
                 # whenever it serves a configuration. Edit the configuration file, not this one.\n\
                 resources: {{display: {{replicas: 2}}}}\n",
                file.display()
            )
        );
        // Another daemon's copy of the same kept file (a restart) finds it there.
        assert!(!KeptConfig::at(kept.path().to_path_buf())
            .keep(&i, &r)
            .unwrap());
        std::fs::write(&file, "resources: {display: {replicas: 3}}\n").unwrap();
        let r = i.resolve().unwrap();
        assert!(kept.keep(&i, &r).unwrap());
        assert!(std::fs::read_to_string(kept.path())
            .unwrap()
            .ends_with("\nresources: {display: {replicas: 3}}\n"));
        let names: Vec<_> = std::fs::read_dir(kept.path().parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["kept.yaml"], "no temporary file left");
    }

    #[test]
    fn a_rejected_file_falls_back_to_the_kept_configuration_else_it_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        let kept = KeptConfig::at(dir.path().join("kept.yaml"));
        let i = inputs(&file);
        std::fs::write(&file, "resources: {display: {replicas: 0}}\n").unwrap();
        let rejected = format!(
            "{}:1:33: replicas must be from 1 to 64, got 0",
            file.display()
        );
        // Nothing kept: refused as before.
        assert_eq!(
            kept.resolve_or_kept(&i).unwrap_err(),
            i.resolve().unwrap_err().to_string()
        );
        // A good file is served, and kept.
        std::fs::write(&file, "resources: {display: {replicas: 3}}\n").unwrap();
        let start = kept.resolve_or_kept(&i).unwrap();
        assert_eq!(start.rejected, None);
        kept.keep(&i, &start.resolved).unwrap();
        // Rejected: the kept one, with the reason.
        std::fs::write(&file, "resources: {display: {replicas: 0}}\n").unwrap();
        let start = kept.resolve_or_kept(&i).unwrap();
        assert_eq!(start.rejected.as_deref(), Some(rejected.as_str()));
        assert_eq!(
            start
                .resolved
                .replicas(dxdp_core::devices::Resource::Display),
            3
        );
        // A variable that is rejected is not the file's fault: no fallback.
        let mut bad_env = i.clone();
        bad_env.env = [("DXDP_REPLICAS".to_string(), "x".to_string())].into();
        std::fs::write(&file, "{}\n").unwrap();
        let err = kept.resolve_or_kept(&bad_env).unwrap_err();
        assert!(
            err.starts_with("environment variable DXDP_REPLICAS=\"x\""),
            "{err}"
        );
        // A kept file that cannot be served either: refused, both reasons said.
        std::fs::write(&file, "resources: {display: {replicas: 0}}\n").unwrap();
        std::fs::write(kept.path(), "resources: [\n").unwrap();
        let err = kept.resolve_or_kept(&i).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "{rejected}; the last-served configuration kept at {} cannot be served instead: {}:",
                kept.path().display(),
                kept.path().display()
            )),
            "{err}"
        );
    }

    #[test]
    fn no_configuration_file_is_kept_as_the_header_alone_an_empty_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let kept = KeptConfig::at(dir.path().join("kept.yaml"));
        let none = Inputs::default();
        let r = none.resolve().unwrap();
        kept.keep(&none, &r).unwrap();
        let text = std::fs::read_to_string(kept.path()).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text.contains("(no configuration file was read)"), "{text}");
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "resources: [\n").unwrap();
        let start = kept.resolve_or_kept(&inputs(&file)).unwrap();
        assert_eq!(start.resolved.config, crate::config::Config::default());
    }
}
