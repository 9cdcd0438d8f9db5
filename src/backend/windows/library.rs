//! Run-time loading of optional system DLLs (`dxcore.dll`, `computecore.dll`, NVIDIA's
//! `nvml.dll`), so that dxdp starts on hosts (and under Wine) where they are missing.

use std::ffi::CStr;

use windows::core::{PCSTR, PCWSTR};
use windows::Win32::Foundation::{FreeLibrary, HMODULE};
use windows::Win32::System::LibraryLoader::{
    GetProcAddress, LoadLibraryExW, LOAD_LIBRARY_SEARCH_DLL_LOAD_DIR, LOAD_LIBRARY_SEARCH_SYSTEM32,
};

use super::error::WinError;
use crate::backend::winparse::wide;

/// A loaded DLL, freed on drop.
#[derive(Debug)]
pub(crate) struct Library {
    name: &'static str,
    module: HMODULE,
}

// SAFETY: an HMODULE is a process-wide handle usable from any thread.
unsafe impl Send for Library {}
// SAFETY: GetProcAddress on a loaded module is thread-safe.
unsafe impl Sync for Library {}

impl Library {
    /// Loads `name` from System32 only.
    pub(crate) fn load(name: &'static str) -> Result<Self, WinError> {
        let wide_name = wide(name);
        // SAFETY: the name is NUL-terminated UTF-16 that outlives the call.
        let module = unsafe {
            LoadLibraryExW(
                PCWSTR(wide_name.as_ptr()),
                None,
                LOAD_LIBRARY_SEARCH_SYSTEM32,
            )
        }
        .map_err(|e| WinError::hresult(format!("LoadLibraryExW({name})"), &e))?;
        Ok(Library { name, module })
    }

    /// Loads `name` from the full `path` of a vendor's directory (NVIDIA's
    /// `%ProgramFiles%\NVIDIA Corporation\NVSMI\nvml.dll`); its own dependencies are looked
    /// for in that directory and System32 only.
    pub(crate) fn load_from(path: &std::path::Path, name: &'static str) -> Result<Self, WinError> {
        let wide_path = wide(&path.to_string_lossy());
        // SAFETY: the path is NUL-terminated UTF-16 that outlives the call.
        let module = unsafe {
            LoadLibraryExW(
                PCWSTR(wide_path.as_ptr()),
                None,
                LOAD_LIBRARY_SEARCH_DLL_LOAD_DIR | LOAD_LIBRARY_SEARCH_SYSTEM32,
            )
        }
        .map_err(|e| WinError::hresult(format!("LoadLibraryExW({})", path.display()), &e))?;
        Ok(Library { name, module })
    }

    /// Loads a stand-in DLL from `path` in place of the system's `name` (tests under Wine, which
    /// has no `dxcore.dll`).
    #[cfg(test)]
    pub(crate) fn load_standin(
        path: &std::path::Path,
        name: &'static str,
    ) -> Result<Self, WinError> {
        let wide_path = wide(&path.to_string_lossy());
        // SAFETY: the path is NUL-terminated UTF-16 that outlives the call.
        let module = unsafe {
            LoadLibraryExW(
                PCWSTR(wide_path.as_ptr()),
                None,
                windows::Win32::System::LibraryLoader::LOAD_LIBRARY_FLAGS(0),
            )
        }
        .map_err(|e| WinError::hresult(format!("LoadLibraryExW({})", path.display()), &e))?;
        Ok(Library { name, module })
    }

    /// The address of an exported function.
    pub(crate) fn symbol(
        &self,
        symbol: &CStr,
    ) -> Result<unsafe extern "system" fn() -> isize, WinError> {
        // SAFETY: the module is loaded and the name is NUL-terminated.
        unsafe { GetProcAddress(self.module, PCSTR(symbol.as_ptr().cast())) }.ok_or_else(|| {
            WinError::other(
                format!("GetProcAddress({}!{})", self.name, symbol.to_string_lossy()),
                "the function is not exported (Windows too old?)",
            )
        })
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by this value and nothing obtained from it outlives it
        // (owners keep the Library alive as long as they use its functions or objects).
        let _ = unsafe { FreeLibrary(self.module) };
    }
}
