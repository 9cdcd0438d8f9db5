//! The `dxdp` binary end to end: options, output streams, exit codes and error messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn dxdp(args: &[&str]) -> Output {
    dxdp_env(args, &[])
}

fn dxdp_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    // A cleared environment: nothing from the machine running the tests (DXDP_*, the reference
    // plugin's variables, RUST_LOG, CONTAINER_SANDBOX_MOUNT_POINT, ...) can change an outcome.
    // PATH is kept only so that the probes `doctor` runs behave as on a bare machine.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dxdp"));
    cmd.args(args).env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the dxdp binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn assert_no_panic(o: &Output) {
    assert!(!stderr(o).contains("panicked"), "panic: {}", stderr(o));
}

#[test]
fn version_and_help_for_every_command() {
    let v = dxdp(&["--version"]);
    assert!(v.status.success());
    assert!(stdout(&v).starts_with(&format!("dxdp {} (commit ", env!("CARGO_PKG_VERSION"))));
    for args in [
        vec!["--help"],
        vec!["discover", "--help"],
        vec!["snapshot", "--help"],
        vec!["plugin", "--help"],
        vec!["demo", "--help"],
        vec!["help", "discover"],
    ] {
        let o = dxdp(&args);
        assert!(o.status.success(), "{args:?}");
        assert!(
            stdout(&o).contains("Usage: dxdp"),
            "{args:?}: {}",
            stdout(&o)
        );
        assert!(
            stdout(&o).contains("--host-snapshot"),
            "{args:?} lacks the global option"
        );
    }
}

#[test]
fn sample_host_is_used_and_announced_on_stderr() {
    let o = dxdp(&["discover", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&o)).expect("stdout is one JSON document");
    assert_eq!(json["devices"].as_array().unwrap().len(), 3);
    assert!(stderr(&o).contains("simulated host"), "{}", stderr(&o));
    // Notices are shown whatever the log level.
    for args in [
        vec!["discover", "--log-level", "error"],
        vec![
            "mounts",
            "--all",
            "--format",
            "docker",
            "--log-level",
            "off",
        ],
    ] {
        let o = dxdp(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("note: simulated host"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    let o = dxdp(&[
        "mounts",
        "--all",
        "--format",
        "docker",
        "--log-level",
        "off",
    ]);
    assert!(
        stderr(&o).matches("note: ").count() >= 2,
        "the Docker notes too: {}",
        stderr(&o)
    );
}

#[test]
fn global_options_work_before_and_after_the_subcommand_and_from_the_environment() {
    let f = fixture("amd-radeon.yaml");
    let before = dxdp(&["--host-snapshot", &f, "discover", "--json"]);
    let after = dxdp(&["discover", "--json", "--host-snapshot", &f]);
    let env = dxdp_env(&["discover", "--json"], &[("DXDP_HOST_SNAPSHOT", &f)]);
    assert!(before.status.success() && after.status.success() && env.status.success());
    assert_eq!(stdout(&before), stdout(&after));
    assert_eq!(stdout(&before), stdout(&env));
    assert!(stdout(&before).contains("Radeon Pro V520"));
    assert!(stderr(&before).contains("amd-radeon.yaml"));
}

#[test]
fn human_output_has_devices_exclusions_and_warnings() {
    let o = dxdp(&[
        "discover",
        "--details",
        "--host-snapshot",
        &fixture("broken-drivers.yaml"),
    ]);
    assert!(o.status.success());
    let out = stdout(&o);
    let devices = out.find("Device ").unwrap();
    let excluded = out.find("Excluded adapters:").unwrap();
    let warnings = out.find("Warnings:").unwrap();
    assert!(devices < excluded && excluded < warnings, "{out}");
    assert!(out.contains("nvcuda_loader64.dll => nvcuda.dll"));
}

#[test]
fn include_flags_reach_the_pipeline() {
    let f = fixture("intel-igpu.yaml");
    let off: serde_json::Value =
        serde_json::from_slice(&dxdp(&["discover", "--json", "--host-snapshot", &f]).stdout)
            .unwrap();
    let on: serde_json::Value = serde_json::from_slice(
        &dxdp(&[
            "discover",
            "--json",
            "--include-integrated",
            "--host-snapshot",
            &f,
        ])
        .stdout,
    )
    .unwrap();
    assert_eq!(off["devices"].as_array().unwrap().len(), 1);
    assert_eq!(on["devices"].as_array().unwrap().len(), 2);
}

#[test]
fn missing_snapshot_names_the_path_and_fails() {
    let o = dxdp(&["discover", "--host-snapshot", "/no/such/host.yaml"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("/no/such/host.yaml"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
    assert_no_panic(&o);
}

#[test]
fn malformed_snapshots_name_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str]); 4] = [
        (
            "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\nadapters:\n  - luid: 1\n    hardwareId: {vendorId: 0x10DE, deviceId: 1}\n    isHardware: yes-please\n",
            &[":6:", "adapters[0].isHardware"],
        ),
        ("apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\nadapter: []\n", &[":3:", "unknown field `adapter`"]),
        ("apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\nfiles: [\n", &["bad.yaml:"]),
        ("\u{0}\u{1}binary garbage", &["bad.yaml"]),
    ];
    for (text, fragments) in cases {
        let path: PathBuf = dir.path().join("bad.yaml");
        std::fs::write(&path, text).unwrap();
        let o = dxdp(&["discover", "--host-snapshot", path.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{text:?}");
        let err = stderr(&o);
        for fragment in fragments {
            assert!(
                err.contains(fragment),
                "{text:?}: `{err}` lacks `{fragment}`"
            );
        }
        assert_no_panic(&o);
    }
}

#[test]
fn snapshot_command_round_trips_through_discover() {
    let dir = tempfile::tempdir().unwrap();
    for (source, format) in [
        (None, "yaml"),
        (None, "json"),
        (Some(fixture("hostile-registry.yaml")), "yaml"),
    ] {
        let out = dir.path().join(format!("snap.{format}"));
        let out_s = out.to_str().unwrap();
        let mut args = vec!["snapshot", "-o", out_s, "--format", format];
        if let Some(f) = &source {
            args.extend(["--host-snapshot", f.as_str()]);
        }
        let o = dxdp(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let mut original = vec!["discover", "--json"];
        if let Some(f) = &source {
            original.extend(["--host-snapshot", f.as_str()]);
        }
        let a = dxdp(&original);
        let b = dxdp(&["discover", "--json", "--host-snapshot", out_s]);
        assert!(b.status.success(), "{}", stderr(&b));
        assert_eq!(stdout(&a), stdout(&b), "{source:?} {format}");
    }
}

#[test]
fn snapshot_to_stdout_is_a_snapshot_document() {
    let o = dxdp(&["snapshot"]);
    assert!(o.status.success());
    assert!(
        stdout(&o).starts_with("apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\n"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn json_logs_are_json_lines_on_stderr() {
    let o = dxdp(&["discover", "--json", "--log-format", "json"]);
    assert!(o.status.success());
    let err = stderr(&o);
    assert!(!err.trim().is_empty());
    for line in err.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert!(v.get("level").is_some(), "{line}");
    }
    serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("stdout stays pure JSON");
}

#[test]
fn bad_option_values_are_rejected_with_a_message() {
    let o = dxdp(&["discover", "--log-format", "xml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("xml"), "{}", stderr(&o));
    let o = dxdp(&["discover", "--log-level", "loud=="]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("invalid log level"), "{}", stderr(&o));
    let o = dxdp(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn demo_shows_registration_lists_and_what_containerd_receives() {
    let o = dxdp(&["demo"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for fragment in [
        "1. Registration",
        "directx.microsoft.com/display    version v1beta1",
        "directx.microsoft.com/compute    version v1beta1",
        "2. Advertised devices",
        "3. Allocate one directx.microsoft.com/display device",
        "preferredAllocation=true",
        "GetPreferredAllocation: 1 of 2 available IDs (policy spread)",
        "Plugin prefers:   pciroot-0-pci-0100-",
        "A second pod: GetPreferredAllocation without pciroot-0-pci-0100-",
        "Plugin prefers:   pciroot-0-pci-0200-",
        "env     DXDP_ADAPTER_LUIDS=55027",
        "annot.  directx.microsoft.com/display.location-paths: PCIROOT(0)#PCI(0100)#PCI(0000)",
        "4. Allocate one directx.microsoft.com/compute device",
        "device  vpci-location-path://PCIROOT(0)#PCI(0100)#PCI(0000)  (container path \"\", permissions \"\")",
        r"mount   C:\Windows\System32\nvcuda.dll  <=  ",
        r"mount   C:\Windows\SysWOW64\nvcuda.dll  <=  ",
        "none of its sockets left behind",
        // Memory sharing, on for the compute class to show it: the A100's 80 GiB less 1 GiB
        // kept back is 79 units of 1 GiB, and a pod of 4 units is told its 4 GiB.
        "Memory sharing:    on for compute GPUs",
        "directx.microsoft.com/compute-memory version v1beta1",
        "directx.microsoft.com/compute-memory: 79 devices",
        "pciroot-0-pci-0300-pci-0000-4a1450fd9e47b7a5-m0 .. -m78",
        "(none advertised whole: compute GPUs with memory units are advertised under directx.microsoft.com/compute-memory)",
        "5. Allocate 4 directx.microsoft.com/compute-memory units (4 x 1 GiB, on one GPU)",
        "Plugin prefers:   pciroot-0-pci-0300-pci-0000-4a1450fd9e47b7a5-m0, pciroot-0-pci-0300-pci-0000-4a1450fd9e47b7a5-m1, pciroot-0-pci-0300-pci-0000-4a1450fd9e47b7a5-m2, pciroot-0-pci-0300-pci-0000-4a1450fd9e47b7a5-m3",
        "env     DXDP_GPU_MEMORY_LIMIT_BYTES=4294967296",
        "annot.  directx.microsoft.com/compute.memory-limit-bytes: 4294967296",
        "Plugin prefers:   pciroot-0-pci-0300-pci-0000-4a1450fd9e47b7a5-m4,",
    ] {
        assert!(out.contains(fragment), "demo output lacks {fragment:?}:\n{out}");
    }
    assert!(!out.contains("read-write"));
}

#[test]
fn demo_on_a_host_without_compute_devices_says_so() {
    let o = dxdp(&["demo", "--host-snapshot", &fixture("nvidia-multi-gpu.yaml")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("directx.microsoft.com/compute: 0 devices"));
    assert!(stdout(&o).contains("(no healthy compute device on this host)"));
}

#[test]
fn plugin_rejects_bad_settings_clearly() {
    for replicas in ["0", "65", "many"] {
        let o = dxdp(&["plugin", "--replicas", replicas]);
        assert_eq!(o.status.code(), Some(2), "{replicas}");
        assert!(stderr(&o).contains("--replicas"), "{}", stderr(&o));
    }
    let long_dir = format!("/tmp/{}", "d".repeat(120));
    let o = dxdp(&[
        "plugin",
        "--kubelet-dir",
        &long_dir,
        "--host-snapshot",
        "builtin:sample",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("at most 107"), "{}", stderr(&o));
    assert_no_panic(&o);
    let dir = tempfile::tempdir().unwrap();
    let o = dxdp(&[
        "plugin",
        "--kubelet-dir",
        dir.path().to_str().unwrap(),
        "--host-snapshot",
        "/no/such/host.yaml",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("/no/such/host.yaml"), "{}", stderr(&o));
    let o = dxdp(&["plugin", "--resources", "gpu"]);
    assert_eq!(o.status.code(), Some(2));
    // Off Windows the sample host's fictitious GPUs are served only when asked for (issue 35).
    let o = dxdp(&["plugin", "--kubelet-dir", dir.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--host-snapshot builtin:sample to serve the built-in sample host"),
        "{}",
        stderr(&o)
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "nothing created in the kubelet directory"
    );
}

#[test]
fn mounts_selectors_combine_and_unknown_ones_are_named() {
    let json = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["mounts", "--format", "json"];
        all.extend_from_slice(args);
        let o = dxdp(&all);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let count = |v: &serde_json::Value| v["devices"].as_array().unwrap().len();
    assert_eq!(count(&json(&["--all"])), 3);
    assert_eq!(count(&json(&["--index", "0,2"])), 2);
    assert_eq!(count(&json(&["--index", "0", "--index", "0"])), 1);
    assert_eq!(count(&json(&["--display"])), 2);
    assert_eq!(count(&json(&["--compute", "--index", "0"])), 2);
    assert_eq!(count(&json(&["--vendor", "nvidia"])), 3);
    assert_eq!(
        count(&json(&[
            "--location-path",
            "PCIROOT(0)#PCI(0300)#PCI(0000)"
        ])),
        1
    );
    assert_eq!(count(&json(&["--luid", "55311"])), 1);
    // Nothing selected, or a selector that is not one: a usage error (2); a selector that
    // matches no device: an error (1).
    for (args, fragment, code) in [
        (vec!["mounts"], "select devices with", 2),
        (
            vec!["mounts", "--luid", "zz"],
            "--luid \"zz\" is not a LUID",
            2,
        ),
        (
            vec!["mounts", "--vendor", "acme"],
            "is not a vendor name",
            2,
        ),
        (vec!["mounts", "--index", "5"], "--index 5", 1),
        (vec!["mounts", "--vendor", "amd"], "--vendor amd", 1),
        (vec!["mounts", "--luid", "0x1"], "--luid 0x1", 1),
        (
            vec!["mounts", "--all", "--location-path", "PCIROOT(7)"],
            "--location-path PCIROOT(7)",
            1,
        ),
    ] {
        let o = dxdp(&args);
        assert_eq!(o.status.code(), Some(code), "{args:?}");
        assert!(stderr(&o).contains(fragment), "{args:?}: {}", stderr(&o));
        assert_no_panic(&o);
    }
}

#[test]
fn mounts_docker_format_warns_about_hcs_v1() {
    let o = dxdp(&["mounts", "--all", "--format", "docker"]);
    assert!(o.status.success());
    assert_eq!(
        stdout(&o).trim(),
        "--isolation process --device class/5B45201D-F2F2-4F3B-85BB-30FF1F953599"
    );
    assert!(
        stderr(&o).contains("cannot bind-mount single files"),
        "{}",
        stderr(&o)
    );
}

#[cfg(unix)]
#[test]
fn mounts_run_executes_ctr_and_propagates_its_exit_code() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("args.txt");
    let ctr = dir.path().join("ctr");
    std::fs::write(
        &ctr,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > '{}'\nexit 7\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&ctr, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = dxdp_env(
        &[
            "mounts",
            "--index",
            "2",
            "--run",
            "mcr.microsoft.com/windows/servercore:ltsc2022",
            "gpu-test",
            "cmd",
            "/c",
            "nvidia-smi.exe",
        ],
        &[("PATH", &path)],
    );
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("+ ctr run --rm --device"),
        "{}",
        stderr(&o)
    );
    let args = std::fs::read_to_string(&log).unwrap();
    let args: Vec<&str> = args.lines().collect();
    assert_eq!(
        &args[..4],
        [
            "run",
            "--rm",
            "--device",
            "vpci-location-path://PCIROOT(0)#PCI(0300)#PCI(0000)"
        ]
    );
    assert!(args.contains(&"--mount"));
    assert_eq!(
        &args[args.len() - 5..],
        [
            "mcr.microsoft.com/windows/servercore:ltsc2022",
            "gpu-test",
            "cmd",
            "/c",
            "nvidia-smi.exe"
        ]
    );

    // Global ctr arguments go before `run`; --id selects by kubelet device ID (a replica here).
    let ids = dxdp(&["discover", "--json"]);
    let ids: serde_json::Value = serde_json::from_slice(&ids.stdout).unwrap();
    let replica = format!("{}-r2", ids["devices"][1]["id"].as_str().unwrap());
    let o = dxdp_env(
        &[
            "mounts",
            "--id",
            &replica,
            "--ctr-arg",
            "--namespace=k8s.io",
            "--run",
            "img",
            "id",
        ],
        &[("PATH", &path)],
    );
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    let args = std::fs::read_to_string(&log).unwrap();
    let args: Vec<&str> = args.lines().collect();
    assert_eq!(
        &args[..5],
        [
            "--namespace=k8s.io",
            "run",
            "--rm",
            "--device",
            "vpci-location-path://PCIROOT(0)#PCI(0200)#PCI(0000)"
        ]
    );

    let empty = tempfile::tempdir().unwrap();
    let o = dxdp_env(
        &["mounts", "--all", "--run", "img", "id"],
        &[("PATH", empty.path().to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("`ctr` was not found on PATH"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn hcs_verdict_and_exit_code() {
    let o = dxdp(&["hcs"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        stdout(&o).contains("Verdict: Individual device assignment by location path is supported")
    );
    assert!(
        stdout(&o).contains("Configured assignment: auto (default): location-path"),
        "{}",
        stdout(&o)
    );
    // Windows Server 2019: the default auto works (as class-guid); location-path does not.
    let ws2019 = fixture("ws2019-old.yaml");
    let o = dxdp(&["hcs", "--json", "--host-snapshot", &ws2019]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["locationPathAssignment"], false);
    assert_eq!(v["recommendedAssignment"], "class-guid");
    assert_eq!(v["assignment"]["configured"], "auto");
    assert_eq!(v["assignment"]["inForce"], "class-guid");
    let o = dxdp(&[
        "hcs",
        "--assignment",
        "location-path",
        "--host-snapshot",
        &ws2019,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).contains("location-path needs HCS schema 2.2+"),
        "{}",
        stdout(&o)
    );
    // mounts follows the same flag: class-guid there.
    let o = dxdp(&["mounts", "--all", "--host-snapshot", &ws2019]);
    assert!(
        stdout(&o).contains("class/5B45201D-F2F2-4F3B-85BB-30FF1F953599"),
        "{}",
        stdout(&o)
    );
    // And the plugin refuses an explicit location-path there at start.
    let dir = tempfile::tempdir().unwrap();
    let o = dxdp(&[
        "plugin",
        "--assignment",
        "location-path",
        "--kubelet-dir",
        dir.path().to_str().unwrap(),
        "--host-snapshot",
        &ws2019,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("assignment location-path needs HCS schema 2.2"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn doctor_exit_code_follows_failures() {
    let dir = tempfile::tempdir().unwrap();
    let kdir = dir.path().to_str().unwrap();
    // No kubelet.sock yet: FAIL, exit 1.
    let o = dxdp(&["doctor", "--kubelet-dir", kdir]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("FAIL  kubelet.sock"));
    std::fs::write(dir.path().join("kubelet.sock"), b"").unwrap();
    let o = dxdp(&["doctor", "--json", "--kubelet-dir", kdir]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["summary"]["fail"], 0);
    let o = dxdp(&["doctor", "--kubelet-dir", "/no/such/dir"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("/no/such/dir (from --kubelet-dir) does not exist"));
    let o = dxdp_env(&["doctor"], &[("DXDP_KUBELET_DIR", "/no/such/env/dir")]);
    assert!(stdout(&o).contains("/no/such/env/dir (from DXDP_KUBELET_DIR) does not exist"));
}

#[test]
fn doctor_on_a_simulated_host_does_not_judge_this_machine() {
    for args in [
        vec!["doctor"],
        vec![
            "doctor",
            "--host-snapshot",
            &fixture("nvidia-multi-gpu.yaml"),
        ],
    ] {
        let o = dxdp(&args);
        let out = stdout(&o);
        assert!(
            out.lines()
                .any(|l| l.starts_with("INFO  kubelet device-plugin directory")
                    && l.contains("skipped: simulated host")),
            "{args:?}: {out}"
        );
        assert!(out.contains("INFO  kubelet.sock"), "{out}");
        assert!(!out.contains("FAIL  kubelet"), "{out}");
    }
    // A directory named explicitly is checked even then.
    let o = dxdp(&["doctor", "--kubelet-dir", "/no/such/dir"]);
    assert!(stdout(&o).contains("FAIL  kubelet device-plugin directory"));
}

#[test]
fn discover_states_zero_devices_plainly_and_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.yaml");
    std::fs::write(&path, "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\n").unwrap();
    let o = dxdp(&["discover", "--host-snapshot", path.to_str().unwrap()]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("No assignable DirectX devices were found on this host."));
}

#[test]
fn config_show_names_where_each_value_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(
        &path,
        "resources:\n  display:\n    replicas: 2\nassignment: auto\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let o = dxdp_env(
        &["config", "show", "--config", p],
        &[
            ("DXDP_CONFIG", "/ignored.yaml"),
            ("MCDM_DEVICE_PLUGIN_MULTITENANCY", "3"),
            ("DXDP_LOG_LEVEL", "warn"),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for line in [
        format!("resources.display.replicas: 2  # file {p}"),
        "resources.compute.replicas: 3  # env MCDM_DEVICE_PLUGIN_MULTITENANCY".to_string(),
        format!("assignment: auto  # file {p}"),
        "logLevel: warn  # env DXDP_LOG_LEVEL".to_string(),
        "resources.display.name: directx.microsoft.com/display  # default".to_string(),
    ] {
        assert!(out.contains(&line), "missing {line:?} in:\n{out}");
    }
    let o = dxdp(&[
        "config",
        "show",
        "--json",
        "--config",
        p,
        "--log-level",
        "debug",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["values"]["logLevel"]["origin"], "flag --log-level");
    // Typed: numbers are numbers, lists are lists.
    assert_eq!(v["values"]["resources.display.replicas"]["value"], 2);
    assert!(v["values"]["resources.display.aliases"]["value"].is_array());
    assert_eq!(v["values"]["resources.display.enabled"]["value"], true);
}

#[test]
fn config_check_reports_file_line_column_and_what_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("valid", "resources: {display: {replicas: 4, aliases: [microsoft.com/directx]}}\nassignment: location-path\n"),
        ("unknown-key", "resources:\n  display:\n    replica: 4\n"),
        ("wrong-type", "devices:\n  includeIntegrated: sometimes\n"),
        ("replicas-zero", "resources:\n  compute:\n    replicas: 0\n"),
        ("replicas-absurd", "resources:\n  compute:\n    replicas: 100000\n"),
        ("bad-selector", "devices:\n  exclude:\n    - vendor: acme\n"),
        ("bad-assignment", "assignment: gpu-p\n"),
        ("escaping-file", "runtimeFiles:\n  additional:\n    nvidia:\n      system32:\n        - source: '..\\..\\evil.dll'\n"),
        ("bad-name", "resources:\n  display:\n    name: gpu\n"),
        ("duplicate-name", "resources:\n  compute:\n    name: directx.microsoft.com/display\n"),
        ("duplicate-alias", "resources:\n  display:\n    aliases: [directx.microsoft.com/compute]\n"),
        ("bad-log-level", "logLevel: verbose\n"),
        ("bad-log-filter", "logLevel: dxdp=loud\n"),
        ("reference-file", "multitenancy: 2\nincludeDetachable: false\n"),
        ("device-name-destination", "runtimeFiles:\n  additional:\n    nvidia:\n      system32:\n        - {source: x.dll, destination: 'COM\u{b9}.dll'}\n"),
        ("device-name-source", "runtimeFiles:\n  additional:\n    amd:\n      syswow64:\n        - source: 'lib\\CONOUT$'\n"),
        ("huge-vendor", &format!("devices:\n  exclude:\n    - vendor: {}\n", "v".repeat(100_000))),
    ];
    let mut report = String::new();
    for (name, text) in cases {
        let text: &str = text;
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, text).unwrap();
        let o = dxdp(&["config", "check", path.to_str().unwrap()]);
        let shown = format!("{}{}", stdout(&o), stderr(&o))
            .replace(&dir.path().display().to_string(), "DIR");
        report.push_str(&format!("{name}: exit {:?}\n{shown}\n", o.status.code()));
        assert_eq!(
            o.status.success(),
            name == "valid" || name == "reference-file",
            "{name}: {shown}"
        );
        assert_no_panic(&o);
    }
    insta::assert_snapshot!("config-check", report);
}

#[test]
fn reference_plugin_environment_reaches_the_plugin_settings() {
    let o = dxdp_env(
        &["config", "show"],
        &[
            ("WDDM_DEVICE_PLUGIN_MULTITENANCY", "4"),
            ("WDDM_DEVICE_PLUGIN_INCLUDE_INTEGRATED", "true"),
            ("MCDM_DEVICE_PLUGIN_INCLUDE_DETACHABLE", "true"),
        ],
    );
    let out = stdout(&o);
    assert!(
        out.contains("resources.display.replicas: 4  # env WDDM_DEVICE_PLUGIN_MULTITENANCY"),
        "{out}"
    );
    assert!(
        out.contains(
            "resources.display.includeIntegrated: true  # env WDDM_DEVICE_PLUGIN_INCLUDE_INTEGRATED"
        ) && out.contains("resources.compute.includeIntegrated: false  # default"),
        "{out}"
    );
    assert!(
        out.contains(
            "resources.compute.includeDetachable: true  # env MCDM_DEVICE_PLUGIN_INCLUDE_DETACHABLE"
        ) && out.contains("resources.display.includeDetachable: false  # default"),
        "{out}"
    );
    let o = dxdp_env(
        &[
            "discover",
            "--json",
            "--host-snapshot",
            &fixture("intel-igpu.yaml"),
        ],
        &[("WDDM_DEVICE_PLUGIN_INCLUDE_INTEGRATED", "1")],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["devices"].as_array().unwrap().len(), 2);
    let o = dxdp_env(
        &["discover"],
        &[("WDDM_DEVICE_PLUGIN_MULTITENANCY", "zero")],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("WDDM_DEVICE_PLUGIN_MULTITENANCY"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn version_names_the_commit_and_target_and_completions_and_man_pages_are_generated() {
    let o = dxdp(&["--version"]);
    assert!(o.status.success());
    let v = stdout(&o);
    let target = if cfg!(target_os = "linux") {
        "unknown-linux"
    } else {
        ""
    };
    assert!(
        v.starts_with(&format!("dxdp {} (commit ", env!("CARGO_PKG_VERSION")))
            && v.contains(target),
        "{v}"
    );
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let o = dxdp(&["completion", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        assert!(
            script.contains("plugin") && script.contains("discover"),
            "{shell}"
        );
    }
    let o = dxdp(&["completion", "tcsh"]);
    assert_eq!(o.status.code(), Some(2), "clap refuses an unknown shell");
    let dir = tempfile::tempdir().unwrap();
    let o = dxdp(&["man", "--out-dir", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for page in ["dxdp.1", "dxdp-plugin.1", "dxdp-mounts.1", "dxdp-config.1"] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
        assert!(
            text.starts_with(".ie") && text.contains(".SH NAME"),
            "{page}"
        );
    }
}

#[test]
fn errors_print_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let missing = missing.to_str().unwrap();
    let kdir = dir.path().to_str().unwrap();
    for args in [
        vec!["discover", "--host-snapshot", missing],
        vec!["plugin", "--kubelet-dir", kdir, "--host-snapshot", missing],
        vec!["config", "show", "--config", missing],
    ] {
        let o = dxdp(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = stderr(&o);
        assert_eq!(
            err.matches("No such file or directory").count(),
            1,
            "{args:?}: {err}"
        );
        assert!(err.contains(missing), "names the path: {err}");
    }
}

#[test]
fn output_flag_json_yaml_and_the_json_alias() {
    let host = fixture("nvidia-multi-gpu.yaml");
    for cmd in [
        vec!["discover"],
        vec!["hcs"],
        vec!["doctor"],
        vec!["config", "show"],
    ] {
        let with = |extra: &[&str]| {
            let mut args = cmd.clone();
            args.extend_from_slice(extra);
            args.extend_from_slice(&["--host-snapshot", &host]);
            dxdp(&args)
        };
        let json = with(&["-o", "json"]);
        let alias = with(&["--json"]);
        let yaml = with(&["--output", "yaml"]);
        assert_no_panic(&json);
        assert_eq!(stdout(&json), stdout(&alias), "{cmd:?}: --json is -o json");
        assert!(stdout(&json).starts_with("{\n  \"apiVersion\": \"dxdp/v1\",\n  \"kind\": "));
        assert!(
            stdout(&yaml).starts_with("apiVersion: dxdp/v1\nkind: "),
            "{cmd:?}: {}",
            stdout(&yaml)
        );
        let both = with(&["-o", "yaml", "--json"]);
        assert_eq!(
            both.status.code(),
            Some(2),
            "{cmd:?}: -o and --json conflict"
        );
    }
    let mounts = dxdp(&["mounts", "--all", "-o", "yaml", "--host-snapshot", &host]);
    assert!(stdout(&mounts).starts_with("apiVersion: dxdp/v1\nkind: Mounts\n"));
    let old = dxdp(&[
        "mounts",
        "--all",
        "--format",
        "json",
        "--host-snapshot",
        &host,
    ]);
    assert!(stdout(&old).contains("\"kind\": \"Mounts\""));
    let snap = dxdp(&["snapshot", "-o", "json", "--host-snapshot", &host]);
    assert!(stdout(&snap).starts_with("{\n  \"apiVersion\": \"dxdp/v1alpha1\""));
    let version = dxdp(&["version"]);
    assert_eq!(stdout(&version), stdout(&dxdp(&["--version"])));
}

#[test]
fn an_unknown_named_configuration_is_a_warning_naming_the_file_the_asker_and_the_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(
        &path,
        "configurations:\n  shared-a10: {resources: {display: {replicas: 4}}}\n  big: {}\n",
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let o = dxdp(&["discover", "--config", p, "--configuration", "shared-a1O"]);
    assert!(o.status.success(), "a warning, not an error");
    assert!(
        stderr(&o).contains(&format!(
            "warning: configuration \"shared-a1O\" (flag --configuration) is not in {p}'s configurations (it has big, shared-a10): using the default configuration"
        )),
        "{}",
        stderr(&o)
    );
    let o = dxdp_env(
        &["config", "show"],
        &[("DXDP_CONFIG", p), ("DXDP_CONFIGURATION", "nope")],
    );
    assert!(
        stderr(&o).contains("warning: configuration \"nope\" (env DXDP_CONFIGURATION)"),
        "{}",
        stderr(&o)
    );
    assert!(
        stdout(&o)
            .contains("# configuration: default: \"nope\" (env DXDP_CONFIGURATION) is unknown"),
        "{}",
        stdout(&o)
    );
    // JSON logs: the warning is a JSON line.
    let o = dxdp(&[
        "discover",
        "--config",
        p,
        "--configuration",
        "nope",
        "--log-format",
        "json",
    ]);
    let line = stderr(&o)
        .lines()
        .find(|l| l.contains("nope"))
        .unwrap_or_default()
        .to_string();
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
    assert_eq!(v["level"], "WARN", "{line}");
}

#[test]
fn config_show_says_when_the_configuration_file_does_not_exist() {
    let o = dxdp_env(&["config", "show"], &[]);
    let first = stdout(&o).lines().next().unwrap_or_default().to_string();
    assert!(
        first.starts_with("# configuration file: none (would read "),
        "{first}"
    );
    let o = dxdp_env(&["config", "show", "-o", "json"], &[]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["file"], serde_json::Value::Null);
    assert!(
        v["notes"][0]
            .as_str()
            .unwrap_or_default()
            .starts_with("configuration file: none (would read "),
        "{v}"
    );
}

#[test]
fn a_fatal_error_is_a_json_log_line_under_log_format_json() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("config.yaml");
    std::fs::write(&bad, "resources: {display: {replicas: two}}\n").unwrap();
    let bad = bad.to_str().unwrap();
    // The configuration fails (flag and env choose the format), and a command fails.
    for (args, env) in [
        (
            vec!["discover", "--config", bad, "--log-format", "json"],
            vec![],
        ),
        (
            vec!["discover", "--config", bad],
            vec![("DXDP_LOG_FORMAT", "json")],
        ),
        (
            vec!["mounts", "--index", "99", "--log-format", "json"],
            vec![],
        ),
    ] {
        let o = dxdp_env(&args, &env);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let lines: Vec<serde_json::Value> = stderr(&o)
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{args:?}: not JSON: {l}: {e}"))
            })
            .collect();
        let last = lines
            .last()
            .unwrap_or_else(|| panic!("{args:?}: no stderr"));
        assert_eq!(last["level"], "ERROR", "{args:?}");
        assert!(
            last["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{args:?}"
        );
    }
    let o = dxdp(&["discover", "--config", bad]);
    assert!(
        stderr(&o).starts_with(&format!(
            "error: {bad}:1:33: expected a whole number, got \"two\""
        )),
        "{}",
        stderr(&o)
    );
}

/// Issue 34: every command with machine output takes `-o json`, `-o yaml` and `--json`, and
/// `--json` writes what `-o json` writes.
#[test]
fn every_command_with_machine_output_takes_o_json_o_yaml_and_json() {
    let t4 = fixture("telemetry-t4.yaml");
    let commands: [&[&str]; 8] = [
        &["discover"],
        &["doctor"],
        &["hcs"],
        &["top"],
        &["audit", "--node"],
        &["mounts", "--index", "0"],
        &["config", "show"],
        &["snapshot"],
    ];
    for cmd in commands {
        let run = |extra: &[&str]| {
            let mut args: Vec<&str> = cmd.to_vec();
            args.extend(extra);
            args.extend(["--host-snapshot", &t4]);
            let o = dxdp(&args);
            assert_no_panic(&o);
            assert_ne!(o.status.code(), Some(2), "{args:?} refused: {}", stderr(&o));
            stdout(&o)
        };
        let json = run(&["-o", "json"]);
        let doc: serde_json::Value =
            serde_json::from_str(&json).unwrap_or_else(|e| panic!("{cmd:?} -o json: {e}: {json}"));
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        assert!(!kind.is_empty(), "{cmd:?}: no kind in {json}");
        assert_eq!(run(&["--json"]), json, "{cmd:?} --json is -o json");
        let yaml = run(&["-o", "yaml"]);
        assert!(
            yaml.lines().any(|l| l == format!("kind: {kind}")),
            "{cmd:?} -o yaml: {yaml}"
        );
    }
    // The expected kinds, written out.
    let kinds: Vec<String> = commands
        .iter()
        .map(|cmd| {
            let mut args: Vec<&str> = cmd.to_vec();
            args.extend(["--json", "--host-snapshot", &t4]);
            let v: serde_json::Value = serde_json::from_slice(&dxdp(&args).stdout).unwrap();
            v["kind"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "Discovery",
            "DoctorReport",
            "HcsReport",
            "Top",
            "Audit",
            "Mounts",
            "Configuration",
            "HostSnapshot"
        ]
    );
    // `--json` with another format is a usage error.
    let o = dxdp(&["top", "--json", "-o", "yaml", "--host-snapshot", &t4]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = dxdp(&["mounts", "--all", "--json", "-o", "ctr"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// Issue 34: exit codes, the same scheme everywhere: 0 success, 1 error or a failed check, 2
/// usage error (clap's), 3 a check could not tell. Each command's `--help` lists its own.
#[test]
fn could_not_tell_exits_3_distinct_from_a_usage_error_and_help_lists_exit_codes() {
    let missing = "/no/such/snapshot.yaml";
    for cmd in ["doctor", "hcs"] {
        let o = dxdp(&[cmd, "--host-snapshot", missing]);
        assert_eq!(o.status.code(), Some(3), "{cmd}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("cannot read host snapshot /no/such/snapshot.yaml"),
            "{cmd}: {}",
            stderr(&o)
        );
    }
    // A snapshot without telemetry: the audit cannot tell.
    let o = dxdp(&[
        "audit",
        "--node",
        "--host-snapshot",
        &fixture("nvidia-multi-gpu.yaml"),
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stdout(&o));
    assert!(stdout(&o).contains("(exit code 3)"), "{}", stdout(&o));
    // Commands without a verdict: an error is 1.
    for cmd in ["discover", "snapshot", "top"] {
        let o = dxdp(&[cmd, "--host-snapshot", missing]);
        assert_eq!(o.status.code(), Some(1), "{cmd}: {}", stderr(&o));
    }
    // A usage error is 2, for the checks too.
    for cmd in ["doctor", "hcs", "audit"] {
        let o = dxdp(&[cmd, "--no-such-option"]);
        assert_eq!(o.status.code(), Some(2), "{cmd}");
    }
    let help = |args: &[&str]| stdout(&dxdp(args)).replace('\n', " ");
    let expected = [
        (
            "doctor",
            "Exit codes: 0 no check failed (warnings allowed), 1 a check failed, 2 usage error, 3 could not tell",
        ),
        (
            "hcs",
            "Exit codes: 0 the configured assignment works here, 1 it does not, 2 usage error, 3 could not tell",
        ),
        (
            "audit",
            "Exit codes: 0 clean, 1 violations, 2 usage error, 3 could not tell",
        ),
        ("discover", "Exit codes: 0 success, 1 error, 2 usage error."),
        ("top", "Exit codes: 0 success, 1 error, 2 usage error."),
        ("snapshot", "Exit codes: 0 success, 1 error, 2 usage error."),
        ("demo", "Exit codes: 0 success, 1 error, 2 usage error."),
        ("mounts", "with --run, ctr's own exit code."),
        ("plugin", "Exit codes: 0 stopped by a signal (gracefully), 1 stopped on an error, 2 usage error."),
        ("config", "Exit codes: 0 success (config check: the file is valid), 1 error"),
    ];
    for (cmd, text) in expected {
        let h = help(&[cmd, "--help"]);
        let squeezed = h.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(squeezed.contains(text), "{cmd} --help: {h}");
    }
    let top = help(&["--help"])
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        top.contains("Exit codes: 0 success, 1 error or a failed check, 2 usage error, 3 a check could not tell"),
        "{top}"
    );
}

/// Issue 34: `top --watch` into a pipe writes frames one after the other, each starting with a
/// separator line that gives its time.
#[test]
fn top_watch_into_a_pipe_separates_frames_with_their_time() {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .args(["top", "--watch", "--interval", "1", "--host-snapshot"])
        .arg(fixture("telemetry-t4.yaml"))
        .env_clear()
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    // Two frames: read until the third separator starts (or give up after 20 s).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&text).matches("--- ").count() >= 3 {
                break;
            }
        }
        let _ = tx.send(String::from_utf8_lossy(&text).into_owned());
    });
    let text = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("two frames within 20 s");
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        !text.contains('\x1b'),
        "no terminal codes into a pipe: {text:?}"
    );
    let frames: Vec<&str> = text.split("--- ").skip(1).take(2).collect();
    assert_eq!(frames.len(), 2, "{text}");
    for frame in frames {
        let (time, table) = frame.split_once(" ---\n").expect("a separator line");
        // 2026-11-25T22:06:46Z
        let b = time.as_bytes();
        assert!(
            time.len() == 20
                && b[4] == b'-'
                && b[10] == b'T'
                && b[13] == b':'
                && time.ends_with('Z'),
            "{time:?}"
        );
        assert!(table.starts_with("DEVICE "), "{table}");
        assert!(
            table.contains(
                "pciroot-0-pci-1c00-ba6abfb666f4630a  NVIDIA Tesla T4  compute 100% copy 2%"
            ),
            "{table}"
        );
    }
    assert!(
        text.starts_with("--- "),
        "the first frame has its line too: {text}"
    );
}

/// Issue 34: `discover` prints a table numbered as `mounts --index` counts, with the unhealthy
/// devices and why; `--details` adds every property.
#[test]
fn discover_prints_a_table_with_the_index_mounts_takes() {
    let o = dxdp(&[
        "discover",
        "--host-snapshot",
        &fixture("broken-drivers.yaml"),
    ]);
    assert_eq!(o.status.code(), Some(0));
    let expected = "\
Host: Windows Server 2022 Standard 21H2 build 10.0.20348.2849, HCS schema 2.5
4 devices, 3 excluded, 5 warnings

INDEX  ID                                   RESOURCE  HEALTH     LUID                   MEMORY    DESCRIPTION
0      pciroot-0-pci-1b00-0540e5ad73bf260f  display   Unhealthy  0x00000000_0x000003E9  15.0 GiB  NVIDIA Tesla T4
1      pciroot-0-pci-1c00-ba6abfb666f4630a  display   Unhealthy  0x00000000_0x000003EA  15.0 GiB  NVIDIA Tesla T4
2      pciroot-0-pci-1d00-99a65d9b8c3e813d  display   Healthy    0x00000000_0x000003ED  -         Radeon Pro V520 MxGPU
3      pciroot-0-pci-1e00-4ed067a47f740fc8  display   Healthy    0x00000000_0x000003EE  -         Intel(R) Arc(TM) A380 Graphics

Unhealthy devices (advertised, not allocated until healthy):
  - 0 pciroot-0-pci-1b00-0540e5ad73bf260f: device node has problem code 43: CM_PROB_FAILED_POST_START (the driver reported a failure, often a crashed GPU)
  - 1 pciroot-0-pci-1c00-ba6abfb666f4630a: driver update in progress

Excluded adapters:
";
    assert!(stdout(&o).starts_with(expected), "{}", stdout(&o));
    assert!(stdout(&o).ends_with(
        "\nEvery property and runtime file: dxdp discover --details; flags for one device: dxdp mounts --index N\n"
    ));
    assert!(
        !stdout(&o).contains("Driver store:"),
        "details only with --details"
    );
    // The same numbering as `mounts --index`.
    for (index, id) in [
        ("0", "pciroot-0-pci-1b00-0540e5ad73bf260f"),
        ("2", "pciroot-0-pci-1d00-99a65d9b8c3e813d"),
        ("3", "pciroot-0-pci-1e00-4ed067a47f740fc8"),
    ] {
        let m = dxdp(&[
            "mounts",
            "--index",
            index,
            "--json",
            "--host-snapshot",
            &fixture("broken-drivers.yaml"),
        ]);
        let doc: serde_json::Value = serde_json::from_slice(&m.stdout).unwrap();
        assert_eq!(doc["devices"][0]["id"], id, "--index {index}");
    }
    let d = dxdp(&[
        "discover",
        "--details",
        "--host-snapshot",
        &fixture("nvidia-multi-gpu.yaml"),
    ]);
    let text = stdout(&d);
    assert!(
        text.contains(
            "\nDevice 3: pciroot-0-pci-1e00-4ed067a47f740fc8\n  Description:    NVIDIA Tesla T4\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("\n  LUID:           0x00000000_0x006B9C66\n"),
        "{text}"
    );
    assert!(!text.contains("discover --details;"), "{text}");
}

/// Issue 34: `doctor`'s detail column starts at the same place on every line; a name too long
/// for it has its detail on the next line, at that column.
#[test]
fn doctor_columns_are_aligned() {
    let o = dxdp(&[
        "doctor",
        "--host-snapshot",
        &fixture("nvidia-multi-gpu.yaml"),
    ]);
    let expected = "\
PASS  Windows build                              Windows Server 2022 (build 10.0.20348.1547)
PASS  HCS device assignment                      assignment auto: HCS schema 2.5 assigns each device by location path
WARN  containerd 1.7+                            containerd was not found
      -> install containerd 1.7 or later (device assignment needs it), or check PATH
INFO  kubelet device-plugin directory            skipped: simulated host (pass --kubelet-dir to check a directory of this machine)
INFO  kubelet.sock                               skipped: the kubelet directory was not checked
PASS  devices for directx.microsoft.com/display  4 healthy of 4
INFO  devices for directx.microsoft.com/compute  no compute devices on this node
PASS  driver files of NVIDIA Tesla T4 (PCIROOT(0)#PCI(1B00))
                                                 7 runtime files present in C:\\Windows\\System32\\DriverStore\\FileRepository\\nvgridsw_aws.inf_amd64_1b50ef32b191cff1 (2 optional file(s) absent, not mounted)
";
    assert!(stdout(&o).starts_with(expected), "{}", stdout(&o));
}

/// Issue 34: one LUID notation, the one of the telemetry metrics' `luid` label, in `discover`,
/// `top`, `audit` and the warnings; `mounts --luid` takes it.
#[test]
fn one_luid_notation_everywhere() {
    let t4 = fixture("telemetry-t4.yaml");
    let label = "0x00000000_0x006B9126";
    let discover = stdout(&dxdp(&["discover", "--host-snapshot", &t4]));
    assert!(
        discover.contains(&format!("1      pciroot-0-pci-1c00-ba6abfb666f4630a  display   Healthy  {label}  15.0 GiB  NVIDIA Tesla T4")),
        "{discover}"
    );
    let top: serde_json::Value =
        serde_json::from_slice(&dxdp(&["top", "--json", "--host-snapshot", &t4]).stdout).unwrap();
    assert_eq!(top["devices"][1]["luid"], label);
    let m = dxdp(&["mounts", "--luid", label, "--json", "--host-snapshot", &t4]);
    let doc: serde_json::Value = serde_json::from_slice(&m.stdout).unwrap();
    assert_eq!(
        doc["devices"][0]["id"],
        "pciroot-0-pci-1c00-ba6abfb666f4630a"
    );
    let a = dxdp_env(
        &["audit", "--host-snapshot", &t4],
        &[("DXDP_ADAPTER_LUIDS", "7049510")],
    );
    assert!(
        stdout(&a).starts_with(&format!(
            "Given (DXDP_ADAPTER_LUIDS):  {label} (NVIDIA Tesla T4)\n"
        )),
        "{}",
        stdout(&a)
    );
    let broken = stdout(&dxdp(&[
        "discover",
        "--host-snapshot",
        &fixture("broken-drivers.yaml"),
    ]));
    assert!(
        broken.contains("  - adapter NVIDIA Tesla T4 (no device node) (LUID 0x00000000_0x000003EB): no device node matches: no device node reports LUID 0x00000000_0x000003EB,"),
        "{broken}"
    );
    // Not the old notations.
    for text in [&discover, &broken, &stdout(&a)] {
        assert!(!text.contains("0x00000000:0x"), "{text}");
        assert!(!text.contains("(LUID 10"), "{text}");
    }
}

/// Issue 34: the README's commands table names every command `dxdp --help` lists, and its
/// sentence on machine output names the commands that take `-o json|yaml` and `--json` (checked
/// above, in `every_command_with_machine_output_takes_o_json_o_yaml_and_json`).
#[test]
fn the_readme_lists_every_command_and_the_ones_with_machine_output() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let help = stdout(&dxdp(&["--help"]));
    let commands: Vec<&str> = help
        .split("Commands:\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 13, "{commands:?}");
    let table: Vec<&str> = readme
        .lines()
        .skip_while(|l| *l != "## Commands")
        .take_while(|l| l.is_empty() || l.starts_with('|') || l.starts_with('#'))
        .filter(|l| l.starts_with('|'))
        .collect();
    for c in &commands {
        assert!(
            table.iter().any(|row| row.contains(&format!("`dxdp {c}"))),
            "README.md's commands table lacks `dxdp {c}`"
        );
    }
    let sentence = readme
        .split("Every command with machine output (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .expect("the machine-output sentence")
        .replace('\n', " ");
    let named: Vec<String> = sentence
        .split(',')
        .map(|c| c.trim().trim_matches('`').to_string())
        .collect();
    assert_eq!(
        named,
        [
            "discover",
            "doctor",
            "hcs",
            "audit",
            "top",
            "mounts",
            "config show",
            "snapshot"
        ],
        "the commands every_command_with_machine_output_takes_o_json_o_yaml_and_json runs"
    );
}

/// Issue 34: the crates are ready for `cargo install dxdp`: the metadata crates.io shows, and
/// packages that hold what building needs (the code, the build script's protobuf files, the
/// core's embedded sample host) and none of the tests, fixtures or benches. `.ci/run` builds the
/// packages too (`cargo package --workspace`).
#[test]
fn the_crates_are_packaged_with_what_building_needs_and_no_fixtures() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (manifest, keys) in [
        (
            root.join("Cargo.toml"),
            &[
                "description = ",
                "license = \"MIT OR Apache-2.0\"",
                "readme = \"README.md\"",
                "keywords = ",
                "categories = ",
                "rust-version = ",
                "include = [",
            ][..],
        ),
        (
            root.join("crates/dxdp-core/Cargo.toml"),
            &[
                "description = ",
                "license = \"MIT OR Apache-2.0\"",
                "readme = \"README.md\"",
                "keywords = ",
                "categories = ",
                "rust-version = ",
                "include = [",
            ][..],
        ),
    ] {
        let text = std::fs::read_to_string(&manifest).unwrap();
        for key in keys {
            assert!(
                text.lines().any(|l| l.starts_with(key)),
                "{}: no `{key}`",
                manifest.display()
            );
        }
        assert!(!text.contains("publish = false"), "{}", manifest.display());
    }
    // dxdp depends on dxdp-core by version too, as a published crate must.
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains("dxdp-core = { path = \"crates/dxdp-core\", version = \"=0.1.0\" }"),
        "dxdp-core dependency with a version"
    );
    let list = |package: &str| -> Option<Vec<String>> {
        let o = Command::new(env!("CARGO"))
            .args([
                "package",
                "-p",
                package,
                "--no-verify",
                "--allow-dirty",
                "--offline",
                "--list",
            ])
            .current_dir(root)
            .output()
            .ok()?;
        if !o.status.success() {
            eprintln!(
                "skipped the package listing of {package}: cargo package --list failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            return None;
        }
        Some(stdout(&o).lines().map(str::to_string).collect())
    };
    let Some(dxdp) = list("dxdp") else { return };
    let Some(core) = list("dxdp-core") else {
        return;
    };
    for file in [
        "Cargo.toml",
        "build.rs",
        "src/main.rs",
        "src/lib.rs",
        "proto/deviceplugin_v1beta1.proto",
        "proto/podresources_v1.proto",
        "proto/cri_runtime_v1.proto",
        "README.md",
        "LICENSE-APACHE",
        "LICENSE-MIT",
    ] {
        assert!(
            dxdp.iter().any(|f| f == file),
            "dxdp package lacks {file}: {dxdp:?}"
        );
    }
    for file in [
        "src/lib.rs",
        "src/sample-host.yaml",
        "README.md",
        "LICENSE-MIT",
    ] {
        assert!(
            core.iter().any(|f| f == file),
            "dxdp-core package lacks {file}: {core:?}"
        );
    }
    for f in dxdp.iter().chain(&core) {
        assert!(
            ![
                "tests/",
                "benches/",
                "fuzz/",
                "docs/",
                "deploy/",
                "examples/",
                "scripts/",
                "crates/",
                "target/"
            ]
            .iter()
            .any(|d| f.starts_with(d)),
            "{f} is packaged"
        );
    }
}

#[test]
fn the_d3d12_feature_level_child_answers_before_any_argument_is_parsed() {
    // Discovery starts dxdp with this variable and no arguments (src/backend/probe.rs); off
    // Windows there is no D3D12 to ask.
    let out = dxdp_env(&[], &[("DXDP_D3D12_FEATURE_LEVEL_OF", "5")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "D3D12 feature levels can be asked only on Windows\n"
    );
    let out = dxdp_env(&[], &[("DXDP_D3D12_FEATURE_LEVEL_OF", "gpu0")]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "DXDP_D3D12_FEATURE_LEVEL_OF=\"gpu0\" is not an adapter LUID (a decimal number)\n"
    );
}
