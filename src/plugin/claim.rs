//! One daemon per kubelet directory: an exclusive lock held for the daemon's life, the
//! socket file names dxdp uses, and the removal of sockets a crashed run left behind.
//!
//! The lock is a file outside the kubelet directory (so that a kubelet restart, which may delete
//! and recreate that directory, cannot release it), named after the directory: on Windows in
//! `%ProgramData%\dxdp\locks`, elsewhere in the temporary directory's `dxdp-locks`. The OS
//! releases it when the process ends, however it ends, so a crash never leaves it taken. Two
//! daemons started at the same instant, during a kubelet restart or before the kubelet exists
//! race only for the lock, and exactly one wins.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dxdp_core::devices::Resource;

use super::PluginError;
use crate::transport::Transport;

/// The held lock of one kubelet directory; released when dropped (or the process ends).
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Where lock files live.
pub fn lock_dir() -> PathBuf {
    #[cfg(windows)]
    {
        let base = std::env::var_os("ProgramData")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| PathBuf::from(r"C:\ProgramData"));
        base.join("dxdp").join("locks")
    }
    #[cfg(not(windows))]
    {
        std::env::temp_dir().join("dxdp-locks")
    }
}

/// The lock file of `kubelet_dir` in `locks`: the directory's absolute path hashed (FNV-1a,
/// case-folded on Windows, where paths are case-insensitive).
pub fn lock_file(locks: &Path, kubelet_dir: &Path) -> PathBuf {
    let absolute = std::path::absolute(kubelet_dir).unwrap_or_else(|_| kubelet_dir.to_path_buf());
    let text = absolute.to_string_lossy();
    let text = text.trim_end_matches(['/', '\\']);
    #[cfg(windows)]
    let text = text.to_lowercase();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    locks.join(format!("kubelet-dir-{hash:016x}.lock"))
}

/// Takes the lock of `kubelet_dir` (lock files in `locks`), or says who holds it.
pub fn lock(locks: &Path, kubelet_dir: &Path) -> Result<DirLock, PluginError> {
    let path = lock_file(locks, kubelet_dir);
    let io = |e: std::io::Error| PluginError::Lock {
        lock: path.clone(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(locks).map_err(io)?;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            return Err(PluginError::Locked {
                dir: kubelet_dir.to_path_buf(),
                lock: path,
                holder: holder.lines().next().unwrap_or("").trim().to_string(),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    // Who holds it, for the message of the one that loses (best effort).
    let _ = file.set_len(0);
    let _ = writeln!(
        file,
        "pid {} serving {}",
        std::process::id(),
        kubelet_dir.display()
    );
    Ok(DirLock { _file: file, path })
}

/// `dxdp-<resource name with / as ->-<nanoseconds>.sock`.
pub fn socket_file_name(resource_name: &str, nanos: u128) -> String {
    format!("dxdp-{}-{nanos}.sock", socket_safe(resource_name))
}

/// A resource name as it appears in socket file names.
fn socket_safe(resource_name: &str) -> String {
    resource_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// A fresh socket file name for a resource name.
pub fn socket_name(resource_name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    socket_file_name(resource_name, nanos)
}

/// The resource part of a socket file name dxdp made (`None` for any other file).
pub fn socket_resource(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix("dxdp-")?.strip_suffix(".sock")?;
    let (resource, nanos) = rest.rsplit_once('-')?;
    (!nanos.is_empty() && nanos.bytes().all(|b| b.is_ascii_digit())).then_some(resource)
}

/// Removes `dxdp-*.sock` files that no process answers on (left by a crashed run), and refuses
/// to start when a live dxdp (one older than the directory lock) already serves one of
/// `endpoints` in `dir`.
pub async fn remove_stale_sockets(
    transport: Transport,
    dir: &Path,
    endpoints: &[(Resource, String)],
) -> Result<(), PluginError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::debug!(dir = %dir.display(), "cannot list the kubelet directory: {e}");
            return Ok(());
        }
    };
    let ours: BTreeMap<String, &str> = endpoints
        .iter()
        .map(|(_, n)| (socket_safe(n), n.as_str()))
        .collect();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(resource) = socket_resource(&file_name.to_string_lossy()).map(str::to_string)
        else {
            continue;
        };
        let path = entry.path();
        let live = tokio::time::timeout(Duration::from_secs(2), transport.probe(&path))
            .await
            .is_ok_and(|r| r.is_ok());
        if live {
            if let Some(name) = ours.get(&resource) {
                return Err(PluginError::AlreadyServed {
                    resource: name.to_string(),
                    socket: path,
                });
            }
            tracing::debug!(socket = %path.display(), "another live dxdp serves this socket; leaving it");
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(socket = %path.display(), "removed a stale socket left by an earlier run")
            }
            Err(e) => tracing::warn!(socket = %path.display(), "cannot remove a stale socket: {e}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lock_per_directory_whatever_the_spelling() {
        let locks = tempfile::tempdir().unwrap();
        let kubelet = tempfile::tempdir().unwrap();
        let first = lock(locks.path(), kubelet.path()).expect("the first takes it");
        let with_slash = PathBuf::from(format!("{}/", kubelet.path().display()));
        match lock(locks.path(), &with_slash) {
            Err(PluginError::Locked { dir, lock, holder }) => {
                assert_eq!(dir, with_slash);
                assert_eq!(lock, first.path());
                assert_eq!(
                    holder,
                    format!(
                        "pid {} serving {}",
                        std::process::id(),
                        kubelet.path().display()
                    )
                );
            }
            other => panic!("a second lock of the same directory must fail: {other:?}"),
        }
        // Another directory has its own lock.
        let other = tempfile::tempdir().unwrap();
        let _second = lock(locks.path(), other.path()).expect("another directory");
        drop(first);
        let _again = lock(locks.path(), kubelet.path()).expect("released when dropped");
    }

    #[test]
    fn the_message_names_the_directory_the_lock_and_what_to_do() {
        let e = PluginError::Locked {
            dir: PathBuf::from("/var/lib/kubelet/device-plugins"),
            lock: PathBuf::from("/tmp/dxdp-locks/kubelet-dir-0123456789abcdef.lock"),
            holder: "pid 42 serving /var/lib/kubelet/device-plugins".into(),
        };
        assert_eq!(
            e.to_string(),
            "another dxdp already serves /var/lib/kubelet/device-plugins (pid 42 serving /var/lib/kubelet/device-plugins; it holds /tmp/dxdp-locks/kubelet-dir-0123456789abcdef.lock): stop it first, or use a different --kubelet-dir"
        );
    }

    #[test]
    fn socket_names_round_trip() {
        assert_eq!(
            socket_file_name("directx.microsoft.com/display", 17),
            "dxdp-directx.microsoft.com-display-17.sock"
        );
        assert_eq!(
            socket_resource("dxdp-directx.microsoft.com-display-17.sock"),
            Some("directx.microsoft.com-display")
        );
        assert_eq!(socket_resource("dxdp-x-.sock"), None);
        assert_eq!(socket_resource("kubelet.sock"), None);
    }
}
