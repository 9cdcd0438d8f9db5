//! `dxdp validate`'s probes, thin FFI: the adapters DXGI lists, a D3D12 round trip on one
//! adapter (found through DXCore, DXGI where DXCore is missing), a DLL load with its dependencies, and the vendor APIs through their documented entry
//! points. Every DLL is loaded at run time (`dxgi.dll` and `d3d12.dll` too), so dxdp starts
//! where they are missing; vendor DLLs are never unloaded (an unload can hang or crash, and a
//! probe that timed out may still be inside one). What the answers mean is judged in
//! `dxdp_core::validation`.

use std::ffi::{c_void, CStr};
use std::path::Path;
use std::time::{Duration, Instant};

use windows::core::{Interface, GUID, HRESULT, PCSTR, PCWSTR};
use windows::Win32::Foundation::HMODULE;
use windows::Win32::Graphics::DXCore::IDXCoreAdapter;
use windows::Win32::Graphics::Direct3D::D3D_FEATURE_LEVEL;
use windows::Win32::Graphics::Direct3D12::{
    ID3D12CommandAllocator, ID3D12CommandList, ID3D12CommandQueue, ID3D12Device, ID3D12Fence,
    ID3D12GraphicsCommandList, ID3D12Resource, D3D12_COMMAND_LIST_TYPE_COMPUTE,
    D3D12_COMMAND_QUEUE_DESC, D3D12_COMMAND_QUEUE_FLAG_NONE, D3D12_CPU_PAGE_PROPERTY_UNKNOWN,
    D3D12_FEATURE_DATA_FEATURE_LEVELS, D3D12_FEATURE_FEATURE_LEVELS, D3D12_FENCE_FLAG_NONE,
    D3D12_HEAP_FLAG_NONE, D3D12_HEAP_PROPERTIES, D3D12_HEAP_TYPE, D3D12_HEAP_TYPE_DEFAULT,
    D3D12_HEAP_TYPE_READBACK, D3D12_HEAP_TYPE_UPLOAD, D3D12_MEMORY_POOL_UNKNOWN, D3D12_RANGE,
    D3D12_RESOURCE_DESC, D3D12_RESOURCE_DIMENSION_BUFFER, D3D12_RESOURCE_FLAG_NONE,
    D3D12_RESOURCE_STATES, D3D12_RESOURCE_STATE_COMMON, D3D12_RESOURCE_STATE_COPY_DEST,
    D3D12_RESOURCE_STATE_GENERIC_READ, D3D12_TEXTURE_LAYOUT_ROW_MAJOR,
};
use windows::Win32::Graphics::Dxgi::Common::{DXGI_FORMAT_UNKNOWN, DXGI_SAMPLE_DESC};
use windows::Win32::Graphics::Dxgi::{
    IDXGIAdapter1, IDXGIFactory1, DXGI_ADAPTER_FLAG_SOFTWARE, DXGI_ERROR_NOT_FOUND,
};
use windows::Win32::System::LibraryLoader::{
    GetProcAddress, LoadLibraryExW, LOAD_LIBRARY_FLAGS, LOAD_LIBRARY_SEARCH_DEFAULT_DIRS,
    LOAD_LIBRARY_SEARCH_DLL_LOAD_DIR, LOAD_LIBRARY_SEARCH_SYSTEM32,
};

use super::error::WinError;
use super::library::Library;
use crate::backend::winparse::{utf16_to_string, wide};
use dxdp_core::validation::{
    amf_version, c_string, cuda_version, d3d12_feature_level, mismatches, nvenc_version, pattern,
    vulkan_version, Api, ApiAnswer, D3d12Answer, D3D12_FEATURE_LEVELS, FEATURE_LEVEL_11_0,
    MISMATCH_LIMIT,
};

/// A loaded DLL, never freed.
struct Dll {
    module: HMODULE,
}

impl Dll {
    /// Loads `path` (absolute) with its dependencies from its own directory and the default
    /// directories, or a system DLL by name from System32.
    fn load(path: &str, flags: LOAD_LIBRARY_FLAGS) -> Result<Dll, String> {
        let w = wide(path);
        // SAFETY: NUL-terminated UTF-16 that outlives the call.
        let module = unsafe { LoadLibraryExW(PCWSTR(w.as_ptr()), None, flags) }
            .map_err(|e| hresult_text(e.code()))?;
        Ok(Dll { module })
    }

    fn load_path(path: &Path) -> Result<Dll, String> {
        Dll::load(
            &path.display().to_string(),
            LOAD_LIBRARY_SEARCH_DLL_LOAD_DIR | LOAD_LIBRARY_SEARCH_DEFAULT_DIRS,
        )
    }

    fn system(name: &str) -> Result<Dll, String> {
        Dll::load(name, LOAD_LIBRARY_SEARCH_SYSTEM32)
            .map_err(|e| format!("LoadLibraryExW({name}): {e}"))
    }

    /// An exported function, as `F` (a function pointer type of the documented signature).
    ///
    /// # Safety
    /// `F` must be the function's real signature.
    unsafe fn get<F: Copy>(&self, symbol: &CStr) -> Result<F, String> {
        // SAFETY: the module is loaded and the name is NUL-terminated.
        let f = unsafe { GetProcAddress(self.module, PCSTR(symbol.as_ptr().cast())) }
            .ok_or_else(|| symbol.to_string_lossy().into_owned())?;
        debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of_val(&f));
        // SAFETY: F is a function pointer type of the same size, per the caller.
        Ok(unsafe { std::mem::transmute_copy::<_, F>(&f) })
    }
}

fn hresult_text(hr: HRESULT) -> String {
    let message = windows::core::Error::from(hr).message();
    let message = message.trim();
    if message.is_empty() {
        format!("HRESULT 0x{:08X}", hr.0 as u32)
    } else {
        format!("HRESULT 0x{:08X} ({message})", hr.0 as u32)
    }
}

fn err_text(e: &windows::core::Error) -> String {
    hresult_text(e.code())
}

/// The System32 directory (`%SystemRoot%\System32`), where containers get the runtime files.
pub(crate) fn system_dir() -> std::path::PathBuf {
    let root = std::env::var_os("SystemRoot").unwrap_or_else(|| r"C:\Windows".into());
    Path::new(&root).join("System32")
}

/// Loads a DLL (absolute path) with its dependencies: `Err` is the loader's error.
pub(crate) fn load_dll(path: &Path) -> Result<(), String> {
    Dll::load_path(path).map(|_| ())
}

type CreateFactory = unsafe extern "system" fn(*const GUID, *mut *mut c_void) -> HRESULT;
type CreateDevice = unsafe extern "system" fn(
    *mut c_void,
    D3D_FEATURE_LEVEL,
    *const GUID,
    *mut *mut c_void,
) -> HRESULT;

fn factory() -> Result<IDXGIFactory1, String> {
    let dxgi = Dll::system("dxgi.dll")?;
    // SAFETY: the documented signature of CreateDXGIFactory1.
    let create: CreateFactory = unsafe { dxgi.get(c"CreateDXGIFactory1") }
        .map_err(|s| format!("dxgi.dll does not export {s}"))?;
    let mut raw = std::ptr::null_mut();
    // SAFETY: a valid IID and out pointer.
    let hr = unsafe { create(&IDXGIFactory1::IID, &mut raw) };
    if hr.is_err() || raw.is_null() {
        return Err(format!("CreateDXGIFactory1: {}", hresult_text(hr)));
    }
    // SAFETY: CreateDXGIFactory1 returned an owned IDXGIFactory1.
    Ok(unsafe { IDXGIFactory1::from_raw(raw) })
}

/// An adapter DXGI lists: LUID (as `DXDP_ADAPTER_LUIDS` writes it), description, software.
pub(crate) type DxgiAdapter = (i64, String, bool);

fn adapters_of(factory: &IDXGIFactory1) -> Result<Vec<(DxgiAdapter, IDXGIAdapter1)>, String> {
    let mut out = Vec::new();
    for i in 0..64 {
        // SAFETY: a live factory.
        let adapter = match unsafe { factory.EnumAdapters1(i) } {
            Ok(a) => a,
            Err(e) if e.code() == DXGI_ERROR_NOT_FOUND => break,
            Err(e) => {
                return Err(format!(
                    "IDXGIFactory1::EnumAdapters1({i}): {}",
                    err_text(&e)
                ))
            }
        };
        // SAFETY: a live adapter.
        let desc = unsafe { adapter.GetDesc1() }
            .map_err(|e| format!("IDXGIAdapter1::GetDesc1: {}", err_text(&e)))?;
        let luid = ((desc.AdapterLuid.HighPart as i64) << 32) | desc.AdapterLuid.LowPart as i64;
        let name = utf16_to_string(&desc.Description).trim().to_string();
        let software = desc.Flags & (DXGI_ADAPTER_FLAG_SOFTWARE.0 as u32) != 0;
        out.push(((luid, name, software), adapter));
    }
    Ok(out)
}

/// The adapters DXGI lists in this process.
pub(crate) fn dxgi_adapters() -> Result<Vec<DxgiAdapter>, String> {
    let f = factory()?;
    Ok(adapters_of(&f)?.into_iter().map(|(a, _)| a).collect())
}

fn step(answer: &mut D3d12Answer, name: &str, why: String) {
    answer.failed_step = Some((name.to_string(), why));
}

fn buffer(
    device: &ID3D12Device,
    heap: D3D12_HEAP_TYPE,
    state: D3D12_RESOURCE_STATES,
    len: usize,
) -> windows::core::Result<ID3D12Resource> {
    let props = D3D12_HEAP_PROPERTIES {
        Type: heap,
        CPUPageProperty: D3D12_CPU_PAGE_PROPERTY_UNKNOWN,
        MemoryPoolPreference: D3D12_MEMORY_POOL_UNKNOWN,
        CreationNodeMask: 0,
        VisibleNodeMask: 0,
    };
    let desc = D3D12_RESOURCE_DESC {
        Dimension: D3D12_RESOURCE_DIMENSION_BUFFER,
        Alignment: 0,
        Width: len as u64,
        Height: 1,
        DepthOrArraySize: 1,
        MipLevels: 1,
        Format: DXGI_FORMAT_UNKNOWN,
        SampleDesc: DXGI_SAMPLE_DESC {
            Count: 1,
            Quality: 0,
        },
        Layout: D3D12_TEXTURE_LAYOUT_ROW_MAJOR,
        Flags: D3D12_RESOURCE_FLAG_NONE,
    };
    let mut out: Option<ID3D12Resource> = None;
    // SAFETY: valid descriptions and out pointer.
    unsafe {
        device.CreateCommittedResource(&props, D3D12_HEAP_FLAG_NONE, &desc, state, None, &mut out)
    }?;
    out.ok_or_else(|| windows::core::Error::from(HRESULT(0x80004005_u32 as i32)))
}

/// Waits for `fence` to reach `value`, at most `limit`.
fn wait(fence: &ID3D12Fence, value: u64, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        // SAFETY: a live fence.
        let done = unsafe { fence.GetCompletedValue() };
        if done == u64::MAX {
            return Err("the device was removed (the fence reads UINT64_MAX)".into());
        }
        if done >= value {
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(format!(
                "the GPU did not finish within {} s",
                limit.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// An adapter for D3D12CreateDevice (which takes any adapter as IUnknown), with the DLL that
/// made it: the DXCore adapter drops before its `dxcore.dll`.
enum Adapter {
    DxCore {
        adapter: IDXCoreAdapter,
        _dxcore: Library,
    },
    Dxgi(IDXGIAdapter1),
}

impl Adapter {
    fn as_raw(&self) -> *mut c_void {
        match self {
            Adapter::DxCore { adapter, .. } => adapter.as_raw(),
            Adapter::Dxgi(a) => a.as_raw(),
        }
    }
}

/// The adapter with `luid` and its description, and where it was looked up: in DXCore, which
/// lists compute-only (MCDM) adapters that DXGI leaves out; in DXGI only where `dxcore` could not
/// be loaded or used (Wine, Windows before build 18936). `Err` when neither can be used.
fn find_adapter(
    dxcore: Result<Library, WinError>,
    luid: i64,
) -> Result<(Option<(Adapter, String)>, String), String> {
    let why = match dxcore {
        Ok(library) => match super::dxcore::adapter_by_luid(&library, luid) {
            Ok(Some((adapter, name))) => {
                let adapter = Adapter::DxCore {
                    adapter,
                    _dxcore: library,
                };
                return Ok((Some((adapter, name)), "DXCore".into()));
            }
            // DXGI lists a subset of DXCore's adapters: it would not find it either.
            Ok(None) => return Ok((None, "DXCore".into())),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    let factory = factory()?;
    let found = adapters_of(&factory)?
        .into_iter()
        .find(|((l, _, _), _)| *l == luid)
        .map(|((_, name, _), adapter)| (Adapter::Dxgi(adapter), name));
    Ok((found, format!("DXGI (DXCore cannot be used here: {why})")))
}

/// Uploads `len` bytes to a buffer on the adapter with `luid`, copies them into GPU memory and
/// back on a compute queue (CopyBufferRegion), and compares them; `levels` are the feature
/// levels to try in order. The device is created on the adapter DXCore gives for the LUID (DXGI
/// only where DXCore is missing). `Err` means D3D12 could not be tried here at all.
pub(crate) fn d3d12_round_trip(
    luid: i64,
    levels: &[u32],
    len: usize,
    gpu_limit: Duration,
) -> Result<D3d12Answer, String> {
    round_trip_on(Library::load("dxcore.dll"), luid, levels, len, gpu_limit)
}

/// [`d3d12_round_trip`] with the DXCore of `dxcore`.
fn round_trip_on(
    dxcore: Result<Library, WinError>,
    luid: i64,
    levels: &[u32],
    len: usize,
    gpu_limit: Duration,
) -> Result<D3d12Answer, String> {
    let mut answer = D3d12Answer::default();
    let (found, enumerator) = find_adapter(dxcore, luid)?;
    answer.enumerator = Some(enumerator);
    let Some((adapter, name)) = found else {
        return Ok(answer);
    };
    answer.adapter = Some(name);
    let d3d12 = match Dll::system("d3d12.dll") {
        Ok(d) => d,
        Err(e) => {
            step(&mut answer, "loading d3d12.dll", e);
            return Ok(answer);
        }
    };
    // SAFETY: the documented signature of D3D12CreateDevice.
    let create: CreateDevice = match unsafe { d3d12.get(c"D3D12CreateDevice") } {
        Ok(f) => f,
        Err(s) => {
            step(
                &mut answer,
                "D3D12CreateDevice",
                format!("d3d12.dll does not export {s}"),
            );
            return Ok(answer);
        }
    };
    let mut device = None;
    let mut last = String::new();
    for &level in levels {
        let mut raw = std::ptr::null_mut();
        // SAFETY: a live adapter, a valid IID and out pointer.
        let hr = unsafe {
            create(
                adapter.as_raw(),
                D3D_FEATURE_LEVEL(level as i32),
                &ID3D12Device::IID,
                &mut raw,
            )
        };
        if hr.is_ok() && !raw.is_null() {
            // SAFETY: D3D12CreateDevice returned an owned ID3D12Device.
            device = Some(unsafe { ID3D12Device::from_raw(raw) });
            answer.feature_level = Some(level);
            break;
        }
        last = format!(
            "{} at feature level {}",
            hresult_text(hr),
            dxdp_core::validation::feature_level_name(level)
        );
    }
    let Some(device) = device else {
        step(&mut answer, "D3D12CreateDevice", last);
        return Ok(answer);
    };
    if let Err((what, why)) = round_trip(&device, len, gpu_limit, &mut answer) {
        step(&mut answer, what, why);
    }
    Ok(answer)
}

/// The highest D3D12 feature level (11_0 to 12_2) of the adapter with `luid`, for discovery's
/// `d3d12FeatureLevel` fact: a device created at 11_0 on the adapter (found as for
/// [`d3d12_round_trip`]), then `CheckFeatureSupport(D3D12_FEATURE_FEATURE_LEVELS)`. `Err` says
/// why there is none (no such adapter, no `d3d12.dll`, no device at 11_0).
pub(crate) fn feature_level(luid: i64) -> Result<String, String> {
    feature_level_on(Library::load("dxcore.dll"), luid)
}

/// [`feature_level`] with the DXCore of `dxcore`.
fn feature_level_on(dxcore: Result<Library, WinError>, luid: i64) -> Result<String, String> {
    let (found, enumerator) = find_adapter(dxcore, luid)?;
    let Some((adapter, _)) = found else {
        return Err(format!("{enumerator} does not list the adapter"));
    };
    let d3d12 = Dll::system("d3d12.dll")?;
    // SAFETY: the documented signature of D3D12CreateDevice.
    let create: CreateDevice = unsafe { d3d12.get(c"D3D12CreateDevice") }
        .map_err(|s| format!("d3d12.dll does not export {s}"))?;
    let mut raw = std::ptr::null_mut();
    // SAFETY: a live adapter, a valid IID and out pointer.
    let hr = unsafe {
        create(
            adapter.as_raw(),
            D3D_FEATURE_LEVEL(FEATURE_LEVEL_11_0 as i32),
            &ID3D12Device::IID,
            &mut raw,
        )
    };
    if hr.is_err() || raw.is_null() {
        return Err(format!(
            "D3D12CreateDevice at feature level 11_0: {}",
            hresult_text(hr)
        ));
    }
    // SAFETY: D3D12CreateDevice returned an owned ID3D12Device.
    let device = unsafe { ID3D12Device::from_raw(raw) };
    let levels = D3D12_FEATURE_LEVELS.map(|l| D3D_FEATURE_LEVEL(l as i32));
    let mut data = D3D12_FEATURE_DATA_FEATURE_LEVELS {
        NumFeatureLevels: levels.len() as u32,
        pFeatureLevelsRequested: levels.as_ptr(),
        MaxSupportedFeatureLevel: D3D_FEATURE_LEVEL(0),
    };
    // SAFETY: a live device; `data` and the levels it points to outlive the call, and the size
    // is that of the structure D3D12_FEATURE_FEATURE_LEVELS takes.
    unsafe {
        device.CheckFeatureSupport(
            D3D12_FEATURE_FEATURE_LEVELS,
            (&mut data as *mut D3D12_FEATURE_DATA_FEATURE_LEVELS).cast(),
            std::mem::size_of::<D3D12_FEATURE_DATA_FEATURE_LEVELS>() as u32,
        )
    }
    .map_err(|e| {
        format!(
            "CheckFeatureSupport(D3D12_FEATURE_FEATURE_LEVELS): {}",
            err_text(&e)
        )
    })?;
    let max = data.MaxSupportedFeatureLevel.0 as u32;
    d3d12_feature_level(max).ok_or_else(|| {
        format!("CheckFeatureSupport(D3D12_FEATURE_FEATURE_LEVELS) answered the unknown level 0x{max:X}")
    })
}

fn round_trip(
    device: &ID3D12Device,
    len: usize,
    gpu_limit: Duration,
    answer: &mut D3d12Answer,
) -> Result<(), (&'static str, String)> {
    let e = |what: &'static str| move |err: windows::core::Error| (what, err_text(&err));
    let queue_desc = D3D12_COMMAND_QUEUE_DESC {
        Type: D3D12_COMMAND_LIST_TYPE_COMPUTE,
        Priority: 0,
        Flags: D3D12_COMMAND_QUEUE_FLAG_NONE,
        NodeMask: 0,
    };
    // SAFETY (this whole function): live COM objects and valid descriptions; mapped pointers
    // are used only between Map and Unmap and within the buffer's length.
    unsafe {
        let queue: ID3D12CommandQueue = device
            .CreateCommandQueue(&queue_desc)
            .map_err(e("CreateCommandQueue(COMPUTE)"))?;
        let allocator: ID3D12CommandAllocator = device
            .CreateCommandAllocator(D3D12_COMMAND_LIST_TYPE_COMPUTE)
            .map_err(e("CreateCommandAllocator(COMPUTE)"))?;
        let list: ID3D12GraphicsCommandList = device
            .CreateCommandList(0, D3D12_COMMAND_LIST_TYPE_COMPUTE, &allocator, None)
            .map_err(e("CreateCommandList(COMPUTE)"))?;
        let fence: ID3D12Fence = device
            .CreateFence(0, D3D12_FENCE_FLAG_NONE)
            .map_err(e("CreateFence"))?;
        let upload = buffer(
            device,
            D3D12_HEAP_TYPE_UPLOAD,
            D3D12_RESOURCE_STATE_GENERIC_READ,
            len,
        )
        .map_err(e("CreateCommittedResource(UPLOAD)"))?;
        let gpu = buffer(
            device,
            D3D12_HEAP_TYPE_DEFAULT,
            D3D12_RESOURCE_STATE_COMMON,
            len,
        )
        .map_err(e("CreateCommittedResource(DEFAULT)"))?;
        let readback = buffer(
            device,
            D3D12_HEAP_TYPE_READBACK,
            D3D12_RESOURCE_STATE_COPY_DEST,
            len,
        )
        .map_err(e("CreateCommittedResource(READBACK)"))?;
        let want = pattern(len);
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let nothing = D3D12_RANGE { Begin: 0, End: 0 };
        upload
            .Map(0, Some(&nothing), Some(&mut ptr))
            .map_err(e("Map(UPLOAD)"))?;
        if ptr.is_null() {
            return Err(("Map(UPLOAD)", "returned no pointer".into()));
        }
        std::ptr::copy_nonoverlapping(want.as_ptr(), ptr.cast::<u8>(), len);
        upload.Unmap(0, None);
        let start = Instant::now();
        // Two submissions: the GPU buffer decays to COMMON in between, so each copy promotes it
        // implicitly (to COPY_DEST, then COPY_SOURCE) and no barrier is needed.
        list.CopyBufferRegion(&gpu, 0, &upload, 0, len as u64);
        list.Close().map_err(e("Close"))?;
        let lists = [Some(list.cast::<ID3D12CommandList>().map_err(e("cast"))?)];
        queue.ExecuteCommandLists(&lists);
        queue.Signal(&fence, 1).map_err(e("Signal"))?;
        wait(&fence, 1, gpu_limit).map_err(|w| ("the copy to GPU memory", w))?;
        allocator
            .Reset()
            .map_err(e("ID3D12CommandAllocator::Reset"))?;
        list.Reset(&allocator, None)
            .map_err(e("ID3D12GraphicsCommandList::Reset"))?;
        list.CopyBufferRegion(&readback, 0, &gpu, 0, len as u64);
        list.Close().map_err(e("Close"))?;
        queue.ExecuteCommandLists(&lists);
        queue.Signal(&fence, 2).map_err(e("Signal"))?;
        wait(&fence, 2, gpu_limit).map_err(|w| ("the copy back from GPU memory", w))?;
        answer.gpu_seconds = Some(start.elapsed().as_secs_f64());
        let range = D3D12_RANGE { Begin: 0, End: len };
        let mut ptr: *mut c_void = std::ptr::null_mut();
        readback
            .Map(0, Some(&range), Some(&mut ptr))
            .map_err(e("Map(READBACK)"))?;
        if ptr.is_null() {
            return Err(("Map(READBACK)", "returned no pointer".into()));
        }
        let got = std::slice::from_raw_parts(ptr.cast::<u8>(), len).to_vec();
        readback.Unmap(0, Some(&nothing));
        answer.bytes = len;
        answer.mismatches = mismatches(&want, &got, MISMATCH_LIMIT);
    }
    Ok(())
}

// The vendor APIs' documented signatures (all `__stdcall`/`__cdecl`, the same on x64).
type CuInit = unsafe extern "system" fn(u32) -> i32;
type CuDriverGetVersion = unsafe extern "system" fn(*mut i32) -> i32;
type CuDeviceGetCount = unsafe extern "system" fn(*mut i32) -> i32;
type CuDeviceGet = unsafe extern "system" fn(*mut i32, i32) -> i32;
type CuDeviceGetName = unsafe extern "system" fn(*mut u8, i32, i32) -> i32;
type NvmlInit = unsafe extern "system" fn() -> i32;
type NvmlDeviceGetCount = unsafe extern "system" fn(*mut u32) -> i32;
type NvmlDeviceGetHandle = unsafe extern "system" fn(u32, *mut *mut c_void) -> i32;
type NvmlDeviceGetName = unsafe extern "system" fn(*mut c_void, *mut u8, u32) -> i32;
type ClGetPlatformIds = unsafe extern "system" fn(u32, *mut *mut c_void, *mut u32) -> i32;
type ClGetDeviceIds =
    unsafe extern "system" fn(*mut c_void, u64, u32, *mut *mut c_void, *mut u32) -> i32;
type ClGetDeviceInfo =
    unsafe extern "system" fn(*mut c_void, u32, usize, *mut c_void, *mut usize) -> i32;
type VkCreateInstance =
    unsafe extern "system" fn(*const VkInstanceCreateInfo, *const c_void, *mut *mut c_void) -> i32;
type VkEnumeratePhysicalDevices =
    unsafe extern "system" fn(*mut c_void, *mut u32, *mut *mut c_void) -> i32;
type VkGetPhysicalDeviceProperties = unsafe extern "system" fn(*mut c_void, *mut u8);
type VkDestroyInstance = unsafe extern "system" fn(*mut c_void, *const c_void);
type NvEncGetMaxVersion = unsafe extern "system" fn(*mut u32) -> i32;
type AmfQueryVersion = unsafe extern "system" fn(*mut u64) -> i32;
type MfxLoad = unsafe extern "system" fn() -> *mut c_void;
type MfxEnumImplementations =
    unsafe extern "system" fn(*mut c_void, u32, u32, *mut *mut c_void) -> i32;
type MfxRelease = unsafe extern "system" fn(*mut c_void, *mut c_void) -> i32;
type MfxUnload = unsafe extern "system" fn(*mut c_void);

/// `VkInstanceCreateInfo` (vulkan_core.h).
#[repr(C)]
struct VkInstanceCreateInfo {
    s_type: u32,
    p_next: *const c_void,
    flags: u32,
    p_application_info: *const c_void,
    enabled_layer_count: u32,
    pp_enabled_layer_names: *const *const u8,
    enabled_extension_count: u32,
    pp_enabled_extension_names: *const *const u8,
}

/// `sizeof(VkPhysicalDeviceProperties)` is 824; a larger buffer, 8-aligned.
#[repr(C, align(8))]
struct VkProperties([u8; 1024]);

const CL_DEVICE_TYPE_ALL: u64 = 0xFFFF_FFFF;
const CL_DEVICE_NAME: u32 = 0x102B;
const CL_DEVICE_NOT_FOUND: i32 = -1;
const MFX_IMPLCAPS_IMPLDESCSTRUCTURE: u32 = 1;

fn failed(call: &str, code: i64) -> ApiAnswer {
    ApiAnswer::CallFailed {
        call: call.to_string(),
        code,
    }
}

/// Probes `api` through the DLL in `dir` (System32 in a container).
pub(crate) fn vendor_api(api: Api, dir: &Path) -> ApiAnswer {
    let path = dir.join(api.dll());
    if !path.is_file() {
        return ApiAnswer::NotShipped;
    }
    let dll = match Dll::load_path(&path) {
        Ok(d) => d,
        Err(e) => return ApiAnswer::LoadFailed(format!("LoadLibraryExW({}): {e}", path.display())),
    };
    // SAFETY: each probe calls the API's documented entry points with their documented
    // signatures and buffers of the documented sizes.
    match unsafe { probe(api, &dll) } {
        Ok(a) | Err(a) => a,
    }
}

macro_rules! sym {
    ($dll:expr, $name:literal) => {
        $dll.get($name).map_err(ApiAnswer::NoEntryPoint)?
    };
}

unsafe fn probe(api: Api, dll: &Dll) -> Result<ApiAnswer, ApiAnswer> {
    unsafe {
        match api {
            Api::Cuda => {
                let init: CuInit = sym!(dll, c"cuInit");
                let count: CuDeviceGetCount = sym!(dll, c"cuDeviceGetCount");
                let get: CuDeviceGet = sym!(dll, c"cuDeviceGet");
                let name: CuDeviceGetName = sym!(dll, c"cuDeviceGetName");
                let rc = init(0);
                if rc != 0 {
                    return Err(failed("cuInit(0)", rc.into()));
                }
                let version = dll
                    .get::<CuDriverGetVersion>(c"cuDriverGetVersion")
                    .ok()
                    .and_then(|f| {
                        let mut v = 0;
                        (f(&mut v) == 0).then(|| cuda_version(v))
                    });
                let mut n = 0i32;
                let rc = count(&mut n);
                if rc != 0 {
                    return Err(failed("cuDeviceGetCount", rc.into()));
                }
                let mut devices = Vec::new();
                for i in 0..n.clamp(0, 64) {
                    let mut dev = 0i32;
                    let rc = get(&mut dev, i);
                    if rc != 0 {
                        return Err(failed(&format!("cuDeviceGet({i})"), rc.into()));
                    }
                    let mut buf = [0u8; 256];
                    let rc = name(buf.as_mut_ptr(), buf.len() as i32, dev);
                    if rc != 0 {
                        return Err(failed(&format!("cuDeviceGetName({i})"), rc.into()));
                    }
                    devices.push(c_string(&buf));
                }
                Ok(ApiAnswer::Answered {
                    version,
                    devices,
                    needs_device: true,
                })
            }
            Api::Nvml => {
                let init: NvmlInit = sym!(dll, c"nvmlInit_v2");
                let count: NvmlDeviceGetCount = sym!(dll, c"nvmlDeviceGetCount_v2");
                let handle: NvmlDeviceGetHandle = sym!(dll, c"nvmlDeviceGetHandleByIndex_v2");
                let name: NvmlDeviceGetName = sym!(dll, c"nvmlDeviceGetName");
                let shutdown: NvmlInit = sym!(dll, c"nvmlShutdown");
                let rc = init();
                if rc != 0 {
                    return Err(failed("nvmlInit_v2", rc.into()));
                }
                let mut n = 0u32;
                let rc = count(&mut n);
                let mut devices = Vec::new();
                if rc == 0 {
                    for i in 0..n.min(64) {
                        let mut h = std::ptr::null_mut();
                        let mut buf = [0u8; 96];
                        if handle(i, &mut h) == 0
                            && name(h, buf.as_mut_ptr(), buf.len() as u32) == 0
                        {
                            devices.push(c_string(&buf));
                        } else {
                            devices.push(format!("device {i}"));
                        }
                    }
                }
                shutdown();
                if rc != 0 {
                    return Err(failed("nvmlDeviceGetCount_v2", rc.into()));
                }
                Ok(ApiAnswer::Answered {
                    version: None,
                    devices,
                    needs_device: true,
                })
            }
            Api::Opencl => {
                let platforms: ClGetPlatformIds = sym!(dll, c"clGetPlatformIDs");
                let device_ids: ClGetDeviceIds = sym!(dll, c"clGetDeviceIDs");
                let info: ClGetDeviceInfo = sym!(dll, c"clGetDeviceInfo");
                let mut n = 0u32;
                let rc = platforms(0, std::ptr::null_mut(), &mut n);
                if rc != 0 {
                    return Err(failed("clGetPlatformIDs", rc.into()));
                }
                let mut ids = vec![std::ptr::null_mut(); n.min(16) as usize];
                if !ids.is_empty() {
                    let rc = platforms(ids.len() as u32, ids.as_mut_ptr(), std::ptr::null_mut());
                    if rc != 0 {
                        return Err(failed("clGetPlatformIDs", rc.into()));
                    }
                }
                let mut devices = Vec::new();
                for p in ids {
                    let mut m = 0u32;
                    let rc = device_ids(p, CL_DEVICE_TYPE_ALL, 0, std::ptr::null_mut(), &mut m);
                    if rc == CL_DEVICE_NOT_FOUND {
                        continue;
                    }
                    if rc != 0 {
                        return Err(failed("clGetDeviceIDs", rc.into()));
                    }
                    let mut devs = vec![std::ptr::null_mut(); m.min(16) as usize];
                    let rc = device_ids(
                        p,
                        CL_DEVICE_TYPE_ALL,
                        devs.len() as u32,
                        devs.as_mut_ptr(),
                        std::ptr::null_mut(),
                    );
                    if rc != 0 {
                        return Err(failed("clGetDeviceIDs", rc.into()));
                    }
                    for d in devs {
                        let mut buf = [0u8; 256];
                        let rc = info(
                            d,
                            CL_DEVICE_NAME,
                            buf.len(),
                            buf.as_mut_ptr().cast(),
                            std::ptr::null_mut(),
                        );
                        devices.push(if rc == 0 {
                            c_string(&buf)
                        } else {
                            "unnamed device".into()
                        });
                    }
                }
                Ok(ApiAnswer::Answered {
                    version: None,
                    devices,
                    needs_device: true,
                })
            }
            Api::Vulkan => {
                let create: VkCreateInstance = sym!(dll, c"vkCreateInstance");
                let enumerate: VkEnumeratePhysicalDevices =
                    sym!(dll, c"vkEnumeratePhysicalDevices");
                let props: VkGetPhysicalDeviceProperties =
                    sym!(dll, c"vkGetPhysicalDeviceProperties");
                let destroy: VkDestroyInstance = sym!(dll, c"vkDestroyInstance");
                let info = VkInstanceCreateInfo {
                    s_type: 1, // VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO
                    p_next: std::ptr::null(),
                    flags: 0,
                    p_application_info: std::ptr::null(),
                    enabled_layer_count: 0,
                    pp_enabled_layer_names: std::ptr::null(),
                    enabled_extension_count: 0,
                    pp_enabled_extension_names: std::ptr::null(),
                };
                let mut instance = std::ptr::null_mut();
                let rc = create(&info, std::ptr::null(), &mut instance);
                if rc != 0 {
                    return Err(failed("vkCreateInstance", rc.into()));
                }
                let mut n = 0u32;
                let rc = enumerate(instance, &mut n, std::ptr::null_mut());
                let mut devices = Vec::new();
                let mut version = None;
                if rc == 0 && n > 0 {
                    let mut list = vec![std::ptr::null_mut(); n.min(16) as usize];
                    let mut m = list.len() as u32;
                    let rc = enumerate(instance, &mut m, list.as_mut_ptr());
                    // VK_INCOMPLETE (5) still fills the list.
                    if rc == 0 || rc == 5 {
                        for d in list.into_iter().take(m as usize) {
                            let mut p = VkProperties([0; 1024]);
                            props(d, p.0.as_mut_ptr());
                            let api_version = u32::from_ne_bytes([p.0[0], p.0[1], p.0[2], p.0[3]]);
                            version.get_or_insert_with(|| vulkan_version(api_version));
                            devices.push(c_string(&p.0[20..276]));
                        }
                    }
                }
                destroy(instance, std::ptr::null());
                if rc != 0 {
                    return Err(failed("vkEnumeratePhysicalDevices", rc.into()));
                }
                Ok(ApiAnswer::Answered {
                    version,
                    devices,
                    needs_device: true,
                })
            }
            Api::Nvenc => {
                let get: NvEncGetMaxVersion = sym!(dll, c"NvEncodeAPIGetMaxSupportedVersion");
                let mut v = 0u32;
                let rc = get(&mut v);
                if rc != 0 {
                    return Err(failed("NvEncodeAPIGetMaxSupportedVersion", rc.into()));
                }
                Ok(ApiAnswer::Answered {
                    version: Some(nvenc_version(v)),
                    devices: Vec::new(),
                    needs_device: false,
                })
            }
            Api::Amf => {
                let query: AmfQueryVersion = sym!(dll, c"AMFQueryVersion");
                let mut v = 0u64;
                let rc = query(&mut v);
                if rc != 0 {
                    return Err(failed("AMFQueryVersion", rc.into()));
                }
                Ok(ApiAnswer::Answered {
                    version: Some(amf_version(v)),
                    devices: Vec::new(),
                    needs_device: false,
                })
            }
            Api::Vpl => {
                let load: MfxLoad = sym!(dll, c"MFXLoad");
                let enumerate: MfxEnumImplementations = sym!(dll, c"MFXEnumImplementations");
                let release: MfxRelease = sym!(dll, c"MFXDispReleaseImplDescription");
                let unload: MfxUnload = sym!(dll, c"MFXUnload");
                let loader = load();
                if loader.is_null() {
                    return Err(failed("MFXLoad (returned no loader)", 0));
                }
                let mut devices = Vec::new();
                let mut version = None;
                for i in 0..16 {
                    let mut desc = std::ptr::null_mut();
                    if enumerate(loader, i, MFX_IMPLCAPS_IMPLDESCSTRUCTURE, &mut desc) != 0
                        || desc.is_null()
                    {
                        break;
                    }
                    // mfxImplDescription: StructVersion (2), pad (2), Impl (4),
                    // AccelerationMode (4), ApiVersion {Minor u16, Major u16}, ImplName[32].
                    let bytes = std::slice::from_raw_parts(desc.cast::<u8>(), 48);
                    let minor = u16::from_ne_bytes([bytes[12], bytes[13]]);
                    let major = u16::from_ne_bytes([bytes[14], bytes[15]]);
                    version.get_or_insert_with(|| format!("{major}.{minor}"));
                    devices.push(c_string(&bytes[16..48]));
                    release(loader, desc);
                }
                unload(loader);
                Ok(ApiAnswer::Answered {
                    version,
                    devices,
                    needs_device: true,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{feature_level_on, round_trip_on, Library};
    use crate::backend::windows::error::WinError;

    /// The LUID tests/wine/dxcore-standin.c knows (0x00000007:0x0000D1CE).
    const STANDIN_LUID: i64 = 0x0000_0007_0000_d1ce;

    /// The dxcore.dll stand-in beside the test executable (.ci/windows.sh builds it), or why not.
    fn standin(test: &str) -> Option<Library> {
        let path = std::env::current_exe()
            .ok()?
            .with_file_name("dxcore-standin.dll");
        match Library::load_standin(&path, "dxcore.dll") {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("skipped {test}: {} cannot be loaded ({e}); .ci/windows.sh builds it from tests/wine/dxcore-standin.c", path.display());
                None
            }
        }
    }

    #[test]
    fn a_compute_only_adapter_is_found_through_dxcore_and_given_to_d3d12() {
        let Some(dxcore) =
            standin("a_compute_only_adapter_is_found_through_dxcore_and_given_to_d3d12")
        else {
            return;
        };
        let answer = round_trip_on(
            Ok(dxcore),
            STANDIN_LUID,
            &[0xb000],
            64,
            Duration::from_secs(5),
        )
        .expect("DXCore is there: D3D12 can be tried");
        assert_eq!(answer.enumerator.as_deref(), Some("DXCore"));
        // The description comes from the stand-in's IDXCoreAdapter: DXGI lists no such adapter.
        assert_eq!(
            answer.adapter.as_deref(),
            Some("dxdp stand-in compute-only adapter")
        );
        // The stand-in is no real adapter: D3D12CreateDevice, given it, refuses it.
        let (step, _) = answer.failed_step.expect("the stand-in has no device");
        assert_eq!(step, "D3D12CreateDevice");
    }

    #[test]
    fn the_feature_level_of_an_adapter_without_a_device_is_none_with_why() {
        let Some(dxcore) =
            standin("the_feature_level_of_an_adapter_without_a_device_is_none_with_why")
        else {
            return;
        };
        // The stand-in is no real adapter: D3D12CreateDevice refuses it.
        let why = feature_level_on(Ok(dxcore), STANDIN_LUID).expect_err("no device");
        assert!(
            why.starts_with("D3D12CreateDevice at feature level 11_0: "),
            "{why}"
        );
        let Some(dxcore) =
            standin("the_feature_level_of_an_adapter_without_a_device_is_none_with_why")
        else {
            return;
        };
        assert_eq!(
            feature_level_on(Ok(dxcore), 0x1234),
            Err("DXCore does not list the adapter".into())
        );
    }

    #[test]
    fn an_adapter_dxcore_does_not_know_is_not_looked_up_in_dxgi() {
        let Some(dxcore) = standin("an_adapter_dxcore_does_not_know_is_not_looked_up_in_dxgi")
        else {
            return;
        };
        let answer = round_trip_on(Ok(dxcore), 0x1234, &[0xb000], 64, Duration::from_secs(5))
            .expect("DXCore is there");
        assert_eq!(answer.enumerator.as_deref(), Some("DXCore"));
        assert_eq!(answer.adapter, None);
    }

    #[test]
    fn without_dxcore_the_adapter_is_looked_up_in_dxgi_and_the_reason_is_kept() {
        let missing = Err(WinError::other("LoadLibraryExW(dxcore.dll)", "not here"));
        match round_trip_on(missing, 0x1234, &[0xb000], 64, Duration::from_secs(5)) {
            Ok(answer) => {
                assert_eq!(
                    answer.enumerator.as_deref(),
                    Some("DXGI (DXCore cannot be used here: LoadLibraryExW(dxcore.dll) failed: not here)")
                );
                assert_eq!(answer.adapter, None, "no adapter has LUID 0x1234");
            }
            // No DXGI either: D3D12 cannot be tried at all.
            Err(e) => assert!(e.contains("DXGI") || e.contains("dxgi"), "{e}"),
        }
    }
}
