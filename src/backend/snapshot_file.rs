//! A host snapshot file as a source of host facts.

use std::path::PathBuf;

use super::{HostFactsSource, SourceError};
use crate::facts::HostFacts;
use crate::snapshot;

/// Reads host facts from a snapshot file every time they are loaded.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    path: PathBuf,
}

impl SnapshotFile {
    /// A source reading `path`.
    pub fn new(path: PathBuf) -> Self {
        SnapshotFile { path }
    }
}

impl HostFactsSource for SnapshotFile {
    fn describe(&self) -> String {
        format!("host snapshot {}", self.path.display())
    }

    fn is_simulated(&self) -> bool {
        true
    }

    fn load(&self) -> Result<HostFacts, SourceError> {
        Ok(snapshot::read_file(&self.path)?)
    }

    fn watch_path(&self) -> Option<PathBuf> {
        Some(self.path.clone())
    }
}
