//! Missing GPUs (issue 45): `health.expectedDevices` expects two display GPUs on a node whose
//! second T4 is gone (tests/fixtures/health/gpu-missing.yaml, the telemetry-t4 node with one
//! adapter left); `dxdp discover` (text and JSON) and `dxdp doctor` say so. The expected lines
//! are written out here.

use std::path::Path;
use std::process::{Command, Output};

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// `dxdp` on the fixture host with the configuration expecting two display GPUs (`config`
/// `None`: no configuration file), in a cleared environment.
fn dxdp(args: &[&str], config: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dxdp"));
    cmd.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    let host = fixture("health/gpu-missing.yaml");
    cmd.args(["--host-snapshot", host.as_str()]).args(args);
    match config {
        Some(c) => cmd.args(["--config", &fixture(c)]),
        // A path that does not exist and is not required: the defaults.
        None => cmd.env("DXDP_REFERENCE_CONFIG_DIR", ""),
    };
    cmd.output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const EXPECT_TWO: &str = "health/expect-two.yaml";

/// The warning, as `discover` prints it and as JSON carries it.
const WARNING: &str = "1 GPU(s) missing: 1 of 2 expected display device(s) found (health.expectedDevices); a GPU the VM size should have is gone: see docs/alerts.md#dxdpgpumissing";

/// `dxdp discover` of the fixture with the configuration, in full.
const DISCOVER: &str = "\
Host: Windows Server 2022 Datacenter 21H2 build 10.0.20348.1547, HCS schema 2.5
1 device, 0 excluded, 1 warning

INDEX  ID                                   RESOURCE  HEALTH   LUID                   MEMORY    DESCRIPTION
0      pciroot-0-pci-1b00-0540e5ad73bf260f  display   Healthy  0x00000000_0x006B8B86  15.0 GiB  NVIDIA Tesla T4

Warnings:
  - 1 GPU(s) missing: 1 of 2 expected display device(s) found (health.expectedDevices); a GPU the VM size should have is gone: see docs/alerts.md#dxdpgpumissing [gpu-missing]

Every property and runtime file: dxdp discover --details; flags for one device: dxdp mounts --index N
";

#[test]
fn discover_says_one_gpu_of_two_is_missing() {
    let o = dxdp(&["discover"], Some(EXPECT_TWO));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(stdout(&o), DISCOVER);
    // Without the expectation, one device and nothing missing.
    let plain = stdout(&dxdp(&["discover"], None));
    assert!(
        plain.contains("\n1 device, 0 excluded, 0 warnings\n"),
        "{plain}"
    );
    assert!(!plain.contains("gpu-missing"), "{plain}");
}

#[test]
fn discover_json_carries_the_gpu_missing_warning() {
    let o = dxdp(&["discover", "-o", "json"], Some(EXPECT_TWO));
    assert!(o.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["devices"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        doc["warnings"],
        serde_json::json!([{
            "code": "gpu-missing",
            "device": null,
            "luid": null,
            "message": WARNING,
        }])
    );
}

#[test]
fn doctor_warns_that_a_gpu_is_missing() {
    let o = dxdp(&["doctor"], Some(EXPECT_TWO));
    let text = stdout(&o);
    // The rest (containerd, the kubelet directory) depends on the machine running the test.
    assert!(
        text.contains(
            "\
WARN  expected GPUs                              GPUs missing: display: 1 of 2 expected GPU(s) found (health.expectedDevices)
      -> a GPU this node should have is gone: see docs/alerts.md#dxdpgpumissing (Device Manager, the VM size, the host's GPU assignment)
"
        ),
        "{text}"
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&dxdp(&["doctor", "-o", "json"], Some(EXPECT_TWO)).stdout).unwrap();
    let check = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "expected GPUs")
        .cloned();
    assert_eq!(
        check,
        Some(serde_json::json!({
            "name": "expected GPUs",
            "status": "WARN",
            "detail": "GPUs missing: display: 1 of 2 expected GPU(s) found (health.expectedDevices)",
            "remedy": "a GPU this node should have is gone: see docs/alerts.md#dxdpgpumissing (Device Manager, the VM size, the host's GPU assignment)",
        }))
    );
    // Without an expectation doctor has no such check.
    let plain = stdout(&dxdp(&["doctor"], None));
    assert!(!plain.contains("expected GPUs"), "{plain}");
}

#[test]
fn config_show_prints_the_expectation() {
    let o = Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .env_clear()
        .args(["config", "show", "--config", &fixture(EXPECT_TWO)])
        .output()
        .unwrap();
    let text = stdout(&o);
    let line = text
        .lines()
        .find(|l| l.starts_with("health.expectedDevices:"))
        .unwrap_or_default();
    assert!(
        line.starts_with(r#"health.expectedDevices: {"compute":null,"display":2}  # file "#),
        "{text}"
    );
}
