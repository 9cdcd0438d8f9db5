//! The probes `dxdp validate` runs in a container, behind one trait: the native ones on Windows
//! (`windows/probe.rs`, thin FFI), none elsewhere, and fakes in tests. Each method may block or
//! hang (a driver DLL): the caller runs it under a time limit.

use std::path::{Path, PathBuf};
use std::time::Duration;

use dxdp_core::validation::{Api, ApiAnswer, D3d12Answer};

/// An adapter DXGI lists: LUID (as `DXDP_ADAPTER_LUIDS` writes it), description, software.
pub(crate) type ListedAdapter = (i64, String, bool);

/// What `dxdp validate` asks of the machine it runs on.
pub trait Probes: Send + Sync {
    /// Why these probes cannot run here at all (not Windows), else `None`.
    fn unavailable(&self) -> Option<String>;
    /// The directory the vendor DLLs and runtime files are looked up in (System32).
    fn library_dir(&self) -> PathBuf;
    /// The adapters DXGI lists (the enumeration where DXCore cannot be loaded).
    fn dxgi_adapters(&self) -> Result<Vec<ListedAdapter>, String>;
    /// A D3D12 round trip of `len` bytes on the adapter `luid`, trying `levels` in order; `Err`
    /// when D3D12 could not be tried at all.
    fn d3d12(
        &self,
        luid: i64,
        levels: &[u32],
        len: usize,
        limit: Duration,
    ) -> Result<D3d12Answer, String>;
    /// Loads a DLL with its dependencies; `Err` is the loader's error.
    fn load(&self, path: &Path) -> Result<(), String>;
    /// Probes a vendor API through the DLL in `dir`.
    fn api(&self, api: Api, dir: &Path) -> ApiAnswer;
}

/// The probes of this machine.
#[derive(Debug, Default, Clone, Copy)]
pub struct NativeProbes;

#[cfg(windows)]
impl Probes for NativeProbes {
    fn unavailable(&self) -> Option<String> {
        None
    }

    fn library_dir(&self) -> PathBuf {
        super::windows::probe::system_dir()
    }

    fn dxgi_adapters(&self) -> Result<Vec<ListedAdapter>, String> {
        super::windows::probe::dxgi_adapters()
    }

    fn d3d12(
        &self,
        luid: i64,
        levels: &[u32],
        len: usize,
        limit: Duration,
    ) -> Result<D3d12Answer, String> {
        super::windows::probe::d3d12_round_trip(luid, levels, len, limit)
    }

    fn load(&self, path: &Path) -> Result<(), String> {
        super::windows::probe::load_dll(path)
    }

    fn api(&self, api: Api, dir: &Path) -> ApiAnswer {
        super::windows::probe::vendor_api(api, dir)
    }
}

#[cfg(not(windows))]
const WINDOWS_ONLY: &str =
    "DirectX, D3D12 and the vendor DLLs can be probed only on Windows, inside a container given GPUs";

#[cfg(not(windows))]
impl Probes for NativeProbes {
    fn unavailable(&self) -> Option<String> {
        Some(WINDOWS_ONLY.into())
    }

    fn library_dir(&self) -> PathBuf {
        PathBuf::from(r"C:\Windows\System32")
    }

    fn dxgi_adapters(&self) -> Result<Vec<ListedAdapter>, String> {
        Err(WINDOWS_ONLY.into())
    }

    fn d3d12(&self, _: i64, _: &[u32], _: usize, _: Duration) -> Result<D3d12Answer, String> {
        Err(WINDOWS_ONLY.into())
    }

    fn load(&self, _: &Path) -> Result<(), String> {
        Err(WINDOWS_ONLY.into())
    }

    fn api(&self, _: Api, _: &Path) -> ApiAnswer {
        ApiAnswer::LoadFailed(WINDOWS_ONLY.into())
    }
}

/// The environment variable that makes `dxdp` a one-shot child asking D3D12 for one adapter's
/// feature level (its LUID, decimal). Discovery sets it, people never need to: the D3D12 device and
/// the driver's user-mode DLLs live in the child, so a driver that hangs or crashes never stalls
/// discovery or ends the daemon, and none of its DLLs stays mapped in the daemon.
pub const FEATURE_LEVEL_CHILD_VAR: &str = "DXDP_D3D12_FEATURE_LEVEL_OF";

/// How long discovery waits for a feature-level child before it kills it.
#[cfg_attr(not(windows), allow(dead_code))] // Discovery asks only on Windows.
pub(crate) const FEATURE_LEVEL_CHILD_LIMIT: Duration = Duration::from_secs(10);

/// When this process is a feature-level child ([`FEATURE_LEVEL_CHILD_VAR`] set): asks D3D12,
/// prints the level (`12_1`) on stdout or why there is none on stderr, and gives the exit code
/// (0 or 1); `None` for every other start.
pub fn feature_level_child() -> Option<std::process::ExitCode> {
    let luid = std::env::var(FEATURE_LEVEL_CHILD_VAR).ok()?;
    let answer = match luid.trim().parse::<i64>() {
        Ok(luid) => native_feature_level(luid),
        Err(_) => Err(format!(
            "{FEATURE_LEVEL_CHILD_VAR}={} is not an adapter LUID (a decimal number)",
            dxdp_core::quote::quote(&luid)
        )),
    };
    Some(match answer {
        Ok(level) => {
            println!("{level}");
            std::process::ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("{why}");
            std::process::ExitCode::FAILURE
        }
    })
}

#[cfg(windows)]
fn native_feature_level(luid: i64) -> Result<String, String> {
    super::windows::probe::feature_level(luid)
}

#[cfg(not(windows))]
fn native_feature_level(_luid: i64) -> Result<String, String> {
    Err("D3D12 feature levels can be asked only on Windows".into())
}

/// The feature level of the adapter `luid`, asked by `exe` started as a feature-level child and
/// waited for at most `limit` (then killed). `Err` says why there is none, bounded.
#[cfg_attr(not(windows), allow(dead_code))] // Discovery asks only on Windows; tested on Linux.
pub(crate) fn feature_level_in_child(
    exe: &Path,
    luid: i64,
    limit: Duration,
) -> Result<String, String> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(exe)
        .env(FEATURE_LEVEL_CHILD_VAR, luid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {} to ask D3D12: {e}", exe.display()))?;
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "D3D12 gave no answer within {limit:?} (the child was stopped): the driver may hang"
                ));
            }
            Err(e) => return Err(format!("cannot wait for the D3D12 child: {e}")),
        }
    };
    let read = |pipe: Option<&mut dyn Read>| {
        let mut text = String::new();
        if let Some(p) = pipe {
            let _ = p.take(4096).read_to_string(&mut text);
        }
        text.trim().to_string()
    };
    let out = read(child.stdout.as_mut().map(|p| p as &mut dyn Read));
    let err = read(child.stderr.as_mut().map(|p| p as &mut dyn Read));
    if status.success() && !out.is_empty() {
        Ok(out)
    } else if !err.is_empty() {
        Err(err)
    } else {
        Err(format!(
            "the D3D12 child ended with {status} and said nothing"
        ))
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in child: a shell script with `body`.
    fn script(dir: &tempfile::TempDir, name: &str, body: &str) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn the_childs_answer_its_refusal_and_its_silence_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let limit = Duration::from_secs(10);
        // The child is given the LUID in its variable.
        let echo = script(&dir, "echo", "echo \"12_$DXDP_D3D12_FEATURE_LEVEL_OF\"");
        assert_eq!(feature_level_in_child(&echo, 1, limit), Ok("12_1".into()));
        let refuse = script(&dir, "refuse", "echo 'no device at 11_0' >&2; exit 1");
        assert_eq!(
            feature_level_in_child(&refuse, 7, limit),
            Err("no device at 11_0".into())
        );
        let mute = script(&dir, "mute", "exit 3");
        assert_eq!(
            feature_level_in_child(&mute, 7, limit),
            Err("the D3D12 child ended with exit status: 3 and said nothing".into())
        );
        let missing = dir.path().join("missing");
        assert!(feature_level_in_child(&missing, 7, limit)
            .unwrap_err()
            .starts_with("cannot start "));
    }

    #[test]
    fn a_child_that_hangs_is_stopped_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let hang = script(&dir, "hang", "exec sleep 60");
        let started = std::time::Instant::now();
        assert_eq!(
            feature_level_in_child(&hang, 1, Duration::from_millis(300)),
            Err(
                "D3D12 gave no answer within 300ms (the child was stopped): the driver may hang"
                    .into()
            )
        );
        assert!(started.elapsed() < Duration::from_secs(30));
    }
}
