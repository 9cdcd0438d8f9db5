//! HostProcess containers on containerd 1.6: where the pod's volumes really are.
//!
//! A HostProcess container sees the host's file system. Its volumes (the chart's ConfigMap, the
//! service account token) appear at their `mountPath` on containerd 1.7 and later, but under the
//! container's sandbox mount point (`%CONTAINER_SANDBOX_MOUNT_POINT%\<mountPath without the
//! drive>`) on containerd 1.6. The one owner of that variable and of the path mapping: the
//! configuration looks its files up with `resolve` (the pod's copy first), the cluster client the service account with
//! `under_sandbox`. Outside a HostProcess container the variable is unset and paths are used
//! as given.

use std::path::{Path, PathBuf};

/// The variable containerd sets in HostProcess containers: where the image's files are.
pub const SANDBOX_VAR: &str = "CONTAINER_SANDBOX_MOUNT_POINT";

/// `path` under the sandbox mount point: the drive (`C:`) and leading separators are dropped
/// and the rest is joined to `sandbox` with the sandbox's separator. `None` for an empty rest.
pub(crate) fn under_sandbox(sandbox: &str, path: &str) -> Option<String> {
    let rest = match path.as_bytes() {
        [d, b':', ..] if d.is_ascii_alphabetic() => &path[2..],
        _ => path,
    };
    let rest = rest.trim_start_matches(['\\', '/']);
    if rest.is_empty() {
        return None;
    }
    let sep = if sandbox.contains('\\') { '\\' } else { '/' };
    let other = if sep == '\\' { '/' } else { '\\' };
    let base = sandbox.trim_end_matches(['\\', '/']);
    Some(format!(
        "{base}{sep}{}",
        rest.replace(other, &sep.to_string())
    ))
}

/// The pod's copy first: `path` under the sandbox mount point when there is a sandbox and the
/// copy exists there; else `path` (so errors name the path the user gave). The pod's volume
/// wins over a file at the same path on the host: on containerd 1.6 a file a local user
/// planted at the host's `C:\etc\dxdp\config.yaml` would otherwise override the ConfigMap.
pub(crate) fn resolve(
    path: &Path,
    sandbox: Option<&str>,
    exists: impl Fn(&Path) -> bool,
) -> PathBuf {
    let Some(sandbox) = sandbox.filter(|s| !s.is_empty()) else {
        return path.to_path_buf();
    };
    match under_sandbox(sandbox, &path.to_string_lossy()) {
        Some(candidate) if exists(Path::new(&candidate)) => PathBuf::from(candidate),
        _ => path.to_path_buf(),
    }
}

/// A file system of named files and a sandbox mount point, for the tests of what looks paths
/// up under it.
#[cfg(test)]
pub(crate) mod testing {
    use std::collections::BTreeSet;
    use std::path::Path;

    /// The sandbox mount point of the tests.
    pub(crate) const SANDBOX: &str = r"C:\C\0f3a";

    /// Whether a path is one of `files`.
    pub(crate) fn fs(files: &[&str]) -> impl Fn(&Path) -> bool {
        let set: BTreeSet<String> = files.iter().map(|s| s.to_string()).collect();
        move |p: &Path| set.contains(p.to_string_lossy().as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{fs, SANDBOX};
    use super::*;

    #[test]
    fn joins_without_the_drive() {
        let cases = [
            (
                r"C:\etc\dxdp\config.yaml",
                Some(r"C:\C\0f3a\etc\dxdp\config.yaml"),
            ),
            (
                "C:/etc/dxdp/config.yaml",
                Some(r"C:\C\0f3a\etc\dxdp\config.yaml"),
            ),
            (
                r"\etc\dxdp\config.yaml",
                Some(r"C:\C\0f3a\etc\dxdp\config.yaml"),
            ),
            (
                r"etc\dxdp\config.yaml",
                Some(r"C:\C\0f3a\etc\dxdp\config.yaml"),
            ),
            (r"C:\", None),
            ("", None),
        ];
        for (path, want) in cases {
            assert_eq!(under_sandbox(SANDBOX, path).as_deref(), want, "{path}");
        }
        assert_eq!(
            under_sandbox("/sandbox/", "/etc/dxdp/config.yaml").as_deref(),
            Some("/sandbox/etc/dxdp/config.yaml")
        );
        assert_eq!(
            under_sandbox(r"C:\hpc\", r"D:\x").as_deref(),
            Some(r"C:\hpc\x")
        );
    }

    #[test]
    fn containerd_1_7_uses_the_mount_path() {
        let path = Path::new(r"C:\etc\dxdp\config.yaml");
        let exists = fs(&[r"C:\etc\dxdp\config.yaml"]);
        assert_eq!(resolve(path, Some(SANDBOX), exists), path);
    }

    #[test]
    fn the_pods_copy_wins_over_a_file_planted_on_the_host() {
        let path = Path::new(r"C:\etc\dxdp\config.yaml");
        let exists = fs(&[
            r"C:\etc\dxdp\config.yaml",
            r"C:\C\0f3a\etc\dxdp\config.yaml",
        ]);
        assert_eq!(
            resolve(path, Some(SANDBOX), exists),
            Path::new(r"C:\C\0f3a\etc\dxdp\config.yaml")
        );
    }

    #[test]
    fn containerd_1_6_finds_the_file_under_the_sandbox() {
        let path = Path::new(r"C:\etc\dxdp\config.yaml");
        let exists = fs(&[r"C:\C\0f3a\etc\dxdp\config.yaml"]);
        assert_eq!(
            resolve(path, Some(SANDBOX), exists),
            Path::new(r"C:\C\0f3a\etc\dxdp\config.yaml")
        );
    }

    #[test]
    fn missing_everywhere_or_no_sandbox_keeps_the_given_path() {
        let path = Path::new(r"C:\etc\dxdp\config.yaml");
        assert_eq!(resolve(path, Some(SANDBOX), fs(&[])), path);
        let only_sandbox = fs(&[r"C:\C\0f3a\etc\dxdp\config.yaml"]);
        assert_eq!(resolve(path, None, &only_sandbox), path);
        assert_eq!(resolve(path, Some(""), &only_sandbox), path);
    }
}
