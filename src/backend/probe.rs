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
