//! Places the daemon's own `dxdp.exe` on the host for the validation Job, which mounts it
//! read-only (hostPath).
//!
//! Windows does not let a file that a running process has open be overwritten or deleted (the
//! validation container runs the copy), so a copy is never changed once placed: each build gets
//! a directory of its own under the host directory, named by its version and a hash of its
//! content (`dxdp-0.1.0-0123456789abcdef\dxdp.exe`), written under a temporary name and renamed
//! into place in one step. The Job mounts that directory; a daemon of another build places its
//! own beside it. Directories no Job uses any more are removed; one still open (a Job running
//! it) fails to delete and is tried again at the next run.
//!
//! Everything here is plain file-system work, tested on Linux in temporary directories.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The name of the executable in each version directory (what the Job runs).
pub(crate) const EXE_NAME: &str = "dxdp.exe";

/// The prefix of the version directories.
const PREFIX: &str = "dxdp-";
/// The prefix of directories being written.
const TEMP_PREFIX: &str = ".dxdp-";

/// FNV-1a, 64 bits: a content hash that is the same in every build and on every platform.
pub(crate) fn content_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The version directory's name for an executable of `version` with `content`.
pub(crate) fn version_dir_name(version: &str, content: &[u8]) -> String {
    let version: String = version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{PREFIX}{version}-{:016x}", content_hash(content))
}

/// Which entries of the host directory to remove: version and temporary directories whose names
/// are not in `keep` (the current version and those running Jobs mount). Other files are never
/// touched.
pub(crate) fn stale(entries: &[String], keep: &BTreeSet<String>) -> Vec<String> {
    let mut out: Vec<String> = entries
        .iter()
        .filter(|e| e.starts_with(PREFIX) || e.starts_with(TEMP_PREFIX))
        .filter(|e| !keep.contains(*e))
        .cloned()
        .collect();
    out.sort();
    out
}

/// The last component of a path written with `\` or `/` (the directory a Job's hostPath names).
pub(crate) fn last_component(path: &str) -> &str {
    path.trim_end_matches(['\\', '/'])
        .rsplit(['\\', '/'])
        .next()
        .unwrap_or_default()
}

/// How long a refused rename or removal is tried again. Antivirus (Microsoft Defender is on by
/// default on Windows Server) holds a just-written executable open for a moment, and Windows
/// meanwhile refuses to rename or remove the directory that holds it; rustup retries for the same
/// reason. Well inside the time placing is given (`place_limit`, 60 s).
const REFUSED_FOR: Duration = Duration::from_secs(20);

/// Whether Windows refused `e` because a file is open: access denied (a pending scan or delete),
/// a sharing or a lock violation (ERROR_SHARING_VIOLATION 32, ERROR_LOCK_VIOLATION 33).
fn is_refused(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied || matches!(e.raw_os_error(), Some(32 | 33))
}

/// Runs `op` until it succeeds, fails for another reason than [`is_refused`], or `limit` has
/// passed, waiting 10 ms, 20 ms, 40 ms … (at most 1 s) between tries. Returns its last result and
/// how many tries were refused.
fn retry_refused<T>(
    limit: Duration,
    mut op: impl FnMut() -> std::io::Result<T>,
) -> (std::io::Result<T>, u32) {
    let start = Instant::now();
    let mut wait = Duration::from_millis(10);
    let mut refused = 0;
    loop {
        match op() {
            Err(e) if is_refused(&e) && start.elapsed() + wait <= limit => {
                refused += 1;
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(1));
            }
            Err(e) if is_refused(&e) => return (Err(e), refused + 1),
            other => return (other, refused),
        }
    }
}

/// Why the executable could not be placed.
#[derive(Debug, thiserror::Error)]
#[error("cannot place dxdp.exe for the validation Job in {dir}: {what}: {source} (check validation.hostDir; the daemon runs as SYSTEM on the host)")]
pub(crate) struct PlaceError {
    /// The host directory.
    pub(crate) dir: String,
    /// The step that failed.
    pub(crate) what: &'static str,
    /// The error.
    #[source]
    pub(crate) source: std::io::Error,
}

/// Puts `content` (the running executable) into its version directory under `host_dir` unless
/// it is there already with that content, and returns the version directory. An existing copy
/// is never written to; a version directory with other content (a copy cut short) is removed
/// and placed again.
pub(crate) fn place(host_dir: &Path, version: &str, content: &[u8]) -> Result<PathBuf, PlaceError> {
    let err = |what: &'static str| {
        let dir = host_dir.display().to_string();
        move |source| PlaceError { dir, what, source }
    };
    let name = version_dir_name(version, content);
    let target = host_dir.join(&name);
    let exe = target.join(EXE_NAME);
    if let Ok(existing) = std::fs::read(&exe) {
        if existing == content {
            return Ok(target);
        }
    }
    // Writable by SYSTEM and Administrators only (read and execute for the validation
    // container): nobody else can plant a DLL beside dxdp.exe.
    crate::util::host_acl::create_protected_dir(host_dir, crate::util::host_acl::Readers::Everyone)
        .map_err(err("create the directory"))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let temp = host_dir.join(format!(
        "{TEMP_PREFIX}{}.tmp-{}-{nanos}",
        &name[PREFIX.len()..],
        std::process::id()
    ));
    std::fs::create_dir(&temp).map_err(err("create a temporary directory"))?;
    let written = (|| {
        let mut f = std::fs::File::create(temp.join(EXE_NAME))?;
        f.write_all(content)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&temp);
        return Err(err("write the copy")(e));
    }
    // A directory of this name with other content: remove it (nothing can run a broken copy
    // for long), then rename the new one into place.
    if target.exists() {
        let _ = retry_refused(REFUSED_FOR, || std::fs::remove_dir_all(&target));
    }
    let (renamed, refused) = retry_refused(REFUSED_FOR, || std::fs::rename(&temp, &target));
    if refused > 0 {
        tracing::info!(
            dir = %target.display(),
            refused,
            "renaming the copy of dxdp.exe into place was refused at first (antivirus scanning the new file?) and retried"
        );
    }
    match renamed {
        Ok(()) => Ok(target),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&temp);
            // Another process placed the same content meanwhile.
            match std::fs::read(&exe) {
                Ok(existing) if existing == content => Ok(target),
                _ => Err(err("rename the copy into place")(e)),
            }
        }
    }
}

/// Removes the stale entries of `host_dir` (see [`stale`]); returns those that could not be
/// removed, with why (on Windows: a Job still runs that copy; tried again next time).
pub(crate) fn prune(host_dir: &Path, keep: &BTreeSet<String>) -> Vec<(String, String)> {
    let Ok(read) = std::fs::read_dir(host_dir) else {
        return Vec::new();
    };
    let entries: Vec<String> = read
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    let mut failed = Vec::new();
    for name in stale(&entries, keep) {
        if let Err(e) = std::fs::remove_dir_all(host_dir.join(&name)) {
            failed.push((name, e.to_string()));
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_step_is_tried_again_until_it_is_allowed() {
        let mut calls = 0;
        let (r, refused) = retry_refused(Duration::from_secs(5), || {
            calls += 1;
            match calls {
                1 => Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied)),
                2 => Err(std::io::Error::from_raw_os_error(32)),
                _ => Ok("renamed"),
            }
        });
        assert_eq!(r.unwrap(), "renamed");
        assert_eq!((calls, refused), (3, 2));
    }

    #[test]
    fn another_error_is_not_tried_again_and_a_refusal_stops_at_the_limit() {
        let mut calls = 0;
        let (r, refused) = retry_refused(Duration::from_secs(5), || -> std::io::Result<()> {
            calls += 1;
            Err(std::io::Error::from(std::io::ErrorKind::NotFound))
        });
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::NotFound);
        assert_eq!((calls, refused), (1, 0));
        // No time left: the first refusal is the answer.
        let mut calls = 0;
        let (r, refused) = retry_refused(Duration::ZERO, || -> std::io::Result<()> {
            calls += 1;
            Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
        });
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::PermissionDenied);
        assert_eq!((calls, refused), (1, 1));
    }

    /// Windows refuses to rename a directory while a file in it is open (what antivirus does to a
    /// new executable); the rename goes through once the file is closed.
    #[cfg(windows)]
    #[test]
    fn a_directory_whose_file_is_held_open_is_renamed_once_it_is_closed() {
        use std::os::windows::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        std::fs::create_dir(&from).unwrap();
        std::fs::write(from.join(EXE_NAME), b"MZ").unwrap();
        // No sharing at all, as a scanner may open it.
        let held = std::fs::OpenOptions::new()
            .read(true)
            .share_mode(0)
            .open(from.join(EXE_NAME))
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            // Released after the first refusal, or at once where nothing refuses.
            let _ = rx.recv_timeout(Duration::from_secs(5));
            drop(held);
        });
        let mut tried = 0;
        let (r, refused) = retry_refused(Duration::from_secs(10), || {
            tried += 1;
            let r = std::fs::rename(&from, &to);
            if r.is_err() || tried > 1 {
                let _ = tx.send(());
            }
            r
        });
        let _ = tx.send(());
        holder.join().unwrap();
        r.unwrap();
        assert_eq!(std::fs::read(to.join(EXE_NAME)).unwrap(), b"MZ");
        if refused == 0 {
            eprintln!("skipped a_directory_whose_file_is_held_open_is_renamed_once_it_is_closed: this platform renamed the directory while its file was held open (Wine does; Windows refuses)");
        }
    }

    #[test]
    fn the_hash_is_fnv_1a() {
        // FNV-1a 64 of "" and "a", as published with the algorithm.
        assert_eq!(content_hash(b""), 0xcbf29ce484222325);
        assert_eq!(content_hash(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(
            version_dir_name("0.1.0+dev", b"a"),
            "dxdp-0.1.0_dev-af63dc4c8601ec8c"
        );
    }

    #[test]
    fn a_copy_is_placed_once_and_never_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("validation");
        let first = place(&host, "0.1.0", b"MZ build one").unwrap();
        assert_eq!(
            first,
            host.join(format!("dxdp-0.1.0-{:016x}", content_hash(b"MZ build one")))
        );
        assert_eq!(
            std::fs::read(first.join("dxdp.exe")).unwrap(),
            b"MZ build one"
        );
        let modified = std::fs::metadata(first.join("dxdp.exe"))
            .unwrap()
            .modified()
            .unwrap();
        // The same build again: the copy is reused, not written.
        assert_eq!(place(&host, "0.1.0", b"MZ build one").unwrap(), first);
        assert_eq!(
            std::fs::metadata(first.join("dxdp.exe"))
                .unwrap()
                .modified()
                .unwrap(),
            modified
        );
        // Another build gets a directory of its own; the first stays until pruned.
        let second = place(&host, "0.1.1", b"MZ build two").unwrap();
        assert_ne!(second, first);
        assert!(first.join("dxdp.exe").exists());
        let mut names: Vec<String> = std::fs::read_dir(&host)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names.len(), 2, "no temporary directory left: {names:?}");
    }

    #[test]
    fn a_cut_short_copy_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let name = version_dir_name("0.1.0", b"MZ full");
        std::fs::create_dir_all(dir.path().join(&name)).unwrap();
        std::fs::write(dir.path().join(&name).join("dxdp.exe"), b"MZ").unwrap();
        let placed = place(dir.path(), "0.1.0", b"MZ full").unwrap();
        assert_eq!(std::fs::read(placed.join("dxdp.exe")).unwrap(), b"MZ full");
    }

    #[test]
    fn only_unused_copies_and_temporaries_are_pruned() {
        let entries: Vec<String> = [
            "dxdp-0.1.0-aaaaaaaaaaaaaaaa",
            "dxdp-0.1.1-bbbbbbbbbbbbbbbb",
            "dxdp-0.1.2-cccccccccccccccc",
            ".dxdp-0.1.2-cccccccccccccccc.tmp-12-34",
            "notes.txt",
            "other",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let keep: BTreeSet<String> = [
            "dxdp-0.1.2-cccccccccccccccc".to_string(),
            "dxdp-0.1.0-aaaaaaaaaaaaaaaa".to_string(),
        ]
        .into();
        assert_eq!(
            stale(&entries, &keep),
            vec![
                ".dxdp-0.1.2-cccccccccccccccc.tmp-12-34".to_string(),
                "dxdp-0.1.1-bbbbbbbbbbbbbbbb".to_string(),
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        for e in &entries {
            std::fs::create_dir(dir.path().join(e)).unwrap();
        }
        assert!(prune(dir.path(), &keep).is_empty());
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![
                "dxdp-0.1.0-aaaaaaaaaaaaaaaa",
                "dxdp-0.1.2-cccccccccccccccc",
                "notes.txt",
                "other"
            ]
        );
        assert_eq!(
            last_component(r"C:\var\lib\dxdp\validation\dxdp-0.1.0-a\"),
            "dxdp-0.1.0-a"
        );
        assert_eq!(last_component("/tmp/x/dxdp-1"), "dxdp-1");
    }
}
