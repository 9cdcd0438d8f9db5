//! PnP device nodes of the Display and ComputeAccelerator setup classes, each with the adapter
//! LUID property `{60B193CB-5276-4D0F-96FC-F173ABAD3EC6},2` recorded as found (not windows-rs's
//! `DEVPKEY_Device_AdapterLuid`, which is the indirect-display key). Matching nodes to adapters is
//! the pipeline's ([`dxdp_core::pipeline::matching`]). No WMI.

use windows::core::{GUID, PCWSTR};
use windows::Win32::Devices::DeviceAndDriverInstallation::{
    CM_Get_DevNode_PropertyW, CM_Get_DevNode_Status, CM_Get_Device_ID_ListW,
    CM_Get_Device_ID_List_SizeW, CM_Locate_DevNodeW, CM_DEVNODE_STATUS_FLAGS,
    CM_GETIDLIST_FILTER_CLASS, CM_GETIDLIST_FILTER_PRESENT, CM_LOCATE_DEVNODE_NORMAL, CM_PROB,
    CR_BUFFER_SMALL, CR_NO_SUCH_VALUE, CR_SUCCESS,
};
use windows::Win32::Devices::Properties::{
    DEVPKEY_Device_Address, DEVPKEY_Device_BusNumber, DEVPKEY_Device_DeviceDesc,
    DEVPKEY_Device_Driver, DEVPKEY_Device_LocationPaths, DEVPKEY_Device_Manufacturer, DEVPROPTYPE,
};
use windows::Win32::Foundation::DEVPROPKEY;

use super::error::WinError;
use crate::backend::winparse::{self, wide};
use dxdp_core::facts::PnpFacts;

/// Display adapters (WDDM).
pub(crate) const DISPLAY_CLASS: &str = "{4d36e968-e325-11ce-bfc1-08002be10318}";
/// Compute accelerators (MCDM).
pub(crate) const COMPUTE_ACCELERATOR_CLASS: &str = "{f01a9d53-3ff6-48d2-9f97-c8a7004be10c}";

/// `DEVPKEY_Gpu_Luid`: the adapter LUID on the device node (documented drivers: UINT64).
const DEVPKEY_GPU_LUID: DEVPROPKEY = DEVPROPKEY {
    fmtid: GUID::from_u128(0x60b193cb_5276_4d0f_96fc_f173abad3ec6),
    pid: 2,
};

fn device_ids(class: &str) -> Result<Vec<String>, WinError> {
    let filter = wide(class);
    let flags = CM_GETIDLIST_FILTER_CLASS | CM_GETIDLIST_FILTER_PRESENT;
    for _ in 0..5 {
        let mut len = 0u32;
        // SAFETY: valid filter and out pointer.
        let cr = unsafe { CM_Get_Device_ID_List_SizeW(&mut len, PCWSTR(filter.as_ptr()), flags) };
        if cr != CR_SUCCESS {
            return Err(WinError::configret(
                format!("CM_Get_Device_ID_List_SizeW({class})"),
                cr.0,
            ));
        }
        let mut buf = vec![0u16; len as usize + 1];
        // SAFETY: the buffer length is passed with the slice.
        let cr = unsafe { CM_Get_Device_ID_ListW(PCWSTR(filter.as_ptr()), &mut buf, flags) };
        if cr == CR_BUFFER_SMALL {
            continue; // a device arrived in between
        }
        if cr != CR_SUCCESS {
            return Err(WinError::configret(
                format!("CM_Get_Device_ID_ListW({class})"),
                cr.0,
            ));
        }
        return Ok(winparse::parse_multi_sz(&buf));
    }
    Err(WinError::other(
        format!("CM_Get_Device_ID_ListW({class})"),
        "the list kept growing",
    ))
}

/// A property's `DEVPROPTYPE` and bytes, or `None` when the device node does not have it.
fn raw_property(
    devinst: u32,
    key: &DEVPROPKEY,
    name: &str,
) -> Result<Option<(u32, Vec<u8>)>, WinError> {
    let mut kind = DEVPROPTYPE(0);
    let mut size = 0u32;
    for _ in 0..5 {
        let mut buf = vec![0u8; size as usize];
        let ptr = if buf.is_empty() {
            None
        } else {
            Some(buf.as_mut_ptr())
        };
        // SAFETY: `size` is the buffer length (0 with no buffer, to ask for the size).
        let cr = unsafe { CM_Get_DevNode_PropertyW(devinst, key, &mut kind, ptr, &mut size, 0) };
        if cr == CR_NO_SUCH_VALUE {
            return Ok(None);
        }
        if cr == CR_BUFFER_SMALL {
            continue;
        }
        if cr != CR_SUCCESS {
            return Err(WinError::configret(
                format!("CM_Get_DevNode_PropertyW({name})"),
                cr.0,
            ));
        }
        buf.truncate(size as usize);
        return Ok(Some((kind.0, buf)));
    }
    Err(WinError::other(
        format!("CM_Get_DevNode_PropertyW({name})"),
        "the value kept growing",
    ))
}

/// A property decoded by `decode` after its type is checked (see [`winparse`]'s `devprop_*`).
/// Other code that reads device properties (e.g. PCI bus numbers) should use this too.
pub(super) fn typed_property<T>(
    devinst: u32,
    key: &DEVPROPKEY,
    name: &str,
    decode: fn(u32, &[u8]) -> Result<T, String>,
) -> Result<Option<T>, WinError> {
    let Some((kind, bytes)) = raw_property(devinst, key, name)? else {
        return Ok(None);
    };
    decode(kind, &bytes)
        .map(Some)
        .map_err(|why| WinError::other(format!("CM_Get_DevNode_PropertyW({name})"), why))
}

/// The value of an optional property; a failure is recorded against the device node.
fn keep<T>(
    result: Result<Option<T>, WinError>,
    instance_id: &str,
    errors: &mut Vec<String>,
) -> Option<T> {
    match result {
        Ok(v) => v,
        Err(e) => {
            errors.push(format!("device node {instance_id}: {e}"));
            None
        }
    }
}

/// The device node of one instance ID, with what could not be read from it (in `read_errors`).
/// An error means the node could not be located at all.
fn node(instance_id: &str) -> Result<PnpFacts, WinError> {
    let id = wide(instance_id);
    let mut devinst = 0u32;
    // SAFETY: valid instance ID and out pointer.
    let cr =
        unsafe { CM_Locate_DevNodeW(&mut devinst, PCWSTR(id.as_ptr()), CM_LOCATE_DEVNODE_NORMAL) };
    if cr != CR_SUCCESS {
        return Err(WinError::configret(
            format!("CM_Locate_DevNodeW({instance_id})"),
            cr.0,
        ));
    }
    let mut errors = Vec::new();
    // Any type, as found: the pipeline decides whether it is a usable LUID.
    let adapter_luid = keep(
        raw_property(devinst, &DEVPKEY_GPU_LUID, "DEVPKEY_Gpu_Luid"),
        instance_id,
        &mut errors,
    )
    .map(|(kind, bytes)| winparse::raw_device_property(kind, &bytes));
    let string = |key, name| typed_property(devinst, key, name, winparse::devprop_string);
    let description = keep(
        string(&DEVPKEY_Device_DeviceDesc, "DEVPKEY_Device_DeviceDesc"),
        instance_id,
        &mut errors,
    )
    .flatten();
    let manufacturer = keep(
        string(&DEVPKEY_Device_Manufacturer, "DEVPKEY_Device_Manufacturer"),
        instance_id,
        &mut errors,
    )
    .flatten();
    let driver_key = keep(
        string(&DEVPKEY_Device_Driver, "DEVPKEY_Device_Driver"),
        instance_id,
        &mut errors,
    )
    .flatten();
    let location_paths = keep(
        typed_property(
            devinst,
            &DEVPKEY_Device_LocationPaths,
            "DEVPKEY_Device_LocationPaths",
            winparse::devprop_string_list,
        ),
        instance_id,
        &mut errors,
    )
    .unwrap_or_default();
    // PCI bus number (UINT32) and address (INT32 or UINT32, 0xFFFFFFFF for none), type-checked,
    // then located by `pci_location`.
    let bus = keep(
        typed_property(
            devinst,
            &DEVPKEY_Device_BusNumber,
            "DEVPKEY_Device_BusNumber",
            winparse::devprop_u32,
        ),
        instance_id,
        &mut errors,
    );
    let address = keep(
        typed_property(
            devinst,
            &DEVPKEY_Device_Address,
            "DEVPKEY_Device_Address",
            winparse::devprop_address,
        ),
        instance_id,
        &mut errors,
    )
    .flatten();
    let pci = winparse::pci_location(instance_id, bus, address);
    let mut flags = CM_DEVNODE_STATUS_FLAGS(0);
    let mut problem = CM_PROB(0);
    // SAFETY: valid out pointers and device instance.
    let cr = unsafe { CM_Get_DevNode_Status(&mut flags, &mut problem, devinst, 0) };
    // A failed call is recorded in `status_error` (the pipeline makes the device unhealthy).
    let status = winparse::devnode_status(cr.0, flags.0, problem.0);
    Ok(PnpFacts {
        instance_id: instance_id.to_string(),
        description,
        manufacturer,
        location_paths,
        driver_key,
        problem_code: status.problem_code,
        pci,
        status_flags: status.status_flags,
        status_error: status.status_error,
        adapter_luid,
        read_errors: errors,
    })
}

/// The device nodes of the DirectX classes, and what could not be read.
#[derive(Default)]
pub(crate) struct Enumeration {
    /// Every present device node of the two classes, each with its own read errors.
    pub(crate) nodes: Vec<PnpFacts>,
    /// Device lists that could not be read: any adapter without a node may be missing from them.
    pub(crate) list_errors: Vec<String>,
    /// Device nodes that could not be located, so they belong to no known adapter.
    pub(crate) unmatched_errors: Vec<String>,
}

/// The device nodes, and what could not be read (never fails as a whole). Errors stay with the
/// node they concern; only list failures concern every unmatched adapter.
pub(crate) fn enumerate() -> Enumeration {
    let mut out = Enumeration::default();
    for class in [DISPLAY_CLASS, COMPUTE_ACCELERATOR_CLASS] {
        let ids = match device_ids(class) {
            Ok(ids) => ids,
            Err(e) => {
                out.list_errors.push(e.to_string());
                continue;
            }
        };
        for id in ids {
            match node(&id) {
                Ok(node) => out.nodes.push(node),
                Err(e) => out.unmatched_errors.push(e.to_string()),
            }
        }
    }
    out
}
