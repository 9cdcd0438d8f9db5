//! Errors from Windows APIs, naming the API and its status code.

use std::fmt;

/// A failed Windows API call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WinError {
    /// The API, e.g. `CM_Get_DevNode_PropertyW(DEVPKEY_Device_LocationPaths)`.
    pub(crate) api: String,
    /// The status, e.g. `HRESULT 0x887A0004`, `CONFIGRET 26`, `NTSTATUS 0xC0000001`.
    pub(crate) status: String,
}

impl WinError {
    /// An error from an `HRESULT`.
    pub(crate) fn hresult(api: impl Into<String>, error: &windows::core::Error) -> Self {
        WinError {
            api: api.into(),
            status: format!(
                "HRESULT 0x{:08X} ({})",
                error.code().0 as u32,
                error.message().trim()
            ),
        }
    }

    /// An error from a `CONFIGRET`.
    pub(crate) fn configret(api: impl Into<String>, code: u32) -> Self {
        WinError {
            api: api.into(),
            status: format!("CONFIGRET {code}"),
        }
    }

    /// An error from an `NTSTATUS`.
    pub(crate) fn ntstatus(api: impl Into<String>, code: i32) -> Self {
        WinError {
            api: api.into(),
            status: format!("NTSTATUS 0x{:08X}", code as u32),
        }
    }

    /// An error from a Win32 error code.
    pub(crate) fn win32(api: impl Into<String>, code: u32) -> Self {
        WinError {
            api: api.into(),
            status: format!("Win32 error {code}"),
        }
    }

    /// Any other failure.
    pub(crate) fn other(api: impl Into<String>, status: impl Into<String>) -> Self {
        WinError {
            api: api.into(),
            status: status.into(),
        }
    }
}

impl fmt::Display for WinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.api, self.status)
    }
}

impl std::error::Error for WinError {}
