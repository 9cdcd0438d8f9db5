//! Windows only: `dxdp plugin` in a console of its own, stopped the way hcsshim stops a
//! HostProcess container, and with Ctrl-C. hcsshim (`internal/jobcontainers/process.go`,
//! `signalProcess`) cannot use `GenerateConsoleCtrlEvent` for `CTRL_SHUTDOWN_EVENT`, so it starts
//! a thread in the target process at `kernel32!CtrlRoutine` with the event as its parameter;
//! these tests do exactly that. Each checks that the process ends within hcsshim's 5 s
//! (`JobContainer.Shutdown`), that its sockets are gone, and that its log ends with the stop
//! line. Where AF_UNIX sockets do not exist (Wine 8) the plugin cannot serve, and the tests say
//! so and return.
//!
//! The exe under test is cargo's build of `dxdp`, or the one `DXDP_EXE` names: CI points it at
//! the release `x86_64-pc-windows-gnu` dxdp.exe, the one that ships. Each test prints which.
#![cfg(windows)]

use std::ffi::c_void;
use std::fs::File;
use std::os::windows::io::AsRawHandle;
use std::os::windows::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use windows::core::{s, w};
use windows::Win32::Foundation::{CloseHandle, HANDLE, WAIT_OBJECT_0};
use windows::Win32::System::LibraryLoader::{GetModuleHandleW, GetProcAddress};
use windows::Win32::System::Threading::{
    CreateRemoteThread, WaitForSingleObject, CREATE_NEW_CONSOLE, LPTHREAD_START_ROUTINE,
};

/// `CTRL_C_EVENT`.
const CTRL_C: u32 = 0;
/// `CTRL_SHUTDOWN_EVENT`: what hcsshim sends for SIGTERM (`internal/signals/signal.go`).
const CTRL_SHUTDOWN: u32 = 6;
/// hcsshim terminates the job this long after it signals the processes.
const HCSSHIM_BUDGET: Duration = Duration::from_secs(5);
/// How long the plugin may take to start serving.
const START: Duration = Duration::from_secs(60);

/// Why the plugin cannot serve here, if it cannot.
fn af_unix_missing(dir: &Path) -> Option<String> {
    let probe = dir.join("probe.sock");
    match uds_windows::UnixListener::bind(&probe) {
        Ok(listener) => {
            drop(listener);
            let _ = std::fs::remove_file(&probe);
            None
        }
        Err(e) => Some(format!(
            "AF_UNIX sockets are not available here ({e}; Wine 8 has none), so `dxdp plugin` cannot serve"
        )),
    }
}

fn sockets(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("dxdp-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What hcsshim's `signalProcess` does: a remote thread at `kernel32!CtrlRoutine` (kernel32 is
/// at the same address in every process of a boot) with the event as the thread parameter.
fn signal_like_hcsshim(process: HANDLE, event: u32) {
    // SAFETY: kernel32 is loaded in every process; CtrlRoutine takes the event as its only
    // parameter, which is how hcsshim calls it; the thread handle is closed once.
    unsafe {
        let kernel32 = GetModuleHandleW(w!("kernel32.dll")).expect("kernel32 is loaded");
        let routine = GetProcAddress(kernel32, s!("CtrlRoutine")).expect("kernel32!CtrlRoutine");
        let start: LPTHREAD_START_ROUTINE = Some(std::mem::transmute::<
            unsafe extern "system" fn() -> isize,
            unsafe extern "system" fn(*mut c_void) -> u32,
        >(routine));
        let thread = CreateRemoteThread(
            process,
            None,
            0,
            start,
            Some(event as usize as *const c_void),
            0,
            None,
        )
        .expect("CreateRemoteThread(CtrlRoutine)");
        let _ = CloseHandle(thread);
    }
}

struct Plugin {
    child: Child,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Plugin {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A directory short enough for AF_UNIX socket paths (107 bytes; the user's %TEMP% is often
/// too deep): the CI runner's temporary directory, else the system drive's root.
fn short_dir() -> tempfile::TempDir {
    let base = std::env::var_os("RUNNER_TEMP")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let drive = std::env::var("SystemDrive").unwrap_or_else(|_| "C:".into());
            PathBuf::from(format!("{drive}\\"))
        });
    tempfile::Builder::new()
        .prefix("dxdp")
        .tempdir_in(&base)
        .unwrap_or_else(|e| panic!("a temporary directory in {}: {e}", base.display()))
}

/// The exe under test: `DXDP_EXE` when set (the release exe in CI), else cargo's build.
fn dxdp_exe() -> PathBuf {
    match std::env::var_os("DXDP_EXE").filter(|v| !v.is_empty()) {
        Some(exe) => {
            let exe = PathBuf::from(exe);
            assert!(exe.is_file(), "DXDP_EXE={} is not a file", exe.display());
            eprintln!("testing {} (from DXDP_EXE)", exe.display());
            exe
        }
        None => {
            let exe = PathBuf::from(env!("CARGO_BIN_EXE_dxdp"));
            eprintln!(
                "testing {} (cargo's build; set DXDP_EXE to test another exe)",
                exe.display()
            );
            exe
        }
    }
}

/// Starts `dxdp plugin` in a new console on a fixture host, or says why it cannot serve here.
fn start() -> Option<Plugin> {
    let exe = dxdp_exe();
    let dir = short_dir();
    if let Some(why) = af_unix_missing(dir.path()) {
        eprintln!("skipped: {why}");
        return None;
    }
    let log = dir.path().join("dxdp.log");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvidia-multi-gpu.yaml");
    let child = Command::new(&exe)
        .arg("--host-snapshot")
        .arg(&fixture)
        .args(["plugin", "--kubelet-dir"])
        .arg(dir.path())
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .env("DXDP_LOG_LEVEL", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log).expect("the log file"))
        .creation_flags(CREATE_NEW_CONSOLE.0)
        .spawn()
        .expect("dxdp plugin starts");
    let mut plugin = Plugin { child, dir, log };
    let deadline = Instant::now() + START;
    // Both resources of the fixture (display and compute) have their socket.
    while sockets(plugin.dir.path()).len() < 2 {
        if Instant::now() > deadline || plugin.child.try_wait().ok().flatten().is_some() {
            let _ = plugin.child.kill();
            panic!(
                "the plugin did not create its sockets within {START:?}; log:\n{}",
                plugin.log()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(plugin)
}

/// Sends `event` and checks the stop: exit within hcsshim's budget, no sockets, the stop line last.
fn stops_cleanly(event: u32) {
    let Some(mut plugin) = start() else {
        return;
    };
    let process = HANDLE(plugin.child.as_raw_handle());
    signal_like_hcsshim(process, event);
    // SAFETY: the child's process handle is valid while `plugin.child` lives.
    let waited = unsafe { WaitForSingleObject(process, HCSSHIM_BUDGET.as_millis() as u32) };
    if waited != WAIT_OBJECT_0 {
        let _ = plugin.child.kill();
        panic!(
            "still running {HCSSHIM_BUDGET:?} after event {event} (hcsshim would terminate it); log:\n{}",
            plugin.log()
        );
    }
    let status = plugin.child.wait().expect("exit status");
    let left = sockets(plugin.dir.path());
    assert!(left.is_empty(), "sockets left behind: {left:?}");
    let log = plugin.log();
    let last = log
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    assert!(
        last.contains("device plugin stopped"),
        "the log does not end with the stop line:\n{log}"
    );
    if event == CTRL_C {
        // Ctrl-C: the handler returns at once and `main` returns 0.
        assert!(status.success(), "{status:?}\n{log}");
    }
}

#[test]
fn ctrl_shutdown_through_ctrl_routine_as_hcsshim_sends_it_stops_cleanly_within_5_s() {
    stops_cleanly(CTRL_SHUTDOWN);
}

#[test]
fn ctrl_c_stops_cleanly() {
    stops_cleanly(CTRL_C);
}
