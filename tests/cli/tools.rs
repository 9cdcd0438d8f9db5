//! Node tools over fixture hosts: every `dxdp mounts` format (exact output), `dxdp hcs` verdicts
//! and `dxdp doctor` checks, snapshot-tested; quoting checked by a real shell.

use dxdp::tools::doctor::{self, DirState, Probes};
use dxdp::tools::mounts::{self, Format};
use dxdp::tools::shell::Shell;
use dxdp::tools::{hcs, select};
use dxdp_core::assignment::Assignment;
use dxdp_core::devices::{Device, Discovery, Resource};
use dxdp_core::facts::HostFacts;
use dxdp_core::pipeline::{discover, PipelineConfig};

use crate::common;

use common::facts;

/// The sample host and every fixture.
fn hosts() -> impl Iterator<Item = &'static str> {
    std::iter::once("sample").chain(common::FIXTURES)
}

fn run(facts: &HostFacts) -> Discovery {
    discover(facts, &PipelineConfig::default())
}

#[test]
fn every_mounts_format_renders_as_recorded() {
    let d = run(&facts("sample"));
    let display: Vec<&Device> = select::select(&d, &[select::Selector::Index(0)]).unwrap();
    let compute: Vec<&Device> =
        select::select(&d, &[select::Selector::Resource(Resource::Compute)]).unwrap();
    let cases = [
        ("ctr-sh", Format::Ctr, Shell::Sh, &display),
        ("ctr-powershell", Format::Ctr, Shell::PowerShell, &display),
        ("ctr-cmd", Format::Ctr, Shell::Cmd, &compute),
        ("nerdctl", Format::Nerdctl, Shell::PowerShell, &compute),
        ("docker", Format::Docker, Shell::PowerShell, &display),
        ("json", Format::Json, Shell::Sh, &compute),
        ("oci", Format::Oci, Shell::Sh, &compute),
    ];
    for (name, format, shell, devices) in cases {
        let r = mounts::render(devices, format, shell);
        insta::assert_snapshot!(
            format!("mounts-{name}"),
            format!("{}--- notes ---\n{}\n", r.text, r.notes.join("\n"))
        );
    }
}

/// POSIX quoting, checked by a POSIX shell: on Unix only (Windows runners have `sh` only through
/// Git). The rendering is the same code on every platform.
#[cfg(unix)]
#[test]
fn ctr_flags_survive_a_real_shell_even_with_spaces_in_paths() {
    let mut f = facts("sample");
    f.os.as_mut().unwrap().system_root = Some(r"C:\Program Files (x86)\It's Windows".into());
    f.files = f
        .files
        .iter()
        .map(|p| p.replace(r"C:\Windows", r"C:\Program Files (x86)\It's Windows"))
        .collect();
    let d = run(&f);
    let devices: Vec<&Device> = d.devices.iter().take(1).collect();
    let edits = dxdp_core::allocation::container_edits(&devices);
    let expected = mounts::ctr_args(&edits);
    assert!(expected.iter().any(|a| a.contains("Program Files (x86)")));
    let line = mounts::render(&devices, Format::Ctr, Shell::Sh).text;
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "for a in {}; do printf '%s\\n' \"$a\"; done",
            line.trim()
        ))
        .output()
        .expect("sh runs");
    let got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn class_guid_assignment_replaces_the_location_paths() {
    let d = run(&facts("sample"));
    let all: Vec<&Device> = d.devices.iter().collect();
    let r = mounts::render_with(
        &all,
        Format::Ctr,
        Shell::Sh,
        dxdp_core::assignment::Assignment::ClassGuid,
    );
    assert!(
        r.text
            .starts_with("--device class/5B45201D-F2F2-4F3B-85BB-30FF1F953599 --mount"),
        "{}",
        r.text
    );
    assert!(!r.text.contains("vpci-location-path"));
    let oci: serde_json::Value = serde_json::from_str(
        &mounts::render_with(
            &all,
            Format::Oci,
            Shell::Sh,
            dxdp_core::assignment::Assignment::ClassGuid,
        )
        .text,
    )
    .unwrap();
    assert_eq!(oci["windows"]["devices"][0]["idType"], "class");
    assert_eq!(
        oci["windows"]["devices"][0]["id"],
        "5B45201D-F2F2-4F3B-85BB-30FF1F953599"
    );
}

#[test]
fn json_and_oci_are_valid_documents() {
    let d = run(&facts("nvidia-multi-gpu"));
    let all: Vec<&Device> = d.devices.iter().collect();
    let json: serde_json::Value =
        serde_json::from_str(&mounts::render(&all, Format::Json, Shell::Sh).text).unwrap();
    assert_eq!(json["devices"].as_array().unwrap().len(), 4);
    assert!(json["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["readOnly"] == true));
    let oci: serde_json::Value =
        serde_json::from_str(&mounts::render(&all, Format::Oci, Shell::Sh).text).unwrap();
    assert_eq!(oci["windows"]["devices"][0]["idType"], "vpci-location-path");
    assert!(oci["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["options"][0] == "ro"));
}

#[test]
fn hcs_reports_for_every_host() {
    for host in hosts() {
        let r = hcs::report(&facts(host).os.unwrap_or_default());
        insta::assert_snapshot!(format!("hcs-{host}"), hcs::text(&r));
    }
}

fn probes(state: DirState, socket: bool, containerd: Option<&str>) -> Probes {
    probes_with_kubelet(state, socket, containerd, None)
}

fn probes_with_kubelet(
    state: DirState,
    socket: bool,
    containerd: Option<&str>,
    kubelet: Option<&str>,
) -> Probes {
    Probes {
        kubelet_dir: r"C:\var\lib\kubelet\device-plugins".into(),
        kubelet_dir_reason: dxdp::kubelet::paths::windows_default(Some("C:")).reason,
        kubelet_dir_state: state,
        kubelet_socket: Some(socket),
        containerd: containerd.map(|v| (v.to_string(), "from the host snapshot".to_string())),
        kubelet: kubelet.map(|v| (v.to_string(), "from the host snapshot".to_string())),
        resources: Resource::ALL.to_vec(),
        assignment: Assignment::LocationPath,
        expected: Default::default(),
        // The default configuration's: telemetry and GPUUnhealthy Events read PodResources.
        pod_resources_users: vec!["telemetry.enabled".into(), "health.events".into()],
    }
}

#[test]
fn doctor_verdicts_for_every_host() {
    for host in hosts() {
        let f = facts(host);
        let d = run(&f);
        let containerd = f.os.as_ref().and_then(|o| o.containerd_version.clone());
        let kubelet = f.os.as_ref().and_then(|o| o.kubelet_version.clone());
        let checks = doctor::checks(
            &f,
            &d,
            &probes_with_kubelet(
                DirState::Writable,
                true,
                containerd.as_deref(),
                kubelet.as_deref(),
            ),
        );
        insta::assert_snapshot!(format!("doctor-{host}"), doctor::text(&checks));
    }
}

#[test]
fn doctor_fails_on_what_breaks_a_node() {
    let f = facts("sample");
    let d = run(&f);
    let status = |p: &Probes, name: &str| {
        doctor::checks(&f, &d, p)
            .into_iter()
            .find(|c| c.name.starts_with(name))
            .map(|c| c.status.as_str())
    };
    let good = probes(DirState::Writable, true, Some("1.7.22"));
    assert!(!doctor::failed(&doctor::checks(&f, &d, &good)));
    assert_eq!(
        status(
            &probes(DirState::Missing, true, Some("1.7.22")),
            "kubelet device-plugin"
        ),
        Some("FAIL")
    );
    assert_eq!(
        status(
            &probes(DirState::NotWritable("denied".into()), true, Some("1.7.22")),
            "kubelet device-plugin"
        ),
        Some("FAIL")
    );
    assert_eq!(
        status(
            &probes(DirState::Writable, false, Some("1.7.22")),
            "kubelet.sock"
        ),
        Some("FAIL")
    );
    assert_eq!(
        status(
            &probes(DirState::Writable, true, Some("1.6.9")),
            "containerd"
        ),
        Some("FAIL")
    );
    assert_eq!(
        status(&probes(DirState::Writable, true, None), "containerd"),
        Some("WARN")
    );
    let old = facts("ws2019-old");
    let checks = doctor::checks(&old, &run(&old), &good);
    assert!(checks
        .iter()
        .any(|c| c.name == "Windows build" && c.status.as_str() == "FAIL"));
    // The HCS verdict follows the configured assignment mode.
    let hcs_status = |assignment: Assignment| {
        let p = Probes {
            assignment,
            ..good.clone()
        };
        doctor::checks(&old, &run(&old), &p)
            .into_iter()
            .find(|c| c.name == "HCS device assignment")
            .map(|c| c.status.as_str())
    };
    assert_eq!(hcs_status(Assignment::LocationPath), Some("FAIL"));
    assert_eq!(hcs_status(Assignment::Auto), Some("WARN"));
    assert_eq!(hcs_status(Assignment::ClassGuid), Some("PASS"));
    let new = |assignment: Assignment| {
        let p = Probes {
            assignment,
            ..good.clone()
        };
        doctor::checks(&f, &d, &p)
            .into_iter()
            .find(|c| c.name == "HCS device assignment")
            .map(|c| c.status.as_str())
    };
    for a in Assignment::ALL {
        assert_eq!(new(a), Some("PASS"), "{a:?} on a 2.2+ host");
    }
    let empty = HostFacts::default();
    let checks = doctor::checks(&empty, &run(&empty), &good);
    assert!(checks
        .iter()
        .any(|c| c.name == "assignable devices" && c.status.as_str() == "FAIL"));
}

#[test]
fn doctor_agrees_with_discover() {
    let good = probes(DirState::Writable, true, Some("1.7.22"));
    let check = |host: &str, name: &str| {
        let f = facts(host);
        doctor::checks(&f, &run(&f), &good)
            .into_iter()
            .find(|c| c.name.starts_with(name))
            .map(|c| (c.status.as_str(), c.detail))
    };
    // broken-drivers: the Intel Arc's device node has no driver key, which discover warns about.
    let (status, detail) =
        check("broken-drivers", "driver files of Intel(R) Arc(TM) A380").unwrap_or_default();
    assert_eq!(status, "WARN", "{detail}");
    assert!(detail.contains("no driver key"), "{detail}");
    // Whatever discover warns about, doctor does not pass silently (the T4 without a device node
    // is adapter-unmatched).
    let (status, detail) = check("broken-drivers", "discovery warnings").unwrap_or_default();
    assert_eq!(status, "WARN");
    assert_eq!(
        detail,
        "5 warnings from discovery: adapter-unmatched, driver-store-unknown, no-driver-key, runtime-file-missing x2"
    );
    assert_eq!(
        check("sample", "discovery warnings"),
        None,
        "no warnings, no check"
    );
    // A resource without devices on the node is information, not a warning.
    assert_eq!(
        check("amd-radeon", "devices for directx.microsoft.com/compute"),
        Some(("INFO", "no compute devices on this node".to_string()))
    );
    assert_eq!(
        check("compute-only", "devices for directx.microsoft.com/display"),
        Some(("INFO", "no display devices on this node".to_string()))
    );
}

#[test]
fn doctor_skips_the_kubelet_directory_when_told() {
    let f = facts("sample");
    let p = Probes {
        kubelet_socket: None,
        ..probes(
            DirState::NotChecked("simulated host".into()),
            false,
            Some("1.7.22"),
        )
    };
    let checks = doctor::checks(&f, &run(&f), &p);
    assert!(!doctor::failed(&checks), "{}", doctor::text(&checks));
    for name in ["kubelet device-plugin directory", "kubelet.sock"] {
        let c = checks.iter().find(|c| c.name == name);
        assert_eq!(c.map(|c| c.status.as_str()), Some("INFO"), "{name}");
        assert!(c.is_some_and(|c| c.detail.starts_with("skipped: ") && c.remedy.is_none()));
    }
}

#[test]
fn doctor_judges_every_assignment_as_hcs_does_on_every_host() {
    for host in hosts() {
        let f = facts(host);
        let os = f.os.clone().unwrap_or_default();
        for assignment in Assignment::ALL {
            let p = Probes {
                assignment,
                ..probes(
                    DirState::Writable,
                    true,
                    Some("containerd github.com/containerd/containerd v1.7.20"),
                )
            };
            let checks = doctor::checks(&f, &run(&f), &p);
            let find = |name: &str| checks.iter().find(|c| c.name == name).cloned();
            let verdict = hcs::assignment(&os, assignment);
            let Some(check) = find("HCS device assignment") else {
                panic!("{host}: no HCS check")
            };
            assert_eq!(
                check.status.as_str() == "FAIL",
                !verdict.works,
                "{host} {assignment:?}: doctor {} vs hcs works={}: {}",
                check.status.as_str(),
                verdict.works,
                check.detail
            );
            // Whenever class-guid is in force, doctor says what it means, as hcs does.
            if verdict.in_force == "class-guid" && verdict.works {
                assert!(
                    check.detail.contains("every GPU"),
                    "{host} {assignment:?}: {}",
                    check.detail
                );
                assert!(
                    verdict.verdict.contains("every GPU"),
                    "{host}: {}",
                    verdict.verdict
                );
            }
            // Never "assigns each device by location path" when class-guid is in force.
            assert!(
                !(verdict.in_force == "class-guid" && check.detail.contains("by location path")),
                "{host} {assignment:?}: {}",
                check.detail
            );
            // The Windows build verdict agrees with the assignment verdict.
            if let Some(build) = find("Windows build") {
                if build.status.as_str() == "FAIL" {
                    assert!(
                        !verdict.works
                            || host == "ws2019-old" && verdict.in_force == "location-path",
                        "{host} {assignment:?}: build FAIL but hcs says it works: {}",
                        build.detail
                    );
                }
            }
        }
    }
    // Windows Server 2019 in class-guid mode (or auto, which falls back to it): the build passes,
    // with the caveat.
    let old = facts("ws2019-old");
    for assignment in [Assignment::ClassGuid, Assignment::Auto] {
        let p = Probes {
            assignment,
            ..probes(
                DirState::Writable,
                true,
                Some("containerd github.com/containerd/containerd v1.7.20"),
            )
        };
        let checks = doctor::checks(&old, &run(&old), &p);
        let build = checks
            .iter()
            .find(|c| c.name == "Windows build")
            .expect("build check");
        assert_eq!(
            build.status.as_str(),
            "PASS",
            "{assignment:?}: {}",
            build.detail
        );
        assert!(
            build
                .detail
                .contains("every container gets every GPU of the node"),
            "{}",
            build.detail
        );
    }
}
