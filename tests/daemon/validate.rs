//! `dxdp validate` for real: on Windows (and under Wine, where .ci/windows.sh runs this file
//! under `xvfb-run` so that DXGI and D3D12 work on Mesa's software Vulkan device) a D3D12 round
//! trip on a real adapter, and the vendor API probes against stand-in DLLs
//! (tests/wine/vendor-standin.c, built beside the test executable) that answer, are missing,
//! fail to initialise, lack an entry point, or hang. On every platform: the command line.
//!
//! A test that cannot run says `skipped NAME: why` (.ci/windows.sh fails on it).

use std::path::Path;
use std::process::Command;

#[cfg(windows)]
use serde_json::Value;

fn dxdp() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dxdp"))
}

/// The checks of a `Validation` document by name, with their results.
#[cfg(windows)]
fn results(doc: &Value) -> Vec<(String, String)> {
    doc["checks"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    (
                        c["name"].as_str().unwrap_or_default().to_string(),
                        c["result"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(windows)]
fn check<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["checks"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no check {name} in {doc}"))
}

#[test]
fn the_summary_file_holds_the_verdict_line_and_unknown_apis_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("termination-log");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/telemetry-t4.yaml");
    let out = dxdp()
        .args(["validate", "--api", "cuda,vulkan", "--summary-file"])
        .arg(&summary)
        .arg("--host-snapshot")
        .arg(&fixture)
        .env_clear()
        .env("DXDP_ADAPTER_LUIDS", "7048070")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if cfg!(windows) {
        // The host snapshot decides the adapters; the probes are this machine's.
        assert!(text.starts_with("Validation "), "{text}");
    } else {
        assert_eq!(out.status.code(), Some(3), "{text}");
        assert_eq!(
            std::fs::read_to_string(&summary).unwrap(),
            "dxdp-validation v1 unknown adapters=pass d3d12=unknown runtime-files=skipped cuda=unknown vulkan=unknown\n"
        );
        assert!(
            text.starts_with(
                "Validation UNKNOWN: could not tell (d3d12, cuda, vulkan) (exit code 3)\n"
            ),
            "{text}"
        );
    }
    let out = dxdp()
        .args(["validate", "--api", "directx"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "unknown API \"directx\": use one of cuda, nvml, opencl, vulkan, nvenc, amf, vpl"
        ),
        "{err}"
    );
}

/// A directory holding the stand-in under the DLL name of every API.
#[cfg(windows)]
fn standins(which: &[&str]) -> Option<tempfile::TempDir> {
    let exe = std::env::current_exe().ok()?;
    let built = exe.parent()?.join("vendor-standin.dll");
    if !built.is_file() {
        return None;
    }
    let dir = tempfile::tempdir().ok()?;
    for name in which {
        std::fs::copy(&built, dir.path().join(name)).ok()?;
    }
    Some(dir)
}

#[cfg(windows)]
const ALL_DLLS: [&str; 7] = [
    "nvcuda.dll",
    "nvml.dll",
    "OpenCL.dll",
    "vulkan-1.dll",
    "nvEncodeAPI64.dll",
    "amfrt64.dll",
    "libvpl.dll",
];

#[cfg(windows)]
fn validate_in(
    dir: &Path,
    mode: &str,
    extra: &[&str],
) -> (Option<i32>, Value, std::time::Duration) {
    let start = std::time::Instant::now();
    let out = dxdp()
        .args(["validate", "-o", "json", "--timeout", "3", "--library-dir"])
        .arg(dir)
        .args(extra)
        .env("DXDP_STANDIN_MODE", mode)
        .env_remove("DXDP_ADAPTER_LUIDS")
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), doc, start.elapsed())
}

#[cfg(windows)]
#[test]
fn vendor_apis_that_answer_are_missing_fail_or_lack_an_entry_point() {
    let Some(dir) = standins(&ALL_DLLS) else {
        eprintln!("skipped vendor_apis_that_answer_are_missing_fail_or_lack_an_entry_point: vendor-standin.dll is not beside the test executable (.ci/windows.sh builds it from tests/wine/vendor-standin.c)");
        return;
    };
    let (_, doc, _) = validate_in(dir.path(), "ok", &[]);
    let want = [
        (
            "cuda",
            "nvcuda.dll version 12.4 answers, 1 device: Stand-in GPU",
        ),
        ("nvml", "nvml.dll answers, 1 device: Stand-in GPU"),
        ("opencl", "OpenCL.dll answers, 1 device: Stand-in GPU"),
        (
            "vulkan",
            "vulkan-1.dll version 1.3.250 answers, 1 device: Stand-in GPU",
        ),
        ("nvenc", "nvEncodeAPI64.dll version 12.2 answers"),
        ("amf", "amfrt64.dll version 1.4.33.2 answers"),
        (
            "vpl",
            "libvpl.dll version 2.10 answers, 1 device: Stand-in VPL",
        ),
    ];
    for (name, detail) in want {
        let c = check(&doc, name);
        assert_eq!(c["result"], "pass", "{name}: {c}");
        assert_eq!(c["detail"], detail, "{name}");
    }
    let (_, doc, _) = validate_in(dir.path(), "fail", &[]);
    let want = [
        ("cuda", "cuInit(0) returned 100 (CUDA_ERROR_NO_DEVICE)"),
        (
            "nvml",
            "nvmlInit_v2 returned 9 (NVML_ERROR_DRIVER_NOT_LOADED)",
        ),
        (
            "opencl",
            "clGetPlatformIDs returned -1001 (CL_PLATFORM_NOT_FOUND_KHR)",
        ),
        (
            "vulkan",
            "vkCreateInstance returned -3 (VK_ERROR_INITIALIZATION_FAILED)",
        ),
        (
            "nvenc",
            "NvEncodeAPIGetMaxSupportedVersion returned 1 (NV_ENC_ERR_NO_ENCODE_DEVICE)",
        ),
        ("amf", "AMFQueryVersion returned 1 (AMF_FAIL)"),
        ("vpl", "MFXLoad (returned no loader) returned 0"),
    ];
    for (name, detail) in want {
        let c = check(&doc, name);
        assert_eq!(c["result"], "fail", "{name}: {c}");
        assert_eq!(c["detail"], detail, "{name}");
    }
    assert_eq!(doc["verdict"], "fail");
    // Missing: an empty directory; the driver ships none of them.
    let empty = tempfile::tempdir().unwrap();
    let (_, doc, _) = validate_in(empty.path(), "ok", &[]);
    for name in ["cuda", "nvml", "opencl", "vulkan", "nvenc", "amf", "vpl"] {
        assert_eq!(check(&doc, name)["result"], "absent", "{name}");
    }
    // A DLL of the right name without the API's entry points (the ProcessPrng stand-in).
    let exe = std::env::current_exe().unwrap();
    let other = exe.parent().unwrap().join("bcryptprimitives.dll");
    if other.is_file() {
        std::fs::copy(&other, empty.path().join("nvcuda.dll")).unwrap();
        let (_, doc, _) = validate_in(empty.path(), "ok", &["--api", "cuda"]);
        let c = check(&doc, "cuda");
        assert_eq!(c["result"], "fail");
        assert_eq!(
            c["detail"],
            "nvcuda.dll loads but does not export cuInit: not the library cuda documents (a stub or a wrong copy?)"
        );
    }
}

#[cfg(windows)]
#[test]
fn a_vendor_api_that_hangs_times_out_and_the_command_still_returns() {
    let Some(dir) = standins(&["nvcuda.dll", "amfrt64.dll"]) else {
        eprintln!("skipped a_vendor_api_that_hangs_times_out_and_the_command_still_returns: vendor-standin.dll is not beside the test executable (.ci/windows.sh builds it)");
        return;
    };
    let (code, doc, took) = validate_in(dir.path(), "hang", &["--api", "cuda,amf"]);
    assert_eq!(code, Some(1), "{doc}");
    for name in ["cuda", "amf"] {
        let c = check(&doc, name);
        assert_eq!(c["result"], "timed-out", "{name}: {c}");
        assert!(
            c["detail"]
                .as_str()
                .unwrap()
                .contains("did not finish within 3 s"),
            "{c}"
        );
    }
    assert_eq!(doc["failed"][0], "cuda");
    // Two 3 s limits and the rest: far below what a hung call would take.
    assert!(took < std::time::Duration::from_secs(60), "{took:?}");
}

#[cfg(windows)]
#[test]
fn d3d12_round_trip_on_a_real_adapter() {
    use dxdp::backend::probe::{NativeProbes, Probes};
    use dxdp_core::validation::{feature_levels, judge_d3d12, Outcome};
    let probes = NativeProbes;
    let adapters = match probes.dxgi_adapters() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("skipped d3d12_round_trip_on_a_real_adapter: DXGI lists no adapter here ({e}); under Wine it needs a display (xvfb-run) and a Vulkan device (mesa-vulkan-drivers, libvkd3d1)");
            return;
        }
    };
    let Some((luid, name, _)) = adapters.iter().find(|(_, _, software)| !software).cloned() else {
        eprintln!("skipped d3d12_round_trip_on_a_real_adapter: DXGI lists only software adapters: {adapters:?}");
        return;
    };
    let answer = probes
        .d3d12(
            luid,
            &feature_levels(None),
            1 << 20,
            std::time::Duration::from_secs(60),
        )
        .unwrap();
    let c = judge_d3d12(luid, &answer);
    assert_eq!(c.result, Outcome::Pass, "{c:?}");
    assert_eq!(answer.adapter.as_deref(), Some(name.as_str()));
    // Wine has no dxcore.dll: the adapter was looked up in DXGI, and the answer says why.
    assert!(
        answer
            .enumerator
            .as_deref()
            .is_some_and(|e| e.starts_with("DXGI (DXCore cannot be used here: ")),
        "{:?}",
        answer.enumerator
    );
    assert_eq!(answer.bytes, 1 << 20);
    assert!(answer.mismatches.is_empty());
    assert!(answer.feature_level.is_some());
    assert!(answer.gpu_seconds.is_some());
    // The same through the command, given that adapter as dxdp would: the adapters check
    // through DXGI (no DXCore under Wine), D3D12 on it, and nothing else failing.
    let out = dxdp()
        .args([
            "validate",
            "-o",
            "json",
            "--timeout",
            "60",
            "--api",
            "nvenc",
        ])
        .env("DXDP_ADAPTER_LUIDS", luid.to_string())
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("{:?}", results(&doc));
    assert_eq!(check(&doc, "adapters")["result"], "pass", "{doc}");
    let d3d12 = check(&doc, "d3d12");
    assert_eq!(d3d12["result"], "pass", "{doc}");
    assert_eq!(d3d12["device"], dxdp_core::luid::label(luid));
    assert_ne!(check(&doc, "nvenc")["result"], "fail");
    assert_eq!(out.status.code(), Some(0), "{doc}");
}
