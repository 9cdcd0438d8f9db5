//! Where the kubelet's device-plugin directory is, and why dxdp chose it.
//!
//! On Windows the kubelet builds the directory from the environment:
//! `os.Getenv("SYSTEMDRIVE") + "\var\lib\kubelet\device-plugins\"` (device manager,
//! `KubeletSocketWindows`). dxdp does the same, so a node whose system drive is not `C:` works
//! without `--kubelet-dir`. When `%SystemDrive%` is unset or not a drive letter, the kubelet would
//! use a rooted path on its own current drive, which dxdp cannot know: dxdp then uses `C:` and
//! says so (`dxdp doctor` shows the reason; pass `--kubelet-dir` to be sure).

use std::path::{Path, PathBuf};

/// The device-plugin directory below the system drive on Windows.
pub(crate) const WINDOWS_SUFFIX: &str = r"\var\lib\kubelet\device-plugins";
/// The device-plugin directory on Linux and other Unix systems.
pub(crate) const UNIX_DIR: &str = "/var/lib/kubelet/device-plugins";

/// A device-plugin directory and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletDir {
    /// The directory.
    pub path: PathBuf,
    /// Why this directory, for people (`default from %SystemDrive%=D:`).
    pub reason: String,
}

/// The kubelet's directory on Windows for a `%SystemDrive%` value (`None`: unset).
pub fn windows_default(system_drive: Option<&str>) -> KubeletDir {
    let fallback = |why: String| KubeletDir {
        path: PathBuf::from(format!("C:{WINDOWS_SUFFIX}")),
        reason: format!(
            "{why}; assuming C: (pass --kubelet-dir if the kubelet uses another drive)"
        ),
    };
    let Some(raw) = system_drive else {
        return fallback("%SystemDrive% is not set".into());
    };
    let value = raw.trim();
    let drive = value.trim_end_matches(['\\', '/']);
    let mut chars = drive.chars();
    match (chars.next(), chars.next(), chars.next()) {
        (Some(letter), Some(':'), None) if letter.is_ascii_alphabetic() => {
            let drive = format!("{}:", letter.to_ascii_uppercase());
            KubeletDir {
                path: PathBuf::from(format!("{drive}{WINDOWS_SUFFIX}")),
                reason: format!("default from %SystemDrive%={raw}, as the kubelet computes it"),
            }
        }
        _ if value.is_empty() => fallback("%SystemDrive% is empty".into()),
        _ => fallback(format!("%SystemDrive%={raw:?} is not a drive letter")),
    }
}

/// The default directory on this OS, from this process's environment.
pub fn default_dir() -> KubeletDir {
    if cfg!(windows) {
        let drive = std::env::var("SystemDrive").ok();
        windows_default(drive.as_deref())
    } else {
        KubeletDir {
            path: PathBuf::from(UNIX_DIR),
            reason: "default on this OS".into(),
        }
    }
}

/// The directory given on the command line or by `DXDP_KUBELET_DIR`, else the default.
/// `env_value` is `DXDP_KUBELET_DIR` as the process sees it, to tell the two apart.
pub fn resolve(flag: Option<PathBuf>, env_value: Option<&str>) -> KubeletDir {
    match flag {
        Some(path) => {
            let reason = if env_value.is_some_and(|v| path == Path::new(v)) {
                "from DXDP_KUBELET_DIR"
            } else {
                "from --kubelet-dir"
            };
            KubeletDir {
                path,
                reason: reason.into(),
            }
        }
        None => default_dir(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_drive_decides_the_windows_directory() {
        // (%SystemDrive%, directory, reason fragment)
        let table: &[(Option<&str>, &str, &str)] = &[
            (
                Some("C:"),
                r"C:\var\lib\kubelet\device-plugins",
                "%SystemDrive%=C:",
            ),
            (
                Some("D:"),
                r"D:\var\lib\kubelet\device-plugins",
                "%SystemDrive%=D:",
            ),
            (
                Some("e:"),
                r"E:\var\lib\kubelet\device-plugins",
                "%SystemDrive%=e:",
            ),
            (
                Some(r"D:\"),
                r"D:\var\lib\kubelet\device-plugins",
                "as the kubelet computes it",
            ),
            (
                Some(" D: "),
                r"D:\var\lib\kubelet\device-plugins",
                "%SystemDrive%",
            ),
            (
                None,
                r"C:\var\lib\kubelet\device-plugins",
                "%SystemDrive% is not set; assuming C:",
            ),
            (
                Some(""),
                r"C:\var\lib\kubelet\device-plugins",
                "%SystemDrive% is empty",
            ),
            (
                Some(r"\\server\share"),
                r"C:\var\lib\kubelet\device-plugins",
                "is not a drive letter",
            ),
            (
                Some("DD:"),
                r"C:\var\lib\kubelet\device-plugins",
                "is not a drive letter",
            ),
            (
                Some("1:"),
                r"C:\var\lib\kubelet\device-plugins",
                "is not a drive letter",
            ),
            (
                Some("C:\\Windows"),
                r"C:\var\lib\kubelet\device-plugins",
                "is not a drive letter",
            ),
        ];
        for (drive, path, reason) in table {
            let d = windows_default(*drive);
            assert_eq!(d.path, PathBuf::from(path), "{drive:?}");
            assert!(d.reason.contains(reason), "{drive:?}: {}", d.reason);
        }
    }

    #[test]
    fn flags_and_environment_override_the_default() {
        let d = resolve(Some(PathBuf::from("/k")), None);
        assert_eq!(
            (d.path.to_str(), d.reason.as_str()),
            (Some("/k"), "from --kubelet-dir")
        );
        let d = resolve(Some(PathBuf::from("/k")), Some("/k"));
        assert_eq!(d.reason, "from DXDP_KUBELET_DIR");
        let d = resolve(Some(PathBuf::from("/flag")), Some("/env"));
        assert_eq!(d.reason, "from --kubelet-dir");
        assert_eq!(resolve(None, Some("/env")), default_dir());
    }
}
