//! HCS schema versions from `computecore.dll!HcsGetServiceProperties`, loaded at run time so a
//! host without the Containers feature (or Wine) still runs dxdp and reports HCS as unavailable.

use windows::core::{HRESULT, PCWSTR, PWSTR};
use windows::Win32::Foundation::{LocalFree, HLOCAL};

use super::error::WinError;
use super::library::Library;
use crate::backend::winparse::{self, wide};

type HcsGetServiceProperties = unsafe extern "system" fn(PCWSTR, *mut PWSTR) -> HRESULT;

/// The supported HCS schema versions (highest minor per major), e.g. `["2.5"]`.
pub fn schema_versions() -> Result<Vec<String>, WinError> {
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

#[cfg(test)]
mod tests {
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
