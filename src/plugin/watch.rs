//! File-system events as async notifications: the daemon's eyes on the kubelet directory, the
//! configuration files and the host snapshot (inotify on Linux, ReadDirectoryChangesW on
//! Windows, through `notify`).
//!
//! Directories are watched, never single files, so that atomic replaces, ConfigMap `..data`
//! symlink swaps and files that appear only after start are all seen. A watch that cannot be
//! set up is reported once; the daemon's slow safety poll then covers that directory.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// What happened to one entry of a watched directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEvent {
    /// The directory.
    pub dir: PathBuf,
    /// The entry's file name.
    pub name: OsString,
    /// Created, removed or otherwise changed.
    pub change: Change,
}

/// The kind of change, as far as the daemon cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Created empty (a writer may still be filling it).
    Created,
    /// Renamed into place: complete by construction (an atomic replace).
    Replaced,
    /// Closed after writing (Linux): whoever wrote it is done.
    Closed,
    /// Removed (or renamed away).
    Removed,
    /// Written, or anything else (a writer may still be at work).
    Other,
}

impl Change {
    /// Whether the entry is known to be complete after this change.
    pub fn completes(self) -> bool {
        matches!(self, Change::Replaced | Change::Closed)
    }
}

/// Watches directories (not recursively) until dropped.
pub struct DirWatch {
    watcher: Option<RecommendedWatcher>,
    watched: BTreeSet<PathBuf>,
    events: mpsc::UnboundedReceiver<DirEvent>,
}

impl DirWatch {
    /// A watch on no directory yet.
    pub fn new() -> Self {
        let (tx, events) = mpsc::unbounded_channel();
        let watcher = notify::recommended_watcher(move |result: notify::Result<notify::Event>| {
            let event = match result {
                Ok(event) => event,
                Err(e) => {
                    tracing::debug!("file-system watch error: {e}");
                    return;
                }
            };
            use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
            let changes: &[Change] = match event.kind {
                EventKind::Create(_) => &[Change::Created],
                EventKind::Remove(_) => &[Change::Removed],
                EventKind::Modify(ModifyKind::Name(RenameMode::From)) => &[Change::Removed],
                EventKind::Modify(ModifyKind::Name(RenameMode::To)) => &[Change::Replaced],
                // Both names of one rename: the old one goes, the new one is complete.
                EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => {
                    &[Change::Removed, Change::Replaced]
                }
                EventKind::Access(AccessKind::Close(AccessMode::Write)) => &[Change::Closed],
                EventKind::Access(_) => return,
                _ => &[Change::Other],
            };
            for (i, path) in event.paths.into_iter().enumerate() {
                let change = changes
                    .get(i)
                    .or(changes.last())
                    .copied()
                    .unwrap_or(Change::Other);
                let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
                    continue;
                };
                let _ = tx.send(DirEvent {
                    dir: dir.to_path_buf(),
                    name: name.to_os_string(),
                    change,
                });
            }
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(
                    "cannot watch files for changes ({e}); relying on the safety poll instead"
                );
                None
            }
        };
        DirWatch {
            watcher,
            watched: BTreeSet::new(),
            events,
        }
    }

    /// Watches `dir` (its entries, not its subdirectories). Returns false, having said why at
    /// debug level, when it cannot be watched (for example, it does not exist yet).
    pub fn add(&mut self, dir: &Path) -> bool {
        if self.watched.contains(dir) {
            return true;
        }
        let Some(watcher) = self.watcher.as_mut() else {
            return false;
        };
        match watcher.watch(dir, RecursiveMode::NonRecursive) {
            Ok(()) => {
                self.watched.insert(dir.to_path_buf());
                true
            }
            Err(e) => {
                tracing::debug!(dir = %dir.display(), "cannot watch directory: {e}");
                false
            }
        }
    }

    /// Stops watching `dir`.
    pub fn remove(&mut self, dir: &Path) {
        if self.watched.remove(dir) {
            if let Some(w) = self.watcher.as_mut() {
                let _ = w.unwatch(dir);
            }
        }
    }

    /// Whether `dir` is watched.
    pub fn is_watching(&self, dir: &Path) -> bool {
        self.watched.contains(dir)
    }

    /// The next event; pending forever when nothing is watched.
    pub async fn next(&mut self) -> DirEvent {
        match self.events.recv().await {
            Some(e) => e,
            // The sender lives in the watcher; without one, nothing will ever arrive.
            None => std::future::pending().await,
        }
    }

    /// Every event already queued, without waiting (to handle a burst as one change).
    pub fn drain(&mut self) -> Vec<DirEvent> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push(e);
        }
        out
    }
}

impl Default for DirWatch {
    fn default() -> Self {
        DirWatch::new()
    }
}

/// The directory to watch for a file: its parent (`.` for a bare name).
pub fn parent_dir(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn next_matching(w: &mut DirWatch, name: &str, change: Change) -> DirEvent {
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let e = w.next().await;
                if e.name == name && e.change == change {
                    return e;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {change:?} event for {name}"))
    }

    #[tokio::test]
    async fn creation_removal_and_rename_into_place_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = DirWatch::new();
        assert!(w.add(dir.path()));
        std::fs::write(dir.path().join("a.sock"), b"").unwrap();
        let e = next_matching(&mut w, "a.sock", Change::Created).await;
        assert_eq!(e.dir, dir.path());
        std::fs::remove_file(dir.path().join("a.sock")).unwrap();
        next_matching(&mut w, "a.sock", Change::Removed).await;
        std::fs::write(dir.path().join("host.yaml.tmp"), b"x").unwrap();
        std::fs::rename(
            dir.path().join("host.yaml.tmp"),
            dir.path().join("host.yaml"),
        )
        .unwrap();
        next_matching(&mut w, "host.yaml", Change::Replaced).await;
        // Written in place: modified, then closed.
        std::fs::write(dir.path().join("host.yaml"), b"y").unwrap();
        next_matching(&mut w, "host.yaml", Change::Closed).await;
    }

    #[tokio::test]
    async fn a_missing_directory_cannot_be_watched_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = DirWatch::new();
        assert!(!w.add(&dir.path().join("not-yet")));
        assert!(!w.is_watching(&dir.path().join("not-yet")));
    }

    #[test]
    fn parent_of_a_bare_name_is_the_current_directory() {
        assert_eq!(parent_dir(Path::new("config.yaml")), PathBuf::from("."));
        assert_eq!(
            parent_dir(Path::new("/etc/x/config.yaml")),
            PathBuf::from("/etc/x")
        );
    }
}
