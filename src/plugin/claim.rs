//! One daemon per kubelet directory: an exclusive lock held for the daemon's life, the
//! socket file names dxdp uses, and the removal of sockets a crashed run left behind.
//!
//! The lock is keyed by what the directory *is*, not by how it is spelled, so that a symlink,
//! `x/../K`, a bind mount or another case on Windows all take the same lock. It is two lock
//! files, both taken, in one directory every instance on the host sees (`lock_dir`; never
//! under the per-process `TMPDIR`):
//!
//! - `path-<hash>.lock`: the directory's canonical path (symlinks and `..` resolved; case-folded
//!   on Windows). It also holds while the kubelet deletes and recreates the directory;
//! - `id-<volume>-<file>.lock`: the directory's identity (`crate::util::file_id`: device and
//!   inode on Unix, volume serial number and file ID on Windows), which a bind mount (or any
//!   other path to the same directory) shares.
//!
//! A kubelet directory that does not exist yet (the daemon may start before the kubelet) is
//! keyed by its nearest existing ancestor: that ancestor's canonical path and identity, plus the
//! rest of the path as written (its `..` applied to the path). It is not created: the kubelet
//! does that. A daemon started after it exists keys by the directory itself; the path lock is
//! still the same one.
//!
//! The lock files are outside the kubelet directory (so that a kubelet restart, which may delete
//! and recreate that directory, cannot release them) and are never deleted. The OS releases the
//! locks when the process ends, however it ends, so a crash never leaves them taken. Who holds
//! them is written to a separate `.holder` file beside each, which nobody locks: on Windows a
//! lock is mandatory and no other process can read a locked file, so the loser reads only the
//! holder file and never the lock file itself. Two daemons started at the same instant, during
//! a kubelet restart or before the kubelet exists race only for the locks, and exactly one wins.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dxdp_core::devices::Resource;

use super::PluginError;
use crate::transport::Transport;
use crate::util::file_id::{file_id, FileId};

/// The held locks of one kubelet directory; released when dropped (or the process ends).
#[derive(Debug)]
pub(crate) struct DirLock {
    _files: Vec<File>,
    /// The lock files, for the tests.
    #[cfg_attr(not(test), allow(dead_code))]
    paths: Vec<PathBuf>,
}

impl DirLock {
    /// The lock files: the path lock, then the identity lock.
    #[cfg(test)]
    fn paths(&self) -> &[PathBuf] {
        &self.paths
    }
}

/// Where lock files live on Unix when the system location is usable: `/run` is one per host
/// (per mount namespace), cleared at boot, and not made private per service as `/tmp` can be.
#[cfg(unix)]
pub(crate) const SYSTEM_LOCK_DIR: &str = "/run/dxdp/locks";
/// Where lock files live on Unix when [`SYSTEM_LOCK_DIR`] cannot be written (dxdp not run as
/// root): a fixed path, shared by every process of the host that sees the same `/tmp`, whatever
/// its `TMPDIR`.
#[cfg(unix)]
pub(crate) const FALLBACK_LOCK_DIR: &str = "/tmp/dxdp-locks";

/// Where lock files live: on Windows `%ProgramData%\dxdp\locks`; on Unix [`SYSTEM_LOCK_DIR`]
/// where it can be created and written, else [`FALLBACK_LOCK_DIR`]. Never under `TMPDIR`, which
/// differs per process. (Tests pass another directory to [`lock`].)
pub(crate) fn lock_dir() -> PathBuf {
    #[cfg(windows)]
    {
        let base = std::env::var_os("ProgramData")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| PathBuf::from(r"C:\ProgramData"));
        base.join("dxdp").join("locks")
    }
    #[cfg(unix)]
    {
        let system = Path::new(SYSTEM_LOCK_DIR);
        let writable = std::fs::create_dir_all(system).is_ok()
            && std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(system.join("writable"))
                .is_ok();
        if writable {
            system.to_path_buf()
        } else {
            PathBuf::from(FALLBACK_LOCK_DIR)
        }
    }
    #[cfg(not(any(unix, windows)))]
    {
        std::env::temp_dir().join("dxdp-locks")
    }
}

/// What the lock of a kubelet directory is keyed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirKey {
    /// The canonical path of the directory (of its nearest existing ancestor, joined with the
    /// rest when it does not exist).
    pub(crate) canonical: PathBuf,
    /// The identity of the directory, or of its nearest existing ancestor.
    pub(crate) identity: FileId,
    /// The part of the path that does not exist yet (empty when the directory exists).
    pub(crate) missing: PathBuf,
}

/// Where the daemon keeps what must outlive it on the host (the last-served configuration):
/// `%ProgramData%\dxdp` on Windows, beside the locks. Nowhere elsewhere: there `dxdp plugin`
/// serves host snapshots (tests, demos), and its runs must not leave files on the machine.
fn state_dir() -> Option<PathBuf> {
    #[cfg(windows)]
    {
        lock_dir().parent().map(Path::to_path_buf)
    }
    #[cfg(not(windows))]
    {
        None
    }
}

/// Where the last configuration the daemon of `kubelet_dir` served is kept on the host
/// (`crate::config::kept`): `last-served-config-<hash>.yaml` in the state directory, named
/// after the kubelet directory's canonical path like its lock (one per node: one per kubelet
/// directory). `None` off Windows: nothing is kept there.
pub fn kept_config_path(kubelet_dir: &Path) -> Option<PathBuf> {
    let dir = state_dir()?;
    let key = dir_key(kubelet_dir)
        .map(|k| k.canonical)
        .unwrap_or_else(|_| kubelet_dir.to_path_buf());
    Some(dir.join(format!("last-served-config-{:016x}.yaml", path_hash(&key))))
}

/// The nearest existing ancestor of `path` (or `path` itself) and the rest.
fn split_existing(path: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
    for a in path.ancestors() {
        if std::fs::metadata(a).is_ok() {
            let rest = path.strip_prefix(a).unwrap_or(Path::new(""));
            return Ok((std::fs::canonicalize(a)?, rest.to_path_buf()));
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        "no part of the path exists",
    ))
}

/// The key of `kubelet_dir` (see the module): its canonical path and identity, or those of its
/// nearest existing ancestor and the rest.
pub(crate) fn dir_key(kubelet_dir: &Path) -> std::io::Result<DirKey> {
    let mut path = std::path::absolute(kubelet_dir)?;
    // The rest of a missing path is applied lexically (nothing there can be a link yet); after
    // `..` climbs back into existing directories, resolve again (twice is a fixpoint: the second
    // rest has no `..`).
    for _ in 0..3 {
        let (base, rest) = split_existing(&path)?;
        let mut joined = base.clone();
        let mut climbed = false;
        for c in rest.components() {
            match c {
                Component::ParentDir => {
                    joined.pop();
                    climbed = true;
                }
                Component::Normal(n) => joined.push(n),
                _ => {}
            }
        }
        if !climbed {
            let identity = file_id(&base)?;
            let missing = joined
                .strip_prefix(&base)
                .unwrap_or(Path::new(""))
                .to_path_buf();
            return Ok(DirKey {
                canonical: joined,
                identity,
                missing,
            });
        }
        path = joined;
    }
    Err(std::io::Error::other("the path does not settle"))
}

/// FNV-1a of a path's text (case-folded on Windows, where paths are case-insensitive).
fn path_hash(path: &Path) -> u64 {
    let text = path.to_string_lossy();
    let text = text.trim_end_matches(['/', '\\']);
    #[cfg(windows)]
    let text = text.to_lowercase();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The two lock files of a key in `locks`: the path lock and the identity lock.
pub(crate) fn lock_files(locks: &Path, key: &DirKey) -> [PathBuf; 2] {
    let path = locks.join(format!("path-{:016x}.lock", path_hash(&key.canonical)));
    let id = if key.missing.as_os_str().is_empty() {
        format!("id-{}.lock", key.identity)
    } else {
        format!("id-{}-{:016x}.lock", key.identity, path_hash(&key.missing))
    };
    [path, locks.join(id)]
}

/// The file beside a lock file that says who holds it (never locked, so always readable).
pub(crate) fn holder_file(lock: &Path) -> PathBuf {
    let mut name = lock.as_os_str().to_os_string();
    name.push(".holder");
    PathBuf::from(name)
}

/// Opens a lock file for locking: read and write, created if missing; read only where another
/// user created it in the shared fallback directory (a lock needs no write access).
fn open_lock(path: &Path) -> std::io::Result<File> {
    let rw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path);
    match rw {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => File::open(path),
        other => other,
    }
}

/// Why the kubelet directory's lock cannot be taken (one daemon per directory).
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another dxdp holds it.
    #[error("another dxdp already serves {} ({holder}; it holds {}): stop it first, or use a different --kubelet-dir", dir.display(), lock.display())]
    Held {
        /// The kubelet directory.
        dir: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// What the lock file says of its holder.
        holder: String,
    },
    /// The kubelet directory (or its nearest existing ancestor) cannot be resolved, so its lock
    /// is unknown.
    #[error("cannot resolve the kubelet directory {}: {reason} (dxdp locks it by what it is, whatever it is called; check that it, or the part of it that exists, can be read)", dir.display())]
    KubeletDir {
        /// The kubelet directory as given.
        dir: PathBuf,
        /// Why.
        reason: String,
    },
    /// The lock file cannot be used.
    #[error("cannot lock {}: {reason} (dxdp keeps one lock file per kubelet directory there; check that it is writable)", lock.display())]
    Unusable {
        /// The lock file.
        lock: PathBuf,
        /// The OS error.
        reason: String,
    },
}

/// Takes the locks of `kubelet_dir` (lock files in `locks`), or says who holds them.
pub(crate) fn lock(locks: &Path, kubelet_dir: &Path) -> Result<DirLock, LockError> {
    let fail = |lock: PathBuf, e: std::io::Error| LockError::Unusable {
        lock,
        reason: e.to_string(),
    };
    let key = dir_key(kubelet_dir).map_err(|e| LockError::KubeletDir {
        dir: kubelet_dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    create_lock_dir(locks).map_err(|e| fail(locks.to_path_buf(), e))?;
    let paths = lock_files(locks, &key);
    let mut files = Vec::with_capacity(paths.len());
    for path in &paths {
        let file = open_lock(path).map_err(|e| fail(path.clone(), e))?;
        match file.try_lock() {
            Ok(()) => files.push(file),
            Err(std::fs::TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(holder_file(path)).unwrap_or_default();
                return Err(LockError::Held {
                    dir: kubelet_dir.to_path_buf(),
                    lock: path.clone(),
                    holder: holder.lines().next().unwrap_or("").trim().to_string(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(fail(path.clone(), e)),
        }
    }
    // Who holds them, for the message of the one that loses (best effort).
    let holder = format!(
        "pid {} serving {}\n",
        std::process::id(),
        key.canonical.display()
    );
    for path in &paths {
        let written = std::fs::File::create(holder_file(path))
            .and_then(|mut f| f.write_all(holder.as_bytes()));
        if let Err(e) = written {
            tracing::debug!(lock = %path.display(), "cannot say who holds the lock: {e}");
        }
    }
    tracing::debug!(
        dir = %kubelet_dir.display(),
        canonical = %key.canonical.display(),
        locks = ?paths,
        "holding the kubelet directory's locks"
    );
    Ok(DirLock {
        _files: files,
        paths: paths.to_vec(),
    })
}

/// Creates the lock directory; the shared fallback one world-writable with the sticky bit, as
/// `/tmp` is, so that every user's daemon can lock there. On Windows `%ProgramData%\dxdp` and
/// its lock directory are SYSTEM's and Administrators' alone (`host_acl`): a local user who
/// could create the lock file could keep dxdp from starting.
/// A directory another account owns is refused; an access list Windows would not set is
/// logged once and the lock taken anyway (the lock is on the kubelet's path, its access list is
/// hardening).
#[cfg(windows)]
fn create_lock_dir(locks: &Path) -> std::io::Result<()> {
    use crate::util::host_acl::{create_protected_dir, Readers};
    let soft = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() != std::io::ErrorKind::PermissionDenied => {
            tracing::warn!("the lock directory is used without its protected access list: {e}");
            Ok(())
        }
        r => r,
    };
    if let Some(parent) = locks.parent().filter(|_| locks == lock_dir()) {
        soft(create_protected_dir(parent, Readers::AdministratorsOnly))?;
    }
    soft(create_protected_dir(locks, Readers::AdministratorsOnly))?;
    std::fs::create_dir_all(locks)
}

/// Creates the lock directory; the shared fallback one world-writable with the sticky bit, as
/// `/tmp` is, so that every user's daemon can lock there.
#[cfg(not(windows))]
fn create_lock_dir(locks: &Path) -> std::io::Result<()> {
    if locks.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(locks)?;
    #[cfg(unix)]
    if locks == Path::new(FALLBACK_LOCK_DIR) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(locks, std::fs::Permissions::from_mode(0o1777));
    }
    Ok(())
}

/// `dxdp-<resource name with / as ->-<nanoseconds>.sock`.
pub(crate) fn socket_file_name(resource_name: &str, nanos: u128) -> String {
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
pub(crate) fn socket_name(resource_name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    socket_file_name(resource_name, nanos)
}

/// The resource part of a socket file name dxdp made (`None` for any other file).
pub(crate) fn socket_resource(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix("dxdp-")?.strip_suffix(".sock")?;
    let (resource, nanos) = rest.rsplit_once('-')?;
    (!nanos.is_empty() && nanos.bytes().all(|b| b.is_ascii_digit())).then_some(resource)
}

/// Removes `dxdp-*.sock` files that no process answers on (left by a crashed run), and refuses
/// to start when a live dxdp (one older than the directory lock) already serves one of
/// `endpoints` in `dir`.
pub(crate) async fn remove_stale_sockets(
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

    /// The holder text of this process for `dir` (its canonical path, as std resolves it).
    fn me(dir: &Path) -> String {
        format!(
            "pid {} serving {}",
            std::process::id(),
            std::fs::canonicalize(dir).unwrap().display()
        )
    }

    /// `lock` of `spelling` must fail naming `spelling`, the lock file `which` of `first` and
    /// this process as the holder.
    fn refused(locks: &Path, spelling: &Path, first: &DirLock, which: usize, holder: &str) {
        match lock(locks, spelling) {
            Err(LockError::Held {
                dir,
                lock,
                holder: h,
            }) => {
                assert_eq!(dir, spelling);
                assert_eq!(lock, first.paths()[which], "{}", spelling.display());
                assert_eq!(h, holder, "{}", spelling.display());
            }
            other => panic!(
                "a second lock of the same directory as {} must fail: {other:?}",
                spelling.display()
            ),
        }
    }

    #[test]
    fn one_lock_per_directory_whatever_the_spelling() {
        let locks = tempfile::tempdir().unwrap();
        let top = tempfile::tempdir().unwrap();
        let kubelet = top.path().join("device-plugins");
        std::fs::create_dir(&kubelet).unwrap();
        std::fs::create_dir(top.path().join("x")).unwrap();
        let first = lock(locks.path(), &kubelet).expect("the first takes it");
        let holder = me(&kubelet);
        // The loser reads who holds the lock while it is held, from the holder file: the locked
        // files themselves stay empty, so nothing is ever read from a locked range (Windows
        // locks are mandatory: no other process could read them).
        for path in first.paths() {
            assert_eq!(
                std::fs::metadata(path).unwrap().len(),
                0,
                "{}",
                path.display()
            );
        }
        let with_slash = PathBuf::from(format!("{}/", kubelet.display()));
        refused(locks.path(), &with_slash, &first, 0, &holder);
        let dotdot = top.path().join("x").join("..").join("device-plugins");
        refused(locks.path(), &dotdot, &first, 0, &holder);
        let link = top.path().join("link");
        #[cfg(unix)]
        let linked = std::os::unix::fs::symlink(&kubelet, &link);
        #[cfg(windows)]
        let linked = std::os::windows::fs::symlink_dir(&kubelet, &link);
        match linked {
            // (Wine makes Windows symlinks that opening does not follow: not the same directory.)
            Ok(()) if file_id(&link).ok() != file_id(&kubelet).ok() => eprintln!(
                "skipped one_lock_per_directory_whatever_the_spelling (symlink part): a symlink here does not lead to its target"
            ),
            Ok(()) => refused(locks.path(), &link, &first, 0, &holder),
            Err(e) => eprintln!(
                "skipped one_lock_per_directory_whatever_the_spelling (symlink part): cannot make a symlink here: {e}"
            ),
        }
        #[cfg(windows)]
        {
            let upper = PathBuf::from(kubelet.to_string_lossy().to_uppercase());
            refused(locks.path(), &upper, &first, 0, &holder);
        }
        // Another directory has its own lock.
        let other = tempfile::tempdir().unwrap();
        let _second = lock(locks.path(), other.path()).expect("another directory");
        drop(first);
        let _again = lock(locks.path(), &dotdot).expect("released when dropped");
    }

    #[test]
    fn a_directory_that_does_not_exist_yet_is_locked_by_its_nearest_existing_ancestor() {
        let locks = tempfile::tempdir().unwrap();
        let top = tempfile::tempdir().unwrap();
        let kubelet = top.path().join("kubelet").join("device-plugins");
        let first = lock(locks.path(), &kubelet).expect("a missing directory can be locked");
        assert!(!kubelet.exists(), "not created");
        let canonical_top = std::fs::canonicalize(top.path()).unwrap();
        let holder = format!(
            "pid {} serving {}",
            std::process::id(),
            canonical_top
                .join("kubelet")
                .join("device-plugins")
                .display()
        );
        // Spelled through `..` of a directory that does not exist either.
        let dotdot = top
            .path()
            .join("kubelet")
            .join("nothing")
            .join("..")
            .join("device-plugins");
        refused(locks.path(), &dotdot, &first, 0, &holder);
        // The kubelet creates it: a daemon started now keys by the directory itself, and the
        // path lock still stops it.
        std::fs::create_dir_all(&kubelet).unwrap();
        refused(locks.path(), &kubelet, &first, 0, &holder);
        // The kubelet deletes and recreates it: still held.
        std::fs::remove_dir(&kubelet).unwrap();
        std::fs::create_dir(&kubelet).unwrap();
        refused(locks.path(), &kubelet, &first, 0, &holder);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_bind_mount_of_the_directory_takes_the_same_lock() {
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg(&self.0).status();
            }
        }
        let locks = tempfile::tempdir().unwrap();
        let top = tempfile::tempdir().unwrap();
        let kubelet = top.path().join("device-plugins");
        let mount = top.path().join("elsewhere");
        std::fs::create_dir(&kubelet).unwrap();
        std::fs::create_dir(&mount).unwrap();
        let out = std::process::Command::new("mount")
            .arg("--bind")
            .arg(&kubelet)
            .arg(&mount)
            .output();
        let _unmount = match out {
            Ok(o) if o.status.success() => Unmount(mount.clone()),
            Ok(o) => {
                eprintln!(
                    "skipped a_bind_mount_of_the_directory_takes_the_same_lock: mount --bind failed here ({}; it needs root and CAP_SYS_ADMIN): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                return;
            }
            Err(e) => {
                eprintln!(
                    "skipped a_bind_mount_of_the_directory_takes_the_same_lock: cannot run mount: {e}"
                );
                return;
            }
        };
        let first = lock(locks.path(), &kubelet).expect("the first takes it");
        // Another canonical path, the same directory: the identity lock stops it.
        refused(locks.path(), &mount, &first, 1, &me(&kubelet));
        drop(first);
        let _mounted = lock(locks.path(), &mount).expect("released when dropped");
        refused(locks.path(), &kubelet, &_mounted, 1, &me(&mount));
    }

    #[test]
    fn the_lock_directory_is_not_under_tmpdir() {
        let locks = lock_dir();
        assert!(locks.is_absolute(), "{}", locks.display());
        #[cfg(unix)]
        assert!(
            locks == Path::new(SYSTEM_LOCK_DIR) || locks == Path::new(FALLBACK_LOCK_DIR),
            "{}",
            locks.display()
        );
        #[cfg(windows)]
        assert!(
            locks.ends_with(r"dxdp\locks") && !locks.starts_with(std::env::temp_dir()),
            "{}",
            locks.display()
        );
    }

    #[test]
    fn the_message_names_the_directory_the_lock_and_what_to_do() {
        let e = LockError::Held {
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
