//! A host snapshot file as a source of host facts.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{HostFactsSource, SourceError};
use crate::util::stable_read::{read_once, read_settled, Settle, Stamp};
use dxdp_core::facts::HostFacts;
use dxdp_core::snapshot::{self, SnapshotError};

/// The largest host snapshot read (docs/host-snapshot.md): 64 MiB, far above a real host's
/// (tens of kilobytes) or the largest fixture; reading stops past it.
pub(crate) const MAX_SNAPSHOT_BYTES: u64 = 64 << 20;

/// What identifies a version of the file ([`Stamp`]), or its absence.
fn stamp(path: &Path) -> Option<Stamp> {
    Stamp::of(path).ok()
}

/// Reads host facts from a snapshot file every time they are loaded; a change of the file's
/// `Stamp` (size, modification time and, on Unix, identity and change time: an atomic replace
/// included) counts as a change of the facts.
/// The file is read once it has settled (see `read_settled`), so a file being rewritten in
/// place is not taken half-written; only a regular file is read (a FIFO, socket or device is an
/// error naming what it is, never a read that blocks), and at most `MAX_SNAPSHOT_BYTES`.
#[derive(Debug)]
pub struct SnapshotFile {
    path: PathBuf,
    seen: Mutex<Option<Option<Stamp>>>,
    settle: Settle,
}

impl SnapshotFile {
    /// A source reading `path`.
    pub fn new(path: PathBuf) -> Self {
        SnapshotFile {
            path,
            seen: Mutex::new(None),
            settle: Settle::DEFAULT,
        }
    }

    fn remember(&self, now: Option<Stamp>) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let changed = seen.as_ref() != Some(&now);
        *seen = Some(now);
        changed
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
        self.remember(stamp(&self.path));
        let text = read_settled(&self.path, self.settle, MAX_SNAPSHOT_BYTES).map_err(|e| {
            SnapshotError::Read {
                path: self.path.clone(),
                error: e.into(),
            }
        })?;
        Ok(snapshot::parse(&text, &self.path.display().to_string())?)
    }

    fn load_complete(&self) -> Result<HostFacts, SourceError> {
        // The daemon saw the file renamed into place or closed after writing: read it once.
        self.remember(stamp(&self.path));
        let text = read_once(&self.path, MAX_SNAPSHOT_BYTES).map_err(|e| SnapshotError::Read {
            path: self.path.clone(),
            error: e.into(),
        })?;
        Ok(snapshot::parse(&text, &self.path.display().to_string())?)
    }

    fn watched_files(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }

    fn changed(&self) -> bool {
        self.remember(stamp(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.yaml");
        std::fs::write(&path, "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\n").unwrap();
        let source = SnapshotFile::new(path.clone());
        source.load().unwrap();
        assert!(!source.changed(), "nothing changed since load");
        std::fs::write(
            &path,
            "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\nfiles: []\n",
        )
        .unwrap();
        assert!(source.changed());
        assert!(!source.changed(), "reported once");
        std::fs::remove_file(&path).unwrap();
        assert!(source.changed(), "removal is a change");
        assert!(source.load().is_err());
    }
}
