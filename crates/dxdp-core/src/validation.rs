//! `dxdp validate`'s decisions, kept pure: what each raw answer of a probe (a DLL that loads or
//! not, an entry point that answers, a D3D12 round trip) means as a check result, the verdict of
//! a run and its exit code, and the short result a validation Job leaves for the daemon.
//!
//! The probes themselves (DXGI/DXCore, D3D12, the vendor DLLs) are thin FFI in the root crate;
//! everything they return is judged here and tested on every platform.

use serde::{Deserialize, Serialize};

/// The vendor APIs `dxdp validate` probes, each through its documented entry points in the DLL
/// its driver ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Api {
    /// CUDA driver API, `nvcuda.dll`: `cuInit`, `cuDeviceGetCount`, `cuDeviceGetName`.
    Cuda,
    /// NVIDIA Management Library, `nvml.dll`: `nvmlInit_v2`, `nvmlDeviceGetCount_v2`.
    Nvml,
    /// OpenCL ICD loader, `OpenCL.dll`: `clGetPlatformIDs`, `clGetDeviceIDs`.
    Opencl,
    /// Vulkan loader, `vulkan-1.dll`: `vkCreateInstance`, `vkEnumeratePhysicalDevices`.
    Vulkan,
    /// NVIDIA Video Codec SDK, `nvEncodeAPI64.dll`: `NvEncodeAPIGetMaxSupportedVersion`.
    Nvenc,
    /// AMD Advanced Media Framework, `amfrt64.dll`: `AMFQueryVersion`.
    Amf,
    /// Intel oneVPL dispatcher, `libvpl.dll`: `MFXLoad`, `MFXEnumImplementations`.
    Vpl,
}

impl Api {
    /// Every API, in the order they are checked and printed.
    pub const ALL: [Api; 7] = [
        Api::Cuda,
        Api::Nvml,
        Api::Opencl,
        Api::Vulkan,
        Api::Nvenc,
        Api::Amf,
        Api::Vpl,
    ];

    /// The check's name (`cuda`, ...), also the `<name>` of the node label
    /// `directx.microsoft.com/api.<name>.validated`.
    pub fn name(self) -> &'static str {
        match self {
            Api::Cuda => "cuda",
            Api::Nvml => "nvml",
            Api::Opencl => "opencl",
            Api::Vulkan => "vulkan",
            Api::Nvenc => "nvenc",
            Api::Amf => "amf",
            Api::Vpl => "vpl",
        }
    }

    /// The DLL the driver ships it in.
    pub fn dll(self) -> &'static str {
        match self {
            Api::Cuda => "nvcuda.dll",
            Api::Nvml => "nvml.dll",
            Api::Opencl => "OpenCL.dll",
            Api::Vulkan => "vulkan-1.dll",
            Api::Nvenc => "nvEncodeAPI64.dll",
            Api::Amf => "amfrt64.dll",
            Api::Vpl => "libvpl.dll",
        }
    }

    /// The API by its check name.
    pub fn from_name(name: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// The outcome of one check.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// It works.
    Pass,
    /// It does not work (exit code 1).
    Fail,
    /// It did not answer within its time limit: counted as a failure (exit code 1).
    TimedOut,
    /// The driver does not ship it (the DLL is not in the container): not a failure.
    Absent,
    /// Not applicable here (with why): not a failure.
    Skipped,
    /// The check could not tell (exit code 3 unless something failed).
    Unknown,
}

impl Outcome {
    /// `pass`, `fail`, `timed-out`, `absent`, `skipped` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "fail",
            Outcome::TimedOut => "timed-out",
            Outcome::Absent => "absent",
            Outcome::Skipped => "skipped",
            Outcome::Unknown => "unknown",
        }
    }

    /// Every outcome, for metrics that list each one.
    pub const ALL: [Outcome; 6] = [
        Outcome::Pass,
        Outcome::Fail,
        Outcome::TimedOut,
        Outcome::Absent,
        Outcome::Skipped,
        Outcome::Unknown,
    ];

    /// Whether it makes the run fail.
    pub fn is_failure(self) -> bool {
        matches!(self, Outcome::Fail | Outcome::TimedOut)
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckResult {
    /// The check: `adapters`, `d3d12`, `runtime-files`, or an API (`cuda`, `nvml`, `opencl`,
    /// `vulkan`, `nvenc`, `amf`, `vpl`).
    pub name: String,
    /// The adapter it ran on, for per-device checks: its LUID as every text of dxdp writes it
    /// (`0x00000000_0x006B8B86`, [`crate::luid::label`]).
    pub device: Option<String>,
    /// The outcome.
    pub result: Outcome,
    /// What was found, for people.
    pub detail: String,
    /// What to do, for a failure or an unknown.
    pub remedy: Option<String>,
    /// How long the check took, in seconds.
    pub seconds: f64,
}

impl CheckResult {
    /// A result without device, remedy or time.
    pub fn new(name: &str, result: Outcome, detail: impl Into<String>) -> Self {
        CheckResult {
            name: name.to_string(),
            device: None,
            result,
            detail: detail.into(),
            remedy: None,
            seconds: 0.0,
        }
    }

    /// With a remedy.
    pub fn remedy(mut self, remedy: impl Into<String>) -> Self {
        self.remedy = Some(remedy.into());
        self
    }
}

/// The verdict of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Every check passed (or was absent or skipped): exit code 0.
    Pass,
    /// A check failed or timed out: exit code 1.
    Fail,
    /// Nothing failed, but a check could not tell: exit code 3 (2 is a usage error).
    Unknown,
}

impl Verdict {
    /// `pass`, `fail` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Unknown => "unknown",
        }
    }

    /// 0, 1 or 3: the codes of every dxdp check (docs/tools.md#exit-codes; 2 is a usage error).
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Pass => 0,
            Verdict::Fail => 1,
            Verdict::Unknown => 3,
        }
    }

    /// The verdict of an exit code (a validation Job's container), `None` for any other code.
    pub fn from_exit_code(code: i32) -> Option<Verdict> {
        match code {
            0 => Some(Verdict::Pass),
            1 => Some(Verdict::Fail),
            3 => Some(Verdict::Unknown),
            _ => None,
        }
    }
}

/// The verdict of a set of checks, and for a failure or unknown the check names that decided it
/// (in order). No check at all is unknown: nothing was proven.
pub fn verdict(checks: &[CheckResult]) -> (Verdict, Vec<String>) {
    let named = |pred: &dyn Fn(Outcome) -> bool| {
        let mut out: Vec<String> = Vec::new();
        for c in checks.iter().filter(|c| pred(c.result)) {
            if !out.contains(&c.name) {
                out.push(c.name.clone());
            }
        }
        out
    };
    let failed = named(&Outcome::is_failure);
    if !failed.is_empty() {
        return (Verdict::Fail, failed);
    }
    let unknown = named(&|o| o == Outcome::Unknown);
    if !unknown.is_empty() || !checks.iter().any(|c| c.result == Outcome::Pass) {
        return (Verdict::Unknown, unknown);
    }
    (Verdict::Pass, Vec::new())
}

/// What a vendor probe saw, before it is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiAnswer {
    /// The DLL is not in the container.
    NotShipped,
    /// The DLL is there but does not load (a dependency missing, wrong architecture, its
    /// DllMain failed): the loader's error.
    LoadFailed(String),
    /// An entry point is not exported.
    NoEntryPoint(String),
    /// A call returned an error: the call and its status code.
    CallFailed {
        /// The function.
        call: String,
        /// Its status (CUresult, nvmlReturn_t, cl_int, VkResult, NVENCSTATUS, AMF_RESULT,
        /// mfxStatus).
        code: i64,
    },
    /// It answered.
    Answered {
        /// The version it reports, if it has a version query.
        version: Option<String>,
        /// The devices (or implementations) it lists, by name where it names them.
        devices: Vec<String>,
        /// Whether the API must list at least one device to pass (CUDA, NVML, OpenCL, Vulkan do;
        /// the encoders' version queries do not list devices).
        needs_device: bool,
    },
}

/// The name of a status code, where the API documents it, for the detail.
pub fn status_name(api: Api, code: i64) -> Option<&'static str> {
    Some(match (api, code) {
        (Api::Cuda, 3) => "CUDA_ERROR_NOT_INITIALIZED",
        (Api::Cuda, 34) => "CUDA_ERROR_STUB_LIBRARY",
        (Api::Cuda, 35) => "CUDA_ERROR_INSUFFICIENT_DRIVER",
        (Api::Cuda, 46) => "CUDA_ERROR_DEVICES_UNAVAILABLE",
        (Api::Cuda, 100) => "CUDA_ERROR_NO_DEVICE",
        (Api::Cuda, 101) => "CUDA_ERROR_INVALID_DEVICE",
        (Api::Cuda, 304) => "CUDA_ERROR_OPERATING_SYSTEM",
        (Api::Cuda, 999) => "CUDA_ERROR_UNKNOWN",
        (Api::Nvml, 2) => "NVML_ERROR_INVALID_ARGUMENT",
        (Api::Nvml, 3) => "NVML_ERROR_NOT_SUPPORTED",
        (Api::Nvml, 4) => "NVML_ERROR_NO_PERMISSION",
        (Api::Nvml, 9) => "NVML_ERROR_DRIVER_NOT_LOADED",
        (Api::Nvml, 12) => "NVML_ERROR_LIBRARY_NOT_FOUND",
        (Api::Nvml, 999) => "NVML_ERROR_UNKNOWN",
        (Api::Opencl, -1) => "CL_DEVICE_NOT_FOUND",
        (Api::Opencl, -30) => "CL_INVALID_VALUE",
        (Api::Opencl, -1001) => "CL_PLATFORM_NOT_FOUND_KHR",
        (Api::Vulkan, -3) => "VK_ERROR_INITIALIZATION_FAILED",
        (Api::Vulkan, -9) => "VK_ERROR_INCOMPATIBLE_DRIVER",
        (Api::Vulkan, -7) => "VK_ERROR_EXTENSION_NOT_PRESENT",
        (Api::Nvenc, 1) => "NV_ENC_ERR_NO_ENCODE_DEVICE",
        (Api::Nvenc, 2) => "NV_ENC_ERR_UNSUPPORTED_DEVICE",
        (Api::Amf, 1) => "AMF_FAIL",
        (Api::Amf, 6) => "AMF_NOT_SUPPORTED",
        (Api::Vpl, -9) => "MFX_ERR_NOT_FOUND",
        (Api::Vpl, -3) => "MFX_ERR_UNSUPPORTED",
        _ => return None,
    })
}

fn join_names(names: &[String]) -> String {
    if names.is_empty() {
        return String::new();
    }
    let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
    let more = names.len().saturating_sub(shown.len());
    let mut s = format!(": {}", shown.join(", "));
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}

/// Judges a vendor probe's answer.
pub fn judge_api(api: Api, answer: &ApiAnswer) -> CheckResult {
    let name = api.name();
    let dll = api.dll();
    match answer {
        ApiAnswer::NotShipped => CheckResult::new(
            name,
            Outcome::Absent,
            format!("{dll} is not in this container: the driver does not ship {name} (or does not copy it into containers)"),
        ),
        ApiAnswer::LoadFailed(e) => CheckResult::new(
            name,
            Outcome::Fail,
            format!("{dll} is in this container but does not load: {e}"),
        )
        .remedy(format!("a DLL {dll} depends on is missing in the container: check that every runtime file the driver lists (CopyToVm*) is mounted (`dxdp mounts`, the runtime-files check) and that the base image has the system DLLs it needs (Server Core, not Nano Server)")),
        ApiAnswer::NoEntryPoint(sym) => CheckResult::new(
            name,
            Outcome::Fail,
            format!("{dll} loads but does not export {sym}: not the library {name} documents (a stub or a wrong copy?)"),
        )
        .remedy(format!("compare {dll} in the container with the driver store's copy on the host")),
        ApiAnswer::CallFailed { call, code } => {
            let code_name = status_name(api, *code)
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            CheckResult::new(
                name,
                Outcome::Fail,
                format!("{call} returned {code}{code_name}"),
            )
            .remedy(format!(
                "{name} is shipped but does not work in this container: check that the container got the GPU (adapters check) and that the driver supports {name} in process-isolated containers (docs/validation.md)"
            ))
        }
        ApiAnswer::Answered {
            version,
            devices,
            needs_device,
        } => {
            let version = version
                .as_ref()
                .map(|v| format!(" version {v}"))
                .unwrap_or_default();
            if *needs_device && devices.is_empty() {
                return CheckResult::new(
                    name,
                    Outcome::Fail,
                    format!("{dll}{version} answers but lists no device"),
                )
                .remedy(format!("{name} does not see the GPU in this container: check the adapters check and the driver's container support"));
            }
            let listed = if *needs_device {
                format!(
                    ", {} device{}{}",
                    devices.len(),
                    if devices.len() == 1 { "" } else { "s" },
                    join_names(devices)
                )
            } else {
                join_names(devices)
            };
            CheckResult::new(name, Outcome::Pass, format!("{dll}{version} answers{listed}"))
        }
    }
}

/// The version NVENC's `NvEncodeAPIGetMaxSupportedVersion` reports: `(major << 4) | minor`.
pub fn nvenc_version(v: u32) -> String {
    format!("{}.{}", v >> 4, v & 0xf)
}

/// The version AMF's `AMFQueryVersion` reports: major, minor, release and build in 16 bits each.
pub fn amf_version(v: u64) -> String {
    format!(
        "{}.{}.{}.{}",
        v >> 48,
        (v >> 32) & 0xffff,
        (v >> 16) & 0xffff,
        v & 0xffff
    )
}

/// The version the CUDA driver reports (`cuDriverGetVersion`): `1000 * major + 10 * minor`.
pub fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// A Vulkan `apiVersion` (`VK_MAKE_API_VERSION`): variant 3 bits, major 7, minor 10, patch 12.
pub fn vulkan_version(v: u32) -> String {
    format!("{}.{}.{}", (v >> 22) & 0x7f, (v >> 12) & 0x3ff, v & 0xfff)
}

/// A NUL-terminated C string in a fixed buffer, lossily as UTF-8.
pub fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).trim().to_string()
}

/// A D3D12 feature level as D3D writes it (`11_0`, `1_0_CORE`).
pub fn feature_level_name(level: u32) -> String {
    match level {
        0x1000 => "1_0_CORE".into(),
        l => format!("{}_{}", l >> 12, (l >> 8) & 0xf),
    }
}

/// The feature levels discovery asks D3D12 about (`D3D12_FEATURE_FEATURE_LEVELS`) on a device
/// created at 11_0, lowest first: 11_0, 11_1, 12_0, 12_1, 12_2.
pub const D3D12_FEATURE_LEVELS: [u32; 5] = [0xb000, 0xb100, 0xc000, 0xc100, 0xc200];

/// The `d3d12FeatureLevel` fact for the level D3D12 answered (`MaxSupportedFeatureLevel`): its
/// name (`12_1`) when it is one of [`D3D12_FEATURE_LEVELS`]; `None` for any other answer.
pub fn d3d12_feature_level(max_supported: u32) -> Option<String> {
    D3D12_FEATURE_LEVELS
        .contains(&max_supported)
        .then(|| feature_level_name(max_supported))
}

/// A feature level's name (`12_1`) as (major, minor), for ordering: one or two digits (not
/// starting with 0), `_`, one digit. `None` for anything else (`1_0_CORE`, `12.1`).
pub fn parse_feature_level(name: &str) -> Option<(u32, u32)> {
    let (major, minor) = name.split_once('_')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(major)
        || major.len() > 2
        || major.starts_with('0')
        || !digits(minor)
        || minor.len() != 1
    {
        return None;
    }
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// `D3D_FEATURE_LEVEL_11_0`.
pub const FEATURE_LEVEL_11_0: u32 = 0xb000;
/// `D3D_FEATURE_LEVEL_1_0_CORE`: compute-only (MCDM) devices.
pub const FEATURE_LEVEL_1_0_CORE: u32 = 0x1000;

/// The feature levels to try, in order: 11_0 for a display (graphics) adapter, 1_0_CORE for a
/// compute-only one; when it is not known which (DXGI has no such attribute), 11_0 and then
/// 1_0_CORE.
pub fn feature_levels(graphics: Option<bool>) -> Vec<u32> {
    match graphics {
        Some(true) => vec![FEATURE_LEVEL_11_0],
        Some(false) => vec![FEATURE_LEVEL_1_0_CORE],
        None => vec![FEATURE_LEVEL_11_0, FEATURE_LEVEL_1_0_CORE],
    }
}

/// What the D3D12 probe saw on one adapter.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct D3d12Answer {
    /// Where the adapter was looked up: `DXCore`, or `DXGI (DXCore cannot be used here: …)`.
    pub enumerator: Option<String>,
    /// The adapter's description, when it was found.
    pub adapter: Option<String>,
    /// The feature level the device was created at, when it was.
    pub feature_level: Option<u32>,
    /// The first step that failed: the call and its HRESULT (or why).
    pub failed_step: Option<(String, String)>,
    /// Bytes read back that differ from those uploaded (first offsets), when the round trip
    /// ran.
    pub mismatches: Vec<usize>,
    /// Bytes compared.
    pub bytes: usize,
    /// Seconds the GPU work took (submission to read-back), when it ran.
    pub gpu_seconds: Option<f64>,
}

/// The byte pattern uploaded for the round trip: not constant, so a copy of the wrong range or
/// a cleared buffer shows.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 31 + 7) % 251) as u8 ^ ((i >> 8) as u8))
        .collect()
}

/// How many differing offsets the round trip records.
pub const MISMATCH_LIMIT: usize = 16;

/// Offsets where `got` differs from `want` (at most `limit` of them, and every offset past
/// `got`'s end when it is short).
pub fn mismatches(want: &[u8], got: &[u8], limit: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, w) in want.iter().enumerate() {
        if out.len() >= limit {
            break;
        }
        if got.get(i) != Some(w) {
            out.push(i);
        }
    }
    out
}

/// Judges the D3D12 probe on the adapter with LUID `luid`.
pub fn judge_d3d12(luid: i64, answer: &D3d12Answer) -> CheckResult {
    let mut c = CheckResult::new("d3d12", Outcome::Pass, String::new());
    c.device = Some(crate::luid::label(luid));
    let Some(adapter) = &answer.adapter else {
        c.result = Outcome::Fail;
        c.detail = format!(
            "no adapter with LUID {} is visible to {} in this container",
            crate::luid::label(luid),
            answer.enumerator.as_deref().unwrap_or("DXCore or DXGI")
        );
        return c.remedy(
            "the container did not get this GPU: see the adapters check and the pod's events",
        );
    };
    let level = answer
        .feature_level
        .map(|l| format!(" at feature level {}", feature_level_name(l)))
        .unwrap_or_default();
    if let Some((step, why)) = &answer.failed_step {
        c.result = Outcome::Fail;
        c.detail = format!("{adapter}{level}: {step} failed: {why}");
        return c.remedy(
            "D3D12 does not work on this adapter in the container: check the driver version (WDDM 2.5+ for containers), the node's event log, and `dxdp doctor` on the node",
        );
    }
    if !answer.mismatches.is_empty() {
        c.result = Outcome::Fail;
        let shown: Vec<String> = answer
            .mismatches
            .iter()
            .take(4)
            .map(usize::to_string)
            .collect();
        c.detail = format!(
            "{adapter}{level}: the buffer read back differs from the one uploaded at {} of {} bytes (first at offsets {})",
            if answer.mismatches.len() >= MISMATCH_LIMIT { format!("{MISMATCH_LIMIT} or more") } else { answer.mismatches.len().to_string() },
            answer.bytes,
            shown.join(", ")
        );
        return c.remedy(
            "the GPU copied wrong data: a faulty GPU or driver; drain the node and check the GPU",
        );
    }
    let timing = answer
        .gpu_seconds
        .map(|s| format!(" in {:.1} ms", s * 1000.0))
        .unwrap_or_default();
    c.detail = format!(
        "{adapter}{level}: compute queue, {} bytes uploaded, copied on the GPU and read back identical{timing}",
        answer.bytes
    );
    c
}

/// One runtime file's state in the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    /// The path in the container.
    pub path: String,
    /// Whether it exists.
    pub present: bool,
    /// For a DLL that exists: the loader's error, if it did not load.
    pub load_error: Option<String>,
}

/// Whether a runtime file is a DLL the loader should be able to load (its dependencies resolved).
pub fn is_loadable(path: &str) -> bool {
    path.to_ascii_lowercase().ends_with(".dll")
}

/// Parses `DXDP_RUNTIME_FILES`: container paths separated by `;`.
pub fn parse_runtime_files(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        if !out.iter().any(|o| o.eq_ignore_ascii_case(p)) {
            out.push(p.to_string());
        }
    }
    out
}

/// Judges the runtime files dxdp mounted.
pub fn judge_runtime_files(files: &[FileState]) -> CheckResult {
    let missing: Vec<&str> = files
        .iter()
        .filter(|f| !f.present)
        .map(|f| f.path.as_str())
        .collect();
    let broken: Vec<String> = files
        .iter()
        .filter_map(|f| f.load_error.as_ref().map(|e| format!("{} ({e})", f.path)))
        .collect();
    let dlls = files
        .iter()
        .filter(|f| f.present && is_loadable(&f.path))
        .count();
    if missing.is_empty() && broken.is_empty() {
        return CheckResult::new(
            "runtime-files",
            Outcome::Pass,
            format!(
                "{} file{} present, {dlls} DLL{} load with their dependencies",
                files.len(),
                if files.len() == 1 { "" } else { "s" },
                if dlls == 1 { "" } else { "s" }
            ),
        );
    }
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing: {}", missing.join(", ")));
    }
    if !broken.is_empty() {
        parts.push(format!("do not load: {}", broken.join(", ")));
    }
    CheckResult::new("runtime-files", Outcome::Fail, parts.join("; ")).remedy(
        "a file dxdp mounted is not in the container or a DLL's dependency is missing: compare `dxdp mounts` on the node with the driver store, and check the container runtime's log for mount errors",
    )
}

/// The short result a validation Job leaves in its termination message (at most 4 KiB, read by
/// the daemon from the pod's status): the verdict and each check's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The verdict.
    pub verdict: Verdict,
    /// `(check, outcome)` per check; a check that ran on several devices appears once with its
    /// worst outcome.
    pub checks: Vec<(String, Outcome)>,
    /// The checks that failed (or were unknown), in order.
    pub failed: Vec<String>,
}

/// The worse of two outcomes, for a check that ran several times.
fn worse(a: Outcome, b: Outcome) -> Outcome {
    let rank = |o: Outcome| match o {
        Outcome::Fail => 5,
        Outcome::TimedOut => 4,
        Outcome::Unknown => 3,
        Outcome::Pass => 2,
        Outcome::Absent => 1,
        Outcome::Skipped => 0,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// The summary of a run.
pub fn summary(checks: &[CheckResult]) -> Summary {
    let (v, failed) = verdict(checks);
    let mut out: Vec<(String, Outcome)> = Vec::new();
    for c in checks {
        match out.iter_mut().find(|(n, _)| *n == c.name) {
            Some((_, o)) => *o = worse(*o, c.result),
            None => out.push((c.name.clone(), c.result)),
        }
    }
    Summary {
        verdict: v,
        checks: out,
        failed,
    }
}

/// The termination-message line of a summary: `dxdp-validation v1 <verdict> <check>=<outcome>...`.
/// Plain words so that it stays small and readable in `kubectl describe pod`.
pub fn summary_line(s: &Summary) -> String {
    let mut line = format!("dxdp-validation v1 {}", s.verdict.as_str());
    for (name, o) in &s.checks {
        line.push_str(&format!(" {name}={}", o.as_str()));
    }
    line
}

/// Parses a termination message written by [`summary_line`] (the last such line wins; other
/// text is ignored). `None` when there is none.
pub fn parse_summary_line(text: &str) -> Option<Summary> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("dxdp-validation v1 "))?;
    let mut words = line.split_whitespace().skip(2);
    let verdict = match words.next()? {
        "pass" => Verdict::Pass,
        "fail" => Verdict::Fail,
        "unknown" => Verdict::Unknown,
        _ => return None,
    };
    let mut checks = Vec::new();
    for w in words {
        let (name, o) = w.split_once('=')?;
        let o = Outcome::ALL.into_iter().find(|x| x.as_str() == o)?;
        checks.push((name.to_string(), o));
    }
    let failed = checks
        .iter()
        .filter(|(_, o)| o.is_failure() || (verdict == Verdict::Unknown && *o == Outcome::Unknown))
        .map(|(n, _)| n.clone())
        .collect();
    Some(Summary {
        verdict,
        checks,
        failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, o: Outcome) -> CheckResult {
        CheckResult::new(name, o, "x")
    }

    #[test]
    fn verdicts_and_exit_codes() {
        assert_eq!(verdict(&[]), (Verdict::Unknown, vec![]));
        assert_eq!(
            verdict(&[c("d3d12", Outcome::Pass), c("cuda", Outcome::Absent)]),
            (Verdict::Pass, vec![])
        );
        assert_eq!(
            verdict(&[
                c("d3d12", Outcome::Pass),
                c("cuda", Outcome::TimedOut),
                c("adapters", Outcome::Unknown),
                c("vulkan", Outcome::Fail),
                c("cuda", Outcome::Fail),
            ]),
            (
                Verdict::Fail,
                vec!["cuda".to_string(), "vulkan".to_string()]
            )
        );
        assert_eq!(
            verdict(&[c("d3d12", Outcome::Pass), c("adapters", Outcome::Unknown)]),
            (Verdict::Unknown, vec!["adapters".to_string()])
        );
        // Only absent and skipped: nothing was proven.
        assert_eq!(
            verdict(&[c("cuda", Outcome::Absent), c("adapters", Outcome::Skipped)]),
            (Verdict::Unknown, vec![])
        );
        assert_eq!(Verdict::Pass.exit_code(), 0);
        assert_eq!(Verdict::Fail.exit_code(), 1);
        assert_eq!(Verdict::Unknown.exit_code(), 3);
        assert_eq!(Verdict::from_exit_code(2), None, "2 is a usage error");
        assert_eq!(Verdict::from_exit_code(1), Some(Verdict::Fail));
        assert_eq!(Verdict::from_exit_code(137), None);
    }

    #[test]
    fn an_api_the_driver_does_not_ship_is_absent_not_a_failure() {
        let r = judge_api(Api::Cuda, &ApiAnswer::NotShipped);
        assert_eq!(r.result, Outcome::Absent);
        assert_eq!(r.name, "cuda");
        assert!(r.detail.starts_with("nvcuda.dll is not in this container"));
    }

    #[test]
    fn api_answers_are_judged() {
        let r = judge_api(
            Api::Cuda,
            &ApiAnswer::CallFailed {
                call: "cuInit(0)".into(),
                code: 100,
            },
        );
        assert_eq!(r.result, Outcome::Fail);
        assert_eq!(r.detail, "cuInit(0) returned 100 (CUDA_ERROR_NO_DEVICE)");
        assert!(r.remedy.is_some());
        let r = judge_api(
            Api::Vulkan,
            &ApiAnswer::Answered {
                version: Some("1.3.2".into()),
                devices: vec!["NVIDIA A10".into()],
                needs_device: true,
            },
        );
        assert_eq!(r.result, Outcome::Pass);
        assert_eq!(
            r.detail,
            "vulkan-1.dll version 1.3.2 answers, 1 device: NVIDIA A10"
        );
        let r = judge_api(
            Api::Opencl,
            &ApiAnswer::Answered {
                version: None,
                devices: vec![],
                needs_device: true,
            },
        );
        assert_eq!(r.result, Outcome::Fail);
        assert_eq!(r.detail, "OpenCL.dll answers but lists no device");
        let r = judge_api(
            Api::Nvenc,
            &ApiAnswer::Answered {
                version: Some(nvenc_version(0xc2)),
                devices: vec![],
                needs_device: false,
            },
        );
        assert_eq!(r.result, Outcome::Pass);
        assert_eq!(r.detail, "nvEncodeAPI64.dll version 12.2 answers");
        let r = judge_api(Api::Amf, &ApiAnswer::LoadFailed("error 126".into()));
        assert_eq!(r.result, Outcome::Fail);
        assert_eq!(
            r.detail,
            "amfrt64.dll is in this container but does not load: error 126"
        );
        let r = judge_api(Api::Nvml, &ApiAnswer::NoEntryPoint("nvmlInit_v2".into()));
        assert_eq!(r.result, Outcome::Fail);
    }

    #[test]
    fn versions_decode_as_documented() {
        assert_eq!(nvenc_version((12 << 4) | 1), "12.1");
        assert_eq!(
            amf_version((1 << 48) | (4 << 32) | (33 << 16) | 2),
            "1.4.33.2"
        );
        assert_eq!(cuda_version(12040), "12.4");
        assert_eq!(vulkan_version((1 << 22) | (3 << 12) | 250), "1.3.250");
        assert_eq!(c_string(b"llvmpipe\0junk"), "llvmpipe");
        assert_eq!(c_string(b"no-nul"), "no-nul");
        assert_eq!(feature_level_name(FEATURE_LEVEL_11_0), "11_0");
        assert_eq!(feature_level_name(0xc100), "12_1");
        assert_eq!(feature_level_name(FEATURE_LEVEL_1_0_CORE), "1_0_CORE");
    }

    #[test]
    fn d3d12_feature_level_facts_and_their_order() {
        // D3D_FEATURE_LEVEL values from d3dcommon.h, written out.
        for (value, want) in [
            (0xb000, Some("11_0")),
            (0xb100, Some("11_1")),
            (0xc000, Some("12_0")),
            (0xc100, Some("12_1")),
            (0xc200, Some("12_2")),
            (0xa100, None),
            (0x1000, None),
            (0xc300, None),
            (0, None),
        ] {
            assert_eq!(d3d12_feature_level(value).as_deref(), want, "{value:#x}");
        }
        for (name, want) in [
            ("11_0", Some((11, 0))),
            ("12_2", Some((12, 2))),
            ("9_3", Some((9, 3))),
            ("1_0_CORE", None),
            ("12.1", None),
            ("12_", None),
            ("_1", None),
            ("012_1", None),
            ("12_10", None),
            ("123_1", None),
            ("+1_0", None),
            ("", None),
        ] {
            assert_eq!(parse_feature_level(name), want, "{name:?}");
        }
    }

    #[test]
    fn feature_levels_follow_the_adapter_kind() {
        assert_eq!(feature_levels(Some(true)), vec![0xb000]);
        assert_eq!(feature_levels(Some(false)), vec![0x1000]);
        assert_eq!(feature_levels(None), vec![0xb000, 0x1000]);
    }

    #[test]
    fn the_round_trip_is_judged_byte_for_byte() {
        let p = pattern(4096);
        assert_eq!(&p[..6], &[7, 38, 69, 100, 131, 162]);
        assert_eq!(p[503], 39, "the high byte of the offset is mixed in");
        let mut got = p.clone();
        assert!(mismatches(&p, &got, 16).is_empty());
        got[100] ^= 1;
        got[4000] = 0;
        assert_eq!(mismatches(&p, &got, 16), vec![100, 4000]);
        assert_eq!(mismatches(&p, &p[..4094], 16), vec![4094, 4095]);
        let ok = D3d12Answer {
            enumerator: Some("DXCore".into()),
            adapter: Some("NVIDIA A10".into()),
            feature_level: Some(FEATURE_LEVEL_11_0),
            failed_step: None,
            mismatches: vec![],
            bytes: 65536,
            gpu_seconds: Some(0.0025),
        };
        let r = judge_d3d12(7048070, &ok);
        assert_eq!(r.result, Outcome::Pass);
        assert_eq!(r.device.as_deref(), Some("0x00000000_0x006B8B86"));
        assert_eq!(
            r.detail,
            "NVIDIA A10 at feature level 11_0: compute queue, 65536 bytes uploaded, copied on the GPU and read back identical in 2.5 ms"
        );
        let bad = D3d12Answer {
            mismatches: vec![100, 4000],
            ..ok.clone()
        };
        let r = judge_d3d12(1, &bad);
        assert_eq!(r.result, Outcome::Fail);
        assert_eq!(r.detail, "NVIDIA A10 at feature level 11_0: the buffer read back differs from the one uploaded at 2 of 65536 bytes (first at offsets 100, 4000)");
        let step = D3d12Answer {
            feature_level: None,
            failed_step: Some(("D3D12CreateDevice".into(), "0x887A0004".into())),
            ..ok.clone()
        };
        assert_eq!(
            judge_d3d12(1, &step).detail,
            "NVIDIA A10: D3D12CreateDevice failed: 0x887A0004"
        );
        let none = D3d12Answer::default();
        assert_eq!(judge_d3d12(5, &none).result, Outcome::Fail);
        let unknown = D3d12Answer {
            enumerator: Some("DXCore".into()),
            ..D3d12Answer::default()
        };
        assert_eq!(
            judge_d3d12(5, &unknown).detail,
            "no adapter with LUID 0x00000000_0x00000005 is visible to DXCore in this container"
        );
    }

    #[test]
    fn runtime_files_are_present_and_load() {
        assert_eq!(
            parse_runtime_files(
                r" C:\Windows\System32\nvcuda.dll;;c:\windows\system32\NVCUDA.dll;C:\Windows\System32\nvapi64.dll "
            ),
            vec![
                r"C:\Windows\System32\nvcuda.dll".to_string(),
                r"C:\Windows\System32\nvapi64.dll".to_string()
            ]
        );
        let ok = [
            FileState {
                path: "a.dll".into(),
                present: true,
                load_error: None,
            },
            FileState {
                path: "b.json".into(),
                present: true,
                load_error: None,
            },
        ];
        let r = judge_runtime_files(&ok);
        assert_eq!(r.result, Outcome::Pass);
        assert_eq!(
            r.detail,
            "2 files present, 1 DLL load with their dependencies"
        );
        let bad = [
            FileState {
                path: "a.dll".into(),
                present: false,
                load_error: None,
            },
            FileState {
                path: "c.dll".into(),
                present: true,
                load_error: Some("error 126".into()),
            },
        ];
        let r = judge_runtime_files(&bad);
        assert_eq!(r.result, Outcome::Fail);
        assert_eq!(r.detail, "missing: a.dll; do not load: c.dll (error 126)");
    }

    #[test]
    fn the_summary_line_round_trips_and_fits_a_termination_message() {
        let mut checks = vec![
            c("adapters", Outcome::Pass),
            c("d3d12", Outcome::Pass),
            c("d3d12", Outcome::Fail),
            c("runtime-files", Outcome::Pass),
        ];
        for api in Api::ALL {
            checks.push(c(api.name(), Outcome::Absent));
        }
        checks.push(c("cuda", Outcome::TimedOut));
        let s = summary(&checks);
        let line = summary_line(&s);
        assert_eq!(line, "dxdp-validation v1 fail adapters=pass d3d12=fail runtime-files=pass cuda=timed-out nvml=absent opencl=absent vulkan=absent nvenc=absent amf=absent vpl=absent");
        assert!(line.len() < 4096);
        let back = parse_summary_line(&format!("some log\n{line}\n")).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.failed, vec!["d3d12".to_string(), "cuda".to_string()]);
        assert_eq!(parse_summary_line("nothing here"), None);
        assert_eq!(parse_summary_line("dxdp-validation v1 maybe"), None);
        assert_eq!(parse_summary_line("dxdp-validation v1 pass x=odd"), None);
    }

    #[test]
    fn api_names_round_trip() {
        for api in Api::ALL {
            assert_eq!(Api::from_name(api.name()), Some(api));
        }
        assert_eq!(Api::from_name("d3d12"), None);
    }
}
