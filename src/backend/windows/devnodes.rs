//! PnP device nodes of the Display and ComputeAccelerator setup classes, matched to adapters by
//! the adapter LUID property `{60B193CB-5276-4D0F-96FC-F173ABAD3EC6},2` (not windows-rs's
//! `DEVPKEY_Device_AdapterLuid`, which is the indirect-display key). No WMI.

use std::collections::HashMap;

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
pub const DISPLAY_CLASS: &str = "{4d36e968-e325-11ce-bfc1-08002be10318}";
/// Compute accelerators (MCDM).
pub const COMPUTE_ACCELERATOR_CLASS: &str = "{f01a9d53-3ff6-48d2-9f97-c8a7004be10c}";

/// `DEVPKEY_Gpu_Luid`: the adapter LUID on the device node (UINT64).
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

fn property(devinst: u32, key: &DEVPROPKEY, name: &str) -> Result<Option<Vec<u8>>, WinError> {
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
        return Ok(Some(buf));
    }
    Err(WinError::other(
        format!("CM_Get_DevNode_PropertyW({name})"),
        "the value kept growing",
    ))
}

fn string(bytes: Option<Vec<u8>>) -> Option<String> {
    bytes
        .map(|b| winparse::utf16_to_string(&winparse::u16s_from_bytes(&b)))
        .filter(|s| !s.is_empty())
}

/// The device node of one instance ID, if it is a DirectX adapter (has a LUID).
fn node(instance_id: &str, errors: &mut Vec<String>) -> Result<Option<(i64, PnpFacts)>, WinError> {
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
    let Some(luid) = property(devinst, &DEVPKEY_GPU_LUID, "DEVPKEY_Gpu_Luid")?
        .and_then(|b| winparse::u64_le(&b))
    else {
        return Ok(None);
    };
    let mut optional = |key: &DEVPROPKEY, name: &str| match property(devinst, key, name) {
        Ok(v) => v,
        Err(e) => {
            errors.push(format!("{instance_id}: {e}"));
            None
        }
    };
    let description = string(optional(
        &DEVPKEY_Device_DeviceDesc,
        "DEVPKEY_Device_DeviceDesc",
    ));
    let manufacturer = string(optional(
        &DEVPKEY_Device_Manufacturer,
        "DEVPKEY_Device_Manufacturer",
    ));
    let location_paths = optional(
        &DEVPKEY_Device_LocationPaths,
        "DEVPKEY_Device_LocationPaths",
    )
    .map(|b| winparse::parse_multi_sz(&winparse::u16s_from_bytes(&b)))
    .unwrap_or_default();
    let driver_key = string(optional(&DEVPKEY_Device_Driver, "DEVPKEY_Device_Driver"));
    let pci = winparse::pci_location(
        instance_id,
        optional(&DEVPKEY_Device_BusNumber, "DEVPKEY_Device_BusNumber").as_deref(),
        optional(&DEVPKEY_Device_Address, "DEVPKEY_Device_Address").as_deref(),
    );
    let mut status = CM_DEVNODE_STATUS_FLAGS(0);
    let mut problem = CM_PROB(0);
    // SAFETY: valid out pointers and device instance.
    let cr = unsafe { CM_Get_DevNode_Status(&mut status, &mut problem, devinst, 0) };
    if cr != CR_SUCCESS {
        errors.push(format!(
            "{instance_id}: {}",
            WinError::configret("CM_Get_DevNode_Status", cr.0)
        ));
    }
    Ok(Some((
        luid as i64,
        PnpFacts {
            instance_id: instance_id.to_string(),
            description,
            manufacturer,
            location_paths,
            driver_key,
            problem_code: problem.0,
            pci,
        },
    )))
}

/// Device nodes by adapter LUID, and what could not be read (never fails as a whole).
pub fn enumerate() -> (HashMap<i64, PnpFacts>, Vec<String>) {
    let mut nodes = HashMap::new();
    let mut errors = Vec::new();
    for class in [DISPLAY_CLASS, COMPUTE_ACCELERATOR_CLASS] {
        let ids = match device_ids(class) {
            Ok(ids) => ids,
            Err(e) => {
                errors.push(e.to_string());
                continue;
            }
        };
        for id in ids {
            match node(&id, &mut errors) {
                Ok(Some((luid, pnp))) => {
                    nodes.entry(luid).or_insert(pnp);
                }
                Ok(None) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
    }
    (nodes, errors)
}
