//! HCS (`computecore.dll`, loaded at run time so a host without the Containers feature, or Wine,
//! still runs dxdp and reports HCS as unavailable): the schema versions
//! (`HcsGetServiceProperties`), and the running containers with their process IDs
//! (`HcsEnumerateComputeSystems`, then `HcsOpenComputeSystem` +
//! `HcsGetComputeSystemProperties(ProcessList)` per container), for per-pod GPU attribution.
//!
//! Thin: the JSON documents are parsed by `winparse::hcs_*`, tested on every target. Every
//! operation is waited for with `HcsWaitForOperationResult` and a timeout, and no wait starts
//! after the listing's deadline (`HcsOpenComputeSystem` and `HcsCloseComputeSystem` are
//! synchronous and have no timeout: the sampler bounds a whole listing and never runs two);
//! result documents are released with `LocalFree`, operations with `HcsCloseOperation` and
//! compute systems with `HcsCloseComputeSystem`, as documented.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use windows::core::{HRESULT, PCWSTR, PWSTR};
use windows::Win32::Foundation::{LocalFree, HLOCAL};

use dxdp_core::telemetry::ContainerProcesses;

use super::error::WinError;
use super::library::Library;
use crate::backend::counters::{ContainerListing, ContainerSource};
use crate::backend::winparse::{self, wide};

type HcsGetServiceProperties = unsafe extern "system" fn(PCWSTR, *mut PWSTR) -> HRESULT;

/// The supported HCS schema versions (highest minor per major), e.g. `["2.5"]`.
pub(crate) fn schema_versions() -> Result<Vec<String>, WinError> {
    let lib = Library::load("computecore.dll")?;
    let symbol = lib.symbol(c"HcsGetServiceProperties")?;
    // SAFETY: the export has this signature (computecore.h), and `lib` outlives the call.
    let get: HcsGetServiceProperties = unsafe {
        std::mem::transmute::<unsafe extern "system" fn() -> isize, HcsGetServiceProperties>(symbol)
    };
    let query = wide(winparse::HCS_BASIC_QUERY);
    let mut result = PWSTR::null();
    // SAFETY: valid query string and out pointer.
    let hr = unsafe { get(PCWSTR(query.as_ptr()), &mut result) };
    let text = if result.is_null() {
        String::new()
    } else {
        // SAFETY: HCS returns a NUL-terminated string that we own until LocalFree.
        let text = unsafe { result.to_string() }.unwrap_or_default();
        // SAFETY: the result was allocated by HCS with LocalAlloc.
        let _ = unsafe { LocalFree(Some(HLOCAL(result.0.cast()))) };
        text
    };
    if hr.is_err() {
        return Err(WinError::other(
            "HcsGetServiceProperties",
            format!("HRESULT 0x{:08X} {text}", hr.0 as u32),
        ));
    }
    winparse::hcs_schema_versions(&text).map_err(|e| WinError::other("HcsGetServiceProperties", e))
}

/// `HCS_OPERATION`, `HCS_SYSTEM`: opaque handles.
type Handle = *mut c_void;

type CreateOperation = unsafe extern "system" fn(*const c_void, *const c_void) -> Handle;
type CloseOperation = unsafe extern "system" fn(Handle);
type EnumerateComputeSystems = unsafe extern "system" fn(PCWSTR, Handle) -> HRESULT;
type WaitForOperationResult = unsafe extern "system" fn(Handle, u32, *mut PWSTR) -> HRESULT;
type OpenComputeSystem = unsafe extern "system" fn(PCWSTR, u32, *mut Handle) -> HRESULT;
type GetComputeSystemProperties = unsafe extern "system" fn(Handle, Handle, PCWSTR) -> HRESULT;
type CloseComputeSystem = unsafe extern "system" fn(Handle);

/// `GENERIC_ALL`: the access `HcsOpenComputeSystem` requires.
const GENERIC_ALL: u32 = 0x1000_0000;
/// `HCS_E_OPERATION_TIMEOUT`.
const HCS_E_OPERATION_TIMEOUT: u32 = 0x8037_0118;
/// The longest wait for one HCS operation.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a whole listing (every container's processes) may take; below the sampler's own
/// 30 s limit, so that a slow HCS is reported by dxdp, not left running behind it.
pub(crate) const LIST_DEADLINE: Duration = Duration::from_secs(20);

/// Transmutes an export to its signature.
///
/// # Safety
/// `T` must be the export's real signature.
unsafe fn cast<T: Copy>(f: unsafe extern "system" fn() -> isize) -> T {
    // SAFETY: the caller names the real signature; fn pointers have the same size.
    unsafe { std::mem::transmute_copy(&f) }
}

/// The HCS functions dxdp calls to list containers and their processes.
pub(crate) struct Hcs {
    create_operation: CreateOperation,
    close_operation: CloseOperation,
    enumerate: EnumerateComputeSystems,
    wait: WaitForOperationResult,
    open: OpenComputeSystem,
    properties: GetComputeSystemProperties,
    close_system: CloseComputeSystem,
    // Keeps computecore.dll loaded while the functions are used; dropped last.
    _library: Library,
}

/// An operation, closed on drop.
struct Operation<'a> {
    hcs: &'a Hcs,
    handle: Handle,
}

impl Drop for Operation<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from HcsCreateOperation and is closed once.
        unsafe { (self.hcs.close_operation)(self.handle) };
    }
}

/// A compute system, closed on drop.
struct System<'a> {
    hcs: &'a Hcs,
    handle: Handle,
}

impl Drop for System<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle came from HcsOpenComputeSystem and is closed once.
        unsafe { (self.hcs.close_system)(self.handle) };
    }
}

/// The time left before `deadline`, at most `CALL_TIMEOUT`; `None` when it has passed.
fn budget(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then(|| left.min(CALL_TIMEOUT))
}

impl Hcs {
    /// Loads `computecore.dll` and its functions. Fails, naming the DLL or function, where HCS
    /// is absent (no Containers feature, Wine) or too old.
    pub(crate) fn load() -> Result<Self, WinError> {
        let library = Library::load("computecore.dll")?;
        // SAFETY: the signatures are those of computecore.h.
        unsafe {
            Ok(Hcs {
                create_operation: cast(library.symbol(c"HcsCreateOperation")?),
                close_operation: cast(library.symbol(c"HcsCloseOperation")?),
                enumerate: cast(library.symbol(c"HcsEnumerateComputeSystems")?),
                wait: cast(library.symbol(c"HcsWaitForOperationResult")?),
                open: cast(library.symbol(c"HcsOpenComputeSystem")?),
                properties: cast(library.symbol(c"HcsGetComputeSystemProperties")?),
                close_system: cast(library.symbol(c"HcsCloseComputeSystem")?),
                _library: library,
            })
        }
    }

    fn operation(&self) -> Result<Operation<'_>, WinError> {
        // SAFETY: no context and no callback: the result is waited for.
        let handle = unsafe { (self.create_operation)(std::ptr::null(), std::ptr::null()) };
        if handle.is_null() {
            return Err(WinError::other(
                "HcsCreateOperation",
                "no operation (out of resources)",
            ));
        }
        Ok(Operation { hcs: self, handle })
    }

    /// Waits at most `timeout` for `op` and returns its result document. The document is
    /// released here (`LocalFree`), success or not.
    fn wait(&self, op: &Operation<'_>, api: &str, timeout: Duration) -> Result<String, WinError> {
        let ms = u32::try_from(timeout.as_millis())
            .unwrap_or(u32::MAX - 1)
            .clamp(1, u32::MAX - 1);
        let mut result = PWSTR::null();
        // SAFETY: a started operation and a valid out pointer.
        let hr = unsafe { (self.wait)(op.handle, ms, &mut result) };
        let text = if result.is_null() {
            String::new()
        } else {
            // SAFETY: HCS returns a NUL-terminated string that we own until LocalFree.
            let text = unsafe { result.to_string() }.unwrap_or_default();
            // SAFETY: the result was allocated by HCS with LocalAlloc.
            let _ = unsafe { LocalFree(Some(HLOCAL(result.0.cast()))) };
            text
        };
        if hr.0 as u32 == HCS_E_OPERATION_TIMEOUT {
            return Err(WinError::other(
                api,
                format!("no answer within {timeout:?} (HCS_E_OPERATION_TIMEOUT)"),
            ));
        }
        if hr.is_err() {
            return Err(WinError::other(
                api,
                format!("HRESULT 0x{:08X} {text}", hr.0 as u32),
            ));
        }
        Ok(text)
    }

    /// The IDs of the running containers, waiting at most `timeout`.
    pub(crate) fn running_containers(&self, timeout: Duration) -> Result<Vec<String>, WinError> {
        let api = "HcsEnumerateComputeSystems";
        let op = self.operation()?;
        let query = wide(winparse::HCS_CONTAINERS_QUERY);
        // SAFETY: a valid query string and operation.
        let hr = unsafe { (self.enumerate)(PCWSTR(query.as_ptr()), op.handle) };
        if hr.is_err() {
            return Err(WinError::other(
                api,
                format!("HRESULT 0x{:08X}", hr.0 as u32),
            ));
        }
        let text = self.wait(&op, api, timeout)?;
        winparse::hcs_running_containers(&text).map_err(|e| WinError::other(api, e))
    }

    /// The process IDs of the container `id`, waiting at most `timeout` for each call.
    pub(crate) fn process_ids(&self, id: &str, timeout: Duration) -> Result<Vec<u32>, WinError> {
        let api = format!("HcsGetComputeSystemProperties({id}, ProcessList)");
        let wide_id = wide(id);
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: a valid ID string and out pointer; GENERIC_ALL as documented.
        let hr = unsafe { (self.open)(PCWSTR(wide_id.as_ptr()), GENERIC_ALL, &mut handle) };
        if hr.is_err() || handle.is_null() {
            return Err(WinError::other(
                format!("HcsOpenComputeSystem({id})"),
                format!("HRESULT 0x{:08X}", hr.0 as u32),
            ));
        }
        let system = System { hcs: self, handle };
        let op = self.operation()?;
        let query = wide(winparse::HCS_PROCESS_LIST_QUERY);
        // SAFETY: an open compute system, a valid operation and query string.
        let hr = unsafe { (self.properties)(system.handle, op.handle, PCWSTR(query.as_ptr())) };
        if hr.is_err() {
            return Err(WinError::other(
                api,
                format!("HRESULT 0x{:08X}", hr.0 as u32),
            ));
        }
        let text = self.wait(&op, &api, timeout)?;
        // The operation is closed before the compute system it used.
        drop(op);
        drop(system);
        winparse::hcs_process_ids(&text).map_err(|e| WinError::other(api, e))
    }

    /// Every running container with its process IDs, within [`LIST_DEADLINE`]. A container that
    /// cannot be queried (it may have stopped since the enumeration) is listed as unreadable,
    /// with why; when none of several can be, the first error is returned.
    pub(crate) fn containers(&self) -> Result<ContainerListing, WinError> {
        let deadline = Instant::now() + LIST_DEADLINE;
        let late = || {
            WinError::other(
                "HCS",
                format!("the containers' process lists took longer than {LIST_DEADLINE:?}"),
            )
        };
        let ids = self.running_containers(budget(deadline).ok_or_else(late)?)?;
        let mut out = ContainerListing::default();
        let mut first_error = None;
        for id in ids.iter() {
            let timeout = budget(deadline).ok_or_else(late)?;
            match self.process_ids(id, timeout) {
                Ok(pids) => out.containers.push(ContainerProcesses {
                    id: id.clone(),
                    pids,
                    pod: None,
                }),
                Err(e) => {
                    out.unreadable.push((id.clone(), e.to_string()));
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if out.containers.is_empty() => Err(e),
            _ => Ok(out),
        }
    }
}

/// The containers' process lists from HCS.
pub(crate) struct HcsContainers {
    hcs: Hcs,
}

impl HcsContainers {
    /// Loads HCS. Fails where it is absent, saying so.
    pub(crate) fn open() -> Result<Self, WinError> {
        Hcs::load()
            .map(|hcs| HcsContainers { hcs })
            .map_err(|e| WinError {
                status: format!(
                    "{} (HCS is missing: the Windows Containers feature is not installed, or this is not Windows)",
                    e.status
                ),
                ..e
            })
    }
}

impl ContainerSource for HcsContainers {
    fn describe(&self) -> String {
        "HCS (computecore.dll)".into()
    }

    fn list(&self) -> Result<ContainerListing, String> {
        self.hcs.containers().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_containers_processes_are_listed_or_the_absence_of_hcs_is_said() {
        // Wine has no computecore.dll: opening fails naming the DLL and saying HCS is missing,
        // and the test is skipped with that reason. On a Windows host with the Containers
        // feature it lists the running containers (none is fine).
        match super::HcsContainers::open() {
            Ok(hcs) => match crate::backend::counters::ContainerSource::list(&hcs) {
                Ok(listing) => assert!(listing.containers.iter().all(|c| !c.id.is_empty())),
                // Not an administrator: HCS refuses, and says which call failed.
                Err(e) => {
                    assert!(e.contains("Hcs"), "{e}");
                    eprintln!("skipped the_containers_processes_are_listed_or_the_absence_of_hcs_is_said: HCS refused to list the containers (not an administrator): {e}");
                }
            },
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("computecore.dll") && e.contains("HCS is missing"),
                    "{e}"
                );
                eprintln!("skipped the_containers_processes_are_listed_or_the_absence_of_hcs_is_said: the containers' process lists need HCS: {e}");
            }
        }
    }

    #[test]
    fn a_missing_computecore_is_reported_not_fatal() {
        // Wine has no computecore.dll; on a Windows host with Containers this returns versions.
        match super::schema_versions() {
            Ok(versions) => assert!(versions.iter().all(|v| v.contains('.'))),
            Err(e) => assert!(
                e.to_string().contains("computecore.dll") || e.to_string().contains("Hcs"),
                "{e}"
            ),
        }
    }
}
