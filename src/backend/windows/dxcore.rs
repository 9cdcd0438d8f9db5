//! DXCore: the adapter lists, each adapter's properties, attributes and driver-update state, and
//! change notifications (AdapterListStale, AdapterNoLongerValid); and, for GPU telemetry, each
//! adapter's shared system memory.
//!
//! `dxcore.dll` is loaded at run time, so dxdp starts where it is missing.

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use windows::core::{IUnknown, Interface, Ref, GUID, HRESULT};
use windows::Win32::Foundation::LUID;
use windows::Win32::Graphics::DXCore::{
    AdapterListStale, AdapterNoLongerValid, DXCoreAdapterProperty, DXCoreHardwareID,
    DXCoreNotificationType, DedicatedAdapterMemory, DriverDescription, DriverVersion, HardwareID,
    IDXCoreAdapter, IDXCoreAdapterFactory, IDXCoreAdapterList, InstanceLuid, IsDetachable,
    IsDriverUpdateInProgress, IsHardware, IsIntegrated, SharedSystemMemory,
    DXCORE_ADAPTER_ATTRIBUTE_D3D11_GRAPHICS, DXCORE_ADAPTER_ATTRIBUTE_D3D12_CORE_COMPUTE,
    DXCORE_ADAPTER_ATTRIBUTE_D3D12_GRAPHICS,
};

use super::error::WinError;
use super::library::Library;
use crate::backend::winparse::{self, PropertyRead};
use crate::backend::Wake;
use dxdp_core::facts::{AdapterFacts, AdapterProperty, Attribute, HardwareId};
use dxdp_core::telemetry::SharedMemoryLimit;

/// `DXCORE_ADAPTER_ATTRIBUTE_D3D12_GENERIC_ML` (newer SDKs only).
const D3D12_GENERIC_ML: GUID = GUID::from_u128(0xb71b0d41_1088_422f_a27c_0250b7d3a988);
/// `DXCORE_ADAPTER_ATTRIBUTE_D3D12_GENERIC_MEDIA` (newer SDKs only).
const D3D12_GENERIC_MEDIA: GUID = GUID::from_u128(0x8eb2c848_82f6_4b49_aa87_aecfcf0174c6);

const ATTRIBUTES: [(GUID, Attribute); 5] = [
    (
        DXCORE_ADAPTER_ATTRIBUTE_D3D11_GRAPHICS,
        Attribute::D3D11_GRAPHICS,
    ),
    (
        DXCORE_ADAPTER_ATTRIBUTE_D3D12_GRAPHICS,
        Attribute::D3D12_GRAPHICS,
    ),
    (
        DXCORE_ADAPTER_ATTRIBUTE_D3D12_CORE_COMPUTE,
        Attribute::D3D12_CORE_COMPUTE,
    ),
    (D3D12_GENERIC_ML, Attribute::D3D12_GENERIC_ML),
    (D3D12_GENERIC_MEDIA, Attribute::D3D12_GENERIC_MEDIA),
];

/// Set by DXCore's notification callback; taken by [`take_changed`].
static CHANGED: AtomicBool = AtomicBool::new(false);

/// Called by DXCore's notification callback to wake the daemon's refresh at once.
static WAKE: Mutex<Option<Wake>> = Mutex::new(None);

unsafe extern "system" fn on_change(
    _kind: DXCoreNotificationType,
    _object: Ref<IUnknown>,
    _context: *const c_void,
) {
    CHANGED.store(true, Ordering::SeqCst);
    // Clone out of the lock: the callback must not hold it while the daemon runs.
    let wake = WAKE.lock().ok().and_then(|w| w.clone());
    if let Some(wake) = wake {
        wake();
    }
}

/// Makes DXCore notifications call `wake`.
pub(crate) fn set_wake(wake: Wake) {
    *WAKE.lock().unwrap_or_else(|p| p.into_inner()) = Some(wake);
}

/// Whether DXCore reported a change since the last call.
pub(crate) fn take_changed() -> bool {
    CHANGED.swap(false, Ordering::SeqCst)
}

type CreateFactory = unsafe extern "system" fn(*const GUID, *mut *mut c_void) -> HRESULT;

/// The DXCore objects of one enumeration, kept alive for their notifications.
pub(crate) struct Session {
    factory: IDXCoreAdapterFactory,
    lists: Vec<IDXCoreAdapterList>,
    adapters: Vec<IDXCoreAdapter>,
    cookies: Vec<u32>,
    // Declared last: dropped after the objects that live in it.
    _library: Library,
}

// SAFETY: DXCore objects are free-threaded (agile); the session is only used behind a Mutex.
unsafe impl Send for Session {}

impl Session {
    /// Whether any adapter list went stale (the slow-poll fallback for missed notifications).
    pub(crate) fn any_stale(&self) -> bool {
        // SAFETY: live COM objects.
        self.lists.iter().any(|l| unsafe { l.IsStale() })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for cookie in self.cookies.drain(..) {
            // SAFETY: unregistering before the objects are released, as DXCore requires.
            let _ = unsafe { self.factory.UnregisterEventNotification(cookie) };
        }
        self.adapters.clear();
        self.lists.clear();
    }
}

/// Reads a fixed-size property, asking `IsPropertySupported` first so that "unsupported" is told
/// apart from a failure.
fn read<T: Copy + Default>(
    adapter: &IDXCoreAdapter,
    property: DXCoreAdapterProperty,
    name: &str,
) -> PropertyRead<T> {
    // SAFETY: live adapter.
    if !unsafe { adapter.IsPropertySupported(property) } {
        return PropertyRead::Unsupported;
    }
    let mut value = T::default();
    // SAFETY: the buffer is exactly size_of::<T>() bytes.
    match unsafe {
        adapter.GetProperty(
            property,
            std::mem::size_of::<T>(),
            (&mut value as *mut T).cast(),
        )
    } {
        Ok(()) => PropertyRead::Value(value),
        Err(e) => PropertyRead::Failed(
            WinError::hresult(format!("IDXCoreAdapter::GetProperty({name})"), &e).to_string(),
        ),
    }
}

/// A DXCore `bool` property (one byte).
fn read_bool(
    adapter: &IDXCoreAdapter,
    property: DXCoreAdapterProperty,
    name: &str,
) -> PropertyRead<bool> {
    match read::<[u8; 1]>(adapter, property, name) {
        PropertyRead::Value(bytes) => match winparse::dxcore_bool(&bytes) {
            Ok(b) => PropertyRead::Value(b),
            Err(e) => PropertyRead::Failed(format!("IDXCoreAdapter::GetProperty({name}): {e}")),
        },
        PropertyRead::Unsupported => PropertyRead::Unsupported,
        PropertyRead::Failed(e) => PropertyRead::Failed(e),
    }
}

fn description(adapter: &IDXCoreAdapter) -> PropertyRead<String> {
    // SAFETY: live adapter.
    if !unsafe { adapter.IsPropertySupported(DriverDescription) } {
        return PropertyRead::Unsupported;
    }
    // SAFETY: size query, then a buffer of that size.
    let result = unsafe { adapter.GetPropertySize(DriverDescription) }.and_then(|size| {
        let mut buf = vec![0u8; size];
        unsafe { adapter.GetProperty(DriverDescription, size, buf.as_mut_ptr().cast()) }
            .map(|()| buf)
    });
    match result {
        Ok(buf) => {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            PropertyRead::Value(String::from_utf8_lossy(&buf[..end]).trim().to_string())
        }
        Err(e) => PropertyRead::Failed(
            WinError::hresult("IDXCoreAdapter::GetProperty(DriverDescription)", &e).to_string(),
        ),
    }
}

fn adapter_facts(adapter: &IDXCoreAdapter, luid: i64) -> AdapterFacts {
    let mut errors = Vec::new();
    let mut unsupported = Vec::new();
    let hw: DXCoreHardwareID = read(adapter, HardwareID, "HardwareID")
        .record(AdapterProperty::HardwareId, &mut unsupported, &mut errors)
        .unwrap_or_default();
    let mut flag = |p, name, property| {
        read_bool(adapter, p, name)
            .record(property, &mut unsupported, &mut errors)
            .unwrap_or(false)
    };
    let is_hardware = flag(IsHardware, "IsHardware", AdapterProperty::IsHardware);
    let is_integrated = flag(IsIntegrated, "IsIntegrated", AdapterProperty::IsIntegrated);
    let is_detachable = flag(IsDetachable, "IsDetachable", AdapterProperty::IsDetachable);
    let driver_version = read::<u64>(adapter, DriverVersion, "DriverVersion")
        .record(
            AdapterProperty::DriverVersion,
            &mut unsupported,
            &mut errors,
        )
        .map(winparse::driver_version)
        .unwrap_or_default();
    let memory = read::<u64>(adapter, DedicatedAdapterMemory, "DedicatedAdapterMemory")
        .record(
            AdapterProperty::DedicatedAdapterMemory,
            &mut unsupported,
            &mut errors,
        )
        .unwrap_or(0);
    let driver_description = description(adapter)
        .record(
            AdapterProperty::DriverDescription,
            &mut unsupported,
            &mut errors,
        )
        .unwrap_or_default();
    let attributes = ATTRIBUTES
        .iter()
        // SAFETY: a valid GUID pointer for the call.
        .filter(|(guid, _)| unsafe { adapter.IsAttributeSupported(guid) })
        .map(|(_, a)| *a)
        .collect();
    let mut updating = 0u8;
    // SAFETY: a 1-byte output buffer for a bool state.
    let driver_update_in_progress =
        unsafe { adapter.IsQueryStateSupported(IsDriverUpdateInProgress) }
            && unsafe {
                adapter.QueryState(
                    IsDriverUpdateInProgress,
                    0,
                    None,
                    1,
                    (&mut updating as *mut u8).cast(),
                )
            }
            .is_ok()
            && updating != 0;
    unsupported.sort();
    AdapterFacts {
        luid,
        hardware_id: HardwareId {
            vendor_id: hw.vendorID,
            device_id: hw.deviceID,
            sub_sys_id: hw.subSysID,
            revision: hw.revision,
        },
        driver_description,
        driver_version,
        dedicated_adapter_memory: memory,
        is_hardware,
        is_integrated,
        is_detachable,
        attributes,
        driver_update_in_progress,
        driver_store_path: None,
        pnp: None,
        adapter_address: None,
        d3d12_feature_level: None,
        unsupported_properties: unsupported,
        read_errors: errors,
    }
}

/// A DXCore adapter factory from `library` (`dxcore.dll`), which must outlive it.
fn create_factory(library: &Library) -> Result<IDXCoreAdapterFactory, WinError> {
    let symbol = library.symbol(c"DXCoreCreateAdapterFactory")?;
    // SAFETY: the export has this signature (dxcore.h).
    let create: CreateFactory = unsafe {
        std::mem::transmute::<unsafe extern "system" fn() -> isize, CreateFactory>(symbol)
    };
    let mut raw = std::ptr::null_mut();
    // SAFETY: valid IID and out pointer; on success `raw` holds a factory reference we own.
    unsafe { create(&IDXCoreAdapterFactory::IID, &mut raw) }
        .ok()
        .map_err(|e| WinError::hresult("DXCoreCreateAdapterFactory", &e))?;
    // SAFETY: `raw` is an owned IDXCoreAdapterFactory pointer.
    Ok(unsafe { IDXCoreAdapterFactory::from_raw(raw) })
}

/// The adapter with `luid` and its description, from the DXCore of `library` (`dxcore.dll`, which
/// must outlive the adapter): the one enumeration that lists compute-only (MCDM) adapters, which
/// DXGI leaves out. `None` when DXCore knows no adapter with that LUID.
pub(crate) fn adapter_by_luid(
    library: &Library,
    luid: i64,
) -> Result<Option<(IDXCoreAdapter, String)>, WinError> {
    let factory = create_factory(library)?;
    let id = LUID {
        LowPart: luid as u32,
        HighPart: (luid >> 32) as i32,
    };
    // SAFETY: live factory, a LUID that outlives the call.
    match unsafe { factory.GetAdapterByLuid::<IDXCoreAdapter>(&id) } {
        Ok(adapter) => {
            let name = match description(&adapter) {
                PropertyRead::Value(name) => name,
                _ => String::new(),
            };
            Ok(Some((adapter, name)))
        }
        // DXCore answers E_INVALIDARG for a LUID it does not know.
        Err(e) if e.code() == windows::Win32::Foundation::E_INVALIDARG => Ok(None),
        Err(e) => Err(WinError::hresult(
            "IDXCoreAdapterFactory::GetAdapterByLuid",
            &e,
        )),
    }
}

/// Every adapter's DXCore `SharedSystemMemory` (the system memory the adapter may use, the
/// total of its shared segment), by LUID, for GPU telemetry. Uses DXCore objects of its own,
/// released before returning: the daemon's session (its notifications and health poll) is not
/// touched. An adapter whose property is unsupported or unreadable is left out (its shared total
/// is then unknown), with a debug log.
pub(crate) fn shared_memory_limits() -> Result<Vec<SharedMemoryLimit>, WinError> {
    let library = Library::load("dxcore.dll")?;
    let factory = create_factory(&library)?;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for (guid, attribute) in ATTRIBUTES {
        // SAFETY: live factory; an OS that does not know the attribute returns an error.
        let list = match unsafe { factory.CreateAdapterList::<IDXCoreAdapterList>(&[guid]) } {
            Ok(list) => list,
            Err(e) => {
                tracing::debug!("no DXCore list for {attribute:?}: {e}");
                continue;
            }
        };
        // SAFETY: live list.
        for index in 0..unsafe { list.GetAdapterCount() } {
            // SAFETY: index < count.
            let Ok(adapter) = (unsafe { list.GetAdapter::<IDXCoreAdapter>(index) }) else {
                continue;
            };
            let PropertyRead::Value(luid) = read::<LUID>(&adapter, InstanceLuid, "InstanceLuid")
            else {
                continue;
            };
            let luid = winparse::luid_to_i64(luid.LowPart, luid.HighPart);
            if !seen.insert(luid) {
                continue;
            }
            match read::<u64>(&adapter, SharedSystemMemory, "SharedSystemMemory") {
                PropertyRead::Value(bytes) => out.push(SharedMemoryLimit { luid, bytes }),
                PropertyRead::Unsupported => {
                    tracing::debug!(
                        "adapter LUID {}: DXCore does not support SharedSystemMemory",
                        dxdp_core::luid::label(luid)
                    )
                }
                PropertyRead::Failed(e) => {
                    tracing::debug!("adapter LUID {}: {e}", dxdp_core::luid::label(luid))
                }
            }
        }
    }
    Ok(out)
}

/// Enumerates every valid adapter of every attribute list, deduplicated by LUID, and registers
/// for change notifications.
pub(crate) fn enumerate() -> Result<(Vec<AdapterFacts>, Session), WinError> {
    let library = Library::load("dxcore.dll")?;
    let factory = create_factory(&library)?;
    let mut session = Session {
        factory,
        lists: Vec::new(),
        adapters: Vec::new(),
        cookies: Vec::new(),
        _library: library,
    };
    for (guid, attribute) in ATTRIBUTES {
        // SAFETY: live factory; an OS that does not know the attribute returns an error or an empty list.
        match unsafe {
            session
                .factory
                .CreateAdapterList::<IDXCoreAdapterList>(&[guid])
        } {
            Ok(list) => session.lists.push(list),
            Err(e) => tracing::debug!("no DXCore list for {attribute:?}: {e}"),
        }
    }
    let mut facts = Vec::new();
    let mut seen = HashSet::new();
    for list in &session.lists {
        // SAFETY: live list.
        let count = unsafe { list.GetAdapterCount() };
        for index in 0..count {
            // SAFETY: index < count.
            let adapter: IDXCoreAdapter = match unsafe { list.GetAdapter(index) } {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(
                        "{}",
                        WinError::hresult(format!("IDXCoreAdapterList::GetAdapter({index})"), &e)
                    );
                    continue;
                }
            };
            let luid = match read::<LUID>(&adapter, InstanceLuid, "InstanceLuid") {
                PropertyRead::Value(luid) => luid,
                PropertyRead::Unsupported => {
                    tracing::warn!("skipping an adapter whose DXCore InstanceLuid is unsupported");
                    continue;
                }
                PropertyRead::Failed(e) => {
                    tracing::warn!("skipping an adapter without a LUID: {e}");
                    continue;
                }
            };
            let luid = winparse::luid_to_i64(luid.LowPart, luid.HighPart);
            // An adapter DXCore already says is gone (removed, or replaced by a driver update)
            // is left out: its device then leaves the list, or stays as `removed` while a pod
            // holds it (docs/health.md). Its AdapterNoLongerValid notification woke this read.
            // SAFETY: live adapter.
            if !unsafe { adapter.IsValid() } {
                if seen.insert(luid) {
                    tracing::info!(
                        "adapter LUID {} is no longer valid (removed, or its driver is being replaced): left out",
                        dxdp_core::luid::label(luid)
                    );
                }
                continue;
            }
            if seen.insert(luid) {
                facts.push(adapter_facts(&adapter, luid));
                session.adapters.push(adapter);
            }
        }
    }
    register_notifications(&mut session);
    Ok((facts, session))
}

fn register_notifications(session: &mut Session) {
    let objects = session
        .lists
        .iter()
        .map(|l| (l.cast::<IUnknown>(), AdapterListStale))
        .chain(
            session
                .adapters
                .iter()
                .map(|a| (a.cast::<IUnknown>(), AdapterNoLongerValid)),
        );
    let mut cookies = Vec::new();
    for (object, kind) in objects {
        let Ok(object) = object else { continue };
        // SAFETY: live objects; the callback only touches a static.
        match unsafe {
            session
                .factory
                .RegisterEventNotification(&object, kind, Some(on_change), None)
        } {
            Ok(cookie) => cookies.push(cookie),
            Err(e) => tracing::debug!("DXCore notification {kind:?} unavailable: {e}"),
        }
    }
    session.cookies = cookies;
}
