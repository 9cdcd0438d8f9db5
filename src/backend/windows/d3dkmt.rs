//! Two facts of an adapter from the graphics kernel, by LUID: its driver store path
//! (`D3DKMTQueryAdapterInfo(KMTQAITYPE_QUERYREGISTRY, D3DDDI_QUERYREGISTRY_DRIVERSTOREPATH)`,
//! growing the buffer on overflow; the request and response bytes are built and parsed by
//! `winparse`, which is tested everywhere) and its PCI location
//! (`KMTQAITYPE_ADAPTERADDRESS`), which matches it to its device node when no node reports the
//! LUID.

use windows::Wdk::Graphics::Direct3D::{
    D3DKMTCloseAdapter, D3DKMTOpenAdapterFromLuid, D3DKMTQueryAdapterInfo, D3DKMT_ADAPTERADDRESS,
    D3DKMT_CLOSEADAPTER, D3DKMT_OPENADAPTERFROMLUID, D3DKMT_QUERYADAPTERINFO,
    KMTQAITYPE_ADAPTERADDRESS, KMTQAITYPE_QUERYREGISTRY,
};
use windows::Win32::Foundation::LUID;

use super::error::WinError;
use crate::backend::winparse::{self, query_registry, QueryRegistry};
use dxdp_core::facts::PciLocation;

/// An open D3DKMT adapter handle, closed on drop.
pub(crate) struct Adapter(u32);

impl Drop for Adapter {
    fn drop(&mut self) {
        // SAFETY: the handle was opened by D3DKMTOpenAdapterFromLuid and is closed once.
        let _ = unsafe { D3DKMTCloseAdapter(&D3DKMT_CLOSEADAPTER { hAdapter: self.0 }) };
    }
}

impl Adapter {
    /// Opens the adapter with this LUID.
    pub(crate) fn open(luid: i64) -> Result<Adapter, WinError> {
        let (low, high) = winparse::luid_from_i64(luid);
        let mut open = D3DKMT_OPENADAPTERFROMLUID {
            AdapterLuid: LUID {
                LowPart: low,
                HighPart: high,
            },
            hAdapter: 0,
        };
        // SAFETY: valid in/out struct.
        let status = unsafe { D3DKMTOpenAdapterFromLuid(&mut open) };
        if status.0 < 0 {
            return Err(WinError::ntstatus("D3DKMTOpenAdapterFromLuid", status.0));
        }
        Ok(Adapter(open.hAdapter))
    }
}

/// The adapter's PCI bus, device and function as the graphics kernel reports them.
pub(crate) fn adapter_address(adapter: &Adapter) -> Result<PciLocation, WinError> {
    let mut address = D3DKMT_ADAPTERADDRESS::default();
    let mut query = D3DKMT_QUERYADAPTERINFO {
        hAdapter: adapter.0,
        Type: KMTQAITYPE_ADAPTERADDRESS,
        pPrivateDriverData: (&mut address as *mut D3DKMT_ADAPTERADDRESS).cast(),
        PrivateDriverDataSize: std::mem::size_of::<D3DKMT_ADAPTERADDRESS>() as u32,
    };
    // SAFETY: the private data points at a D3DKMT_ADAPTERADDRESS of the size passed.
    let status = unsafe { D3DKMTQueryAdapterInfo(&mut query) };
    if status.0 < 0 {
        return Err(WinError::ntstatus(
            "D3DKMTQueryAdapterInfo(ADAPTERADDRESS)",
            status.0,
        ));
    }
    Ok(PciLocation {
        bus: address.BusNumber,
        device: address.DeviceNumber,
        function: address.FunctionNumber,
    })
}

/// The driver store path as reported (`\SystemRoot\System32\DriverStore\FileRepository\...`).
pub(crate) fn driver_store_path(adapter: &Adapter) -> Result<String, WinError> {
    let mut extra = 520usize;
    for _ in 0..6 {
        let mut buf = winparse::driver_store_query(extra);
        let size = query_registry::SIZE + extra;
        let mut query = D3DKMT_QUERYADAPTERINFO {
            hAdapter: adapter.0,
            Type: KMTQAITYPE_QUERYREGISTRY,
            pPrivateDriverData: buf.as_mut_ptr().cast(),
            PrivateDriverDataSize: size as u32,
        };
        // SAFETY: the private data buffer is `size` bytes (or more) and 8-byte aligned.
        let status = unsafe { D3DKMTQueryAdapterInfo(&mut query) };
        if status.0 < 0 {
            return Err(WinError::ntstatus(
                "D3DKMTQueryAdapterInfo(QUERYREGISTRY, DRIVERSTOREPATH)",
                status.0,
            ));
        }
        // SAFETY: viewing the u64 buffer as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len() * 8) };
        match winparse::parse_query_registry(&bytes[..size]) {
            QueryRegistry::Value(path) => return Ok(path),
            QueryRegistry::Overflow { needed } => extra = needed as usize + 8,
            QueryRegistry::Fail => {
                return Err(WinError::other(
                    "D3DKMTQueryAdapterInfo(DRIVERSTOREPATH)",
                    "the driver reported STATUS_FAIL",
                ))
            }
            QueryRegistry::Unknown(s) => {
                return Err(WinError::other(
                    "D3DKMTQueryAdapterInfo(DRIVERSTOREPATH)",
                    format!("unknown status {s}"),
                ))
            }
        }
    }
    Err(WinError::other(
        "D3DKMTQueryAdapterInfo(DRIVERSTOREPATH)",
        "the buffer kept overflowing",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use windows::Wdk::Graphics::Direct3D::D3DDDI_QUERYREGISTRY_INFO;

    #[test]
    fn the_adapter_address_is_three_u32s() {
        assert_eq!(std::mem::size_of::<D3DKMT_ADAPTERADDRESS>(), 12);
    }

    #[test]
    fn the_recorded_layout_matches_the_windows_struct() {
        assert_eq!(
            std::mem::size_of::<D3DDDI_QUERYREGISTRY_INFO>(),
            query_registry::SIZE
        );
        assert_eq!(
            std::mem::offset_of!(D3DDDI_QUERYREGISTRY_INFO, OutputValueSize),
            query_registry::OUTPUT_VALUE_SIZE
        );
        assert_eq!(
            std::mem::offset_of!(D3DDDI_QUERYREGISTRY_INFO, Status),
            query_registry::STATUS
        );
        assert_eq!(
            std::mem::offset_of!(D3DDDI_QUERYREGISTRY_INFO, Anonymous),
            query_registry::OUTPUT
        );
    }
}
