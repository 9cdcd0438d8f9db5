//! `dxdp doctor`: node preflight checks, each PASS / WARN / FAIL with a one-line remedy.
//!
//! Pure: the CLI probes the live node (kubelet directory, `kubelet.sock`, containerd) and passes
//! the results in, so every verdict is tested on fixture hosts.

use super::hcs;
use dxdp_core::assignment::Assignment;
use dxdp_core::devices::{Discovery, ExclusionCode, Resource};
use dxdp_core::facts::{HostFacts, OsFacts};
use dxdp_core::pipeline::winpath;

use crate::output::{Check, Status};

/// The state of the kubelet's device-plugin directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirState {
    /// It does not exist.
    Missing,
    /// It exists but a file cannot be created in it.
    NotWritable(String),
    /// It exists and is writable.
    Writable,
    /// Not looked at, and why (a simulated host, without an explicit `--kubelet-dir`).
    NotChecked(String),
}

/// What the CLI found on the live node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probes {
    /// The kubelet's device-plugin directory.
    pub kubelet_dir: String,
    /// Why that directory (`default from %SystemDrive%=D:`, `from --kubelet-dir`).
    pub kubelet_dir_reason: String,
    /// Its state.
    pub kubelet_dir_state: DirState,
    /// Whether `kubelet.sock` exists there; `None` when the directory was not checked.
    pub kubelet_socket: Option<bool>,
    /// The containerd version and where it came from (`None`: not found).
    pub containerd: Option<(String, String)>,
    /// The kubelet version and where it came from (`None`: unknown, and the check is skipped).
    pub kubelet: Option<(String, String)>,
    /// The configured parts that read the kubelet's PodResources API, which Windows kubelets
    /// serve from 1.27: `telemetry.enabled`, `health.events`.
    pub pod_resources_users: Vec<String>,
    /// The resources the plugin would serve.
    pub resources: Vec<Resource>,
    /// The configured assignment mode.
    pub assignment: Assignment,
    /// `health.expectedDevices` for the served resources (empty: no expectation, no check).
    pub expected: std::collections::BTreeMap<Resource, u32>,
}

fn check(name: &str, status: Status, detail: impl Into<String>, remedy: Option<&str>) -> Check {
    Check {
        name: name.to_string(),
        status,
        detail: detail.into(),
        remedy: if matches!(status, Status::Pass | Status::Info) {
            None
        } else {
            remedy.map(str::to_string)
        },
    }
}

/// Windows Server 2019's build: the oldest that works (class-guid only).
const WS2019: u64 = 17763;

/// The third component of `10.0.20348.1547`.
fn build_number(build: &str) -> Option<u64> {
    build.split('.').nth(2)?.parse().ok()
}

/// `major.minor` from `containerd --version` output or a bare version.
pub(crate) fn containerd_release(text: &str) -> Option<(u64, u64)> {
    text.split_whitespace().find_map(|token| {
        let t = token.strip_prefix('v').unwrap_or(token);
        let mut parts = t.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts
            .next()?
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()?;
        Some((major, minor))
    })
}

/// Whether the host's HCS can do the configured assignment mode.
fn assignment_check(os: &OsFacts, configured: Assignment) -> Check {
    const NAME: &str = "HCS device assignment";
    let hcs = hcs::report(os);
    let schema = hcs.highest_schema.clone().unwrap_or_default();
    if hcs.hcs_schema_versions.is_empty() || hcs.highest_schema.is_none() {
        return check(
            NAME,
            Status::Fail,
            hcs.verdict,
            Some("install the Containers feature (Install-WindowsFeature Containers) and restart"),
        );
    }
    match (
        configured,
        dxdp_core::assignment::supports_location_path(os),
    ) {
        (Assignment::ClassGuid, true) => check(
            NAME,
            Status::Pass,
            format!("assignment class-guid works on HCS schema {schema}; every container gets every GPU of the node (location-path, which auto picks here, would give each container exactly its devices)"),
            None,
        ),
        (_, true) => check(
            NAME,
            Status::Pass,
            format!(
                "assignment {}: HCS schema {schema} assigns each device by location path",
                configured.as_str()
            ),
            None,
        ),
        (Assignment::LocationPath, false) => check(
            NAME,
            Status::Fail,
            format!("assignment location-path needs HCS schema 2.2+, this host has {schema}: every container start would fail"),
            Some("use assignment auto or class-guid on this host (every GPU of the node then goes to each container), or upgrade to Windows Server 2022 or later"),
        ),
        (Assignment::Auto, false) => check(
            NAME,
            Status::Warn,
            format!("assignment auto falls back to class-guid on HCS schema {schema}: every container gets every GPU of the node"),
            Some("upgrade to Windows Server 2022 or later for one device per container"),
        ),
        (Assignment::ClassGuid, false) => check(
            NAME,
            Status::Pass,
            format!("assignment class-guid works on HCS schema {schema}; every container gets every GPU of the node"),
            None,
        ),
    }
}

/// The oldest kubelet dxdp works with: older kubelets dial device plugins with the socket path
/// as the HTTP/2 `:authority`, which the Rust HTTP/2 stack (h2) rejects, so registration fails.
pub(crate) const MIN_KUBELET: (u64, u64) = (1, 26);

/// The oldest kubelet that serves PodResources on Windows (kubernetes#115133; before it the
/// kubelet served no local endpoint on Windows): the minimum of a configuration that reads it.
pub(crate) const MIN_KUBELET_POD_RESOURCES: (u64, u64) = (1, 27);

/// The kubelet version check, or nothing when the version is unknown: FAIL below 1.26 (no
/// registration), and below 1.27 when `pod_resources_users` (the configured parts reading
/// PodResources) is not empty.
fn kubelet_check(
    kubelet: Option<&(String, String)>,
    pod_resources_users: &[String],
) -> Option<Check> {
    let min = if pod_resources_users.is_empty() {
        MIN_KUBELET
    } else {
        MIN_KUBELET_POD_RESOURCES
    };
    let name = format!("kubelet {}.{}+", min.0, min.1);
    let (version, source) = kubelet?;
    let users = pod_resources_users.join(" and ");
    Some(match containerd_release(version) {
        Some(v) if v >= min => check(
            &name,
            Status::Pass,
            format!("kubelet {}.{} ({source})", v.0, v.1),
            None,
        ),
        Some(v) if v < MIN_KUBELET => check(
            &name,
            Status::Fail,
            format!(
                "kubelet {}.{} ({source}) sends the plugin socket path as the HTTP/2 :authority, \
                 which dxdp's HTTP/2 stack rejects: registration will fail",
                v.0, v.1
            ),
            Some(&format!(
                "upgrade the node to Kubernetes {}.{} or later (see docs/install.md)",
                min.0, min.1
            )),
        ),
        Some(v) => check(
            &name,
            Status::Fail,
            format!(
                "kubelet {}.{} ({source}) serves no PodResources API on Windows (from 1.27), \
                 which {users} read: they cannot tell which pod holds which GPU",
                v.0, v.1
            ),
            Some("upgrade the node to Kubernetes 1.27 or later, or turn those settings off to serve devices only (see docs/configuration.md)"),
        ),
        None => check(
            &name,
            Status::Warn,
            format!("cannot read a version from {version:?} ({source})"),
            Some(&format!(
                "check `kubelet --version`; dxdp needs Kubernetes {}.{} or later",
                min.0, min.1
            )),
        ),
    })
}

/// Runs every check.
pub fn checks(facts: &HostFacts, discovery: &Discovery, probes: &Probes) -> Vec<Check> {
    let os = facts.os.clone().unwrap_or_default();
    let mut out = Vec::new();

    out.push(match os.build.as_deref().and_then(build_number) {
        None => check(
            "Windows build",
            Status::Warn,
            "the OS build is unknown",
            Some("run dxdp on the node itself, or record os.build in the snapshot"),
        ),
        Some(b) if b >= 20348 => {
            let name = match b {
                20348 => "Windows Server 2022",
                26100 => "Windows Server 2025",
                _ => "Windows",
            };
            check(
                "Windows build",
                Status::Pass,
                format!("{name} (build {})", os.build.as_deref().unwrap_or_default()),
                None,
            )
        }
        // Windows Server 2019 works with class-guid (every GPU to every container), as the
        // assignment check below says in the same words.
        Some(b) if b >= WS2019 => match probes.assignment.resolve(&os) {
            Assignment::ClassGuid => check(
                "Windows build",
                Status::Pass,
                format!(
                    "Windows Server 2019 (build {}) with assignment {}: class-guid works; every container gets every GPU of the node",
                    os.build.as_deref().unwrap_or_default(),
                    probes.assignment.as_str()
                ),
                None,
            ),
            _ => check(
                "Windows build",
                Status::Fail,
                format!("build {b} is older than Windows Server 2022 (20348): assignment location-path needs it"),
                Some("use assignment auto or class-guid on this node (every GPU of the node then goes to each container), or Windows Server 2022 (20348) or 2025 (26100) nodes"),
            ),
        },
        Some(b) => check(
            "Windows build",
            Status::Fail,
            format!("build {b} is older than Windows Server 2019 (17763): HostProcess containers and device assignment need it"),
            Some("use Windows Server 2022 (20348) or Windows Server 2025 (26100) nodes"),
        ),
    });

    out.push(assignment_check(&os, probes.assignment));

    out.push(match &probes.containerd {
        None => check(
            "containerd 1.7+",
            Status::Warn,
            "containerd was not found",
            Some("install containerd 1.7 or later (device assignment needs it), or check PATH"),
        ),
        Some((version, source)) => match containerd_release(version) {
            Some(v) if v >= (1, 7) => check(
                "containerd 1.7+",
                Status::Pass,
                format!("containerd {}.{} ({source})", v.0, v.1),
                None,
            ),
            Some(v) => check(
                "containerd 1.7+",
                Status::Fail,
                format!(
                    "containerd {}.{} ({source}) cannot assign devices to Windows containers",
                    v.0, v.1
                ),
                Some("upgrade containerd to 1.7 or later"),
            ),
            None => check(
                "containerd 1.7+",
                Status::Warn,
                format!("cannot read a version from {version:?} ({source})"),
                Some("check `containerd --version`"),
            ),
        },
    });

    if let Some(c) = kubelet_check(probes.kubelet.as_ref(), &probes.pod_resources_users) {
        out.push(c);
    }

    let dir = format!("{} ({})", probes.kubelet_dir, probes.kubelet_dir_reason);
    out.push(match &probes.kubelet_dir_state {
        DirState::Writable => check(
            "kubelet device-plugin directory",
            Status::Pass,
            format!("{dir} exists and is writable"),
            None,
        ),
        DirState::Missing => check(
            "kubelet device-plugin directory",
            Status::Fail,
            format!("{dir} does not exist"),
            Some("is this a Kubernetes node? start the kubelet, or pass --kubelet-dir"),
        ),
        DirState::NotWritable(why) => check(
            "kubelet device-plugin directory",
            Status::Fail,
            format!("{dir} is not writable: {why}"),
            Some("run dxdp as a HostProcess container (NT AUTHORITY\\SYSTEM) or as administrator"),
        ),
        DirState::NotChecked(why) => check(
            "kubelet device-plugin directory",
            Status::Info,
            format!("skipped: {why}"),
            None,
        ),
    });

    out.push(match probes.kubelet_socket {
        Some(true) => check("kubelet.sock", Status::Pass, "present", None),
        Some(false) => check(
            "kubelet.sock",
            Status::Fail,
            format!("kubelet.sock is missing from {}", probes.kubelet_dir),
            Some("start the kubelet; the plugin waits for it and registers when it appears"),
        ),
        None => check(
            "kubelet.sock",
            Status::Info,
            "skipped: the kubelet directory was not checked",
            None,
        ),
    });

    let mut total = 0;
    for resource in &probes.resources {
        let healthy = discovery
            .devices_for(*resource)
            .filter(|d| d.health.is_healthy())
            .count();
        let all = discovery.devices_for(*resource).count();
        total += healthy;
        let name = format!("devices for {}", resource.default_resource_name());
        out.push(if all == 0 {
            // Normal on a node without such devices (every all-WDDM node has no compute device).
            check(
                &name,
                Status::Info,
                format!("no {resource} devices on this node"),
                None,
            )
        } else {
            check(
                &name,
                if healthy > 0 { Status::Pass } else { Status::Warn },
                format!("{healthy} healthy of {all}"),
                Some("every device of this resource is unhealthy: see the health checks below and Device Manager"),
            )
        });
    }
    if total == 0 {
        out.push(check(
            "assignable devices",
            Status::Fail,
            "no healthy device for any enabled resource",
            Some("install the GPU driver, check Device Manager, and see `dxdp discover`"),
        ));
    }

    for device in &discovery.devices {
        let missing = device
            .runtime_files
            .iter()
            .filter(|(_, f)| !f.exists && f.origin == dxdp_core::devices::Origin::Registry)
            .count();
        let name = format!(
            "driver files of {} ({})",
            device.description, device.location_path
        );
        let bad_store = device
            .driver_store_path
            .as_deref()
            .and_then(|store| winpath::check_local_absolute(store).err());
        out.push(match (&device.driver_store_path, missing) {
            (Some(store), _) if bad_store.is_some() => check(
                &name,
                Status::Warn,
                format!(
                    "the driver store path {} {}: no runtime files will be mounted",
                    dxdp_core::quote::quote(store),
                    bad_store.unwrap_or_default()
                ),
                Some("a driver store must be a local directory (C:\\Windows\\System32\\DriverStore\\...); reinstall the driver, or fix the host snapshot"),
            ),
            (None, _) => check(&name, Status::Warn, "the driver store path is unknown: no runtime files will be mounted", Some("reinstall the driver; attach `dxdp snapshot` to a bug report")),
            (Some(_), _) if device.driver_key.is_none() && !discovery.in_container => check(
                &name,
                Status::Warn,
                "the device node has no driver key: no runtime files (CUDA, OpenCL, Vulkan, ...) will be mounted",
                Some("reinstall the driver (Device Manager shows whether one is installed)"),
            ),
            (Some(store), 0) => check(&name, Status::Pass, present_message(device, store), None),
            (Some(store), n) => check(
                &name,
                Status::Warn,
                format!("{n} runtime file(s) listed by the driver are missing from {store}"),
                Some("reinstall or update the driver; APIs that need the missing files will not work in containers"),
            ),
        });
        if !device.health.is_healthy() {
            out.push(check(
                &format!("health of {} ({})", device.description, device.location_path),
                Status::Warn,
                device.health.reason.clone().unwrap_or_default(),
                Some("check Device Manager; the device is advertised as Unhealthy and gets no new pods"),
            ));
        }
    }

    for e in discovery
        .excluded
        .iter()
        .filter(|e| e.code != ExclusionCode::SoftwareAdapter)
    {
        out.push(check(
            &format!("left out: {}", e.description),
            Status::Warn,
            e.reason.clone(),
            Some("see docs/troubleshooting.md"),
        ));
    }

    if !discovery.warnings.is_empty() {
        let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
        for w in &discovery.warnings {
            *counts.entry(w.code.as_str()).or_default() += 1;
        }
        let codes: Vec<String> = counts
            .iter()
            .map(|(code, n)| match n {
                1 => code.to_string(),
                n => format!("{code} x{n}"),
            })
            .collect();
        out.push(check(
            "discovery warnings",
            Status::Warn,
            format!(
                "{} warning{} from discovery: {}",
                discovery.warnings.len(),
                if discovery.warnings.len() == 1 {
                    ""
                } else {
                    "s"
                },
                codes.join(", ")
            ),
            Some("see the warnings of `dxdp discover` and their codes in docs/troubleshooting.md"),
        ));
    }

    if !probes.expected.is_empty() {
        let counts = dxdp_core::health::expected::judge(discovery, &probes.expected);
        let each: Vec<String> = counts
            .iter()
            .map(|c| format!("{}: {} of {} expected", c.resource, c.found, c.expected))
            .collect();
        out.push(
            match dxdp_core::health::expected::missing_message(&counts) {
                None => check(
                    "expected GPUs",
                    Status::Pass,
                    format!("{} (health.expectedDevices)", each.join("; ")),
                    None,
                ),
                Some(m) => check(
                    "expected GPUs",
                    Status::Warn,
                    format!("GPUs missing: {m} (health.expectedDevices)"),
                    Some("a GPU this node should have is gone: see docs/alerts.md#dxdpgpumissing (Device Manager, the VM size, the host's GPU assignment)"),
                ),
            },
        );
    }

    let gpus = discovery
        .devices
        .iter()
        .filter(|d| d.resource.is_some())
        .count();
    if gpus > 1 {
        out.push(check(
            "multiple GPUs",
            Status::Warn,
            format!("{gpus} devices on this node: a container given one GPU may still see all of them (a Windows limitation)"),
            Some("run one GPU per node where isolation matters; see docs/allocation.md"),
        ));
    }
    out
}

/// The widest check name that keeps its detail on the same line in [`text`].
pub(crate) const NAME_WIDTH: usize = 48;

/// The checks for people: status, name and detail in aligned columns, remedies below, and a
/// summary.
pub fn text(checks: &[Check]) -> String {
    let names: Vec<String> = checks
        .iter()
        .map(|c| dxdp_core::quote::clean(&c.name))
        .collect();
    // The name column is as wide as the widest name up to NAME_WIDTH; a longer name has its
    // detail on the next line, at the same column.
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .filter(|&w| w <= NAME_WIDTH)
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (c, name) in checks.iter().zip(&names) {
        let detail = dxdp_core::quote::clean(&c.detail);
        if name.chars().count() > width {
            out.push_str(&format!(
                "{}  {name}\n{:indent$}{detail}\n",
                c.status.as_str(),
                "",
                indent = 6 + width + 2
            ));
        } else {
            out.push_str(&format!(
                "{}  {name:<width$}  {detail}\n",
                c.status.as_str()
            ));
        }
        if let Some(remedy) = &c.remedy {
            out.push_str(&format!("      -> {remedy}\n"));
        }
    }
    let count = |s| checks.iter().filter(|c| c.status == s).count();
    out.push_str(&format!(
        "\nSummary: {} PASS, {} WARN, {} FAIL, {} INFO\n",
        count(Status::Pass),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Info)
    ));
    out
}

/// Whether any check failed.
pub fn failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.status == Status::Fail)
}

/// "N runtime files present in STORE", and how many optional files (dxdp's vendor defaults or
/// configured additions) the host does not have, which are simply not mounted.
fn present_message(device: &dxdp_core::devices::Device, store: &str) -> String {
    let present = device
        .runtime_files
        .iter()
        .filter(|(_, f)| f.exists)
        .count();
    let absent = device.runtime_files.len() - present;
    if absent == 0 {
        format!("{present} runtime files present in {store}")
    } else {
        format!("{present} runtime files present in {store} ({absent} optional file(s) absent, not mounted)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_versions() {
        let table = [
            ("containerd github.com/containerd/containerd v1.7.20 8fc6bcff51318944179630522a095cc9dbf9f353", Some((1, 7))),
            ("containerd containerd.io 2.0.0 207ad711", Some((2, 0))),
            ("1.6.28", Some((1, 6))),
            ("v1.7.0-rc.1", Some((1, 7))),
            ("garbage", None),
        ];
        for (text, expected) in table {
            assert_eq!(containerd_release(text), expected, "{text}");
        }
    }

    #[test]
    fn kubelet_versions() {
        let telemetry = ["telemetry.enabled".to_string()];
        let probe = |v: &str, users: &[String]| {
            kubelet_check(
                Some(&(v.to_string(), "kubelet --version".to_string())),
                users,
            )
            .map(|c| (c.name, c.status))
        };
        let (pass, fail, warn) = (Status::Pass, Status::Fail, Status::Warn);
        let is = |name: &str, status| Some((name.to_string(), status));
        assert_eq!(kubelet_check(None, &telemetry), None, "unknown: no check");
        // A configuration reading PodResources needs 1.27 on Windows.
        assert_eq!(
            probe("Kubernetes v1.27.0", &telemetry),
            is("kubelet 1.27+", pass)
        );
        assert_eq!(
            probe("Kubernetes v1.31.4-eks-1234", &telemetry),
            is("kubelet 1.27+", pass)
        );
        assert_eq!(
            probe("Kubernetes v1.26.15", &telemetry),
            is("kubelet 1.27+", fail)
        );
        assert_eq!(probe("1.25.16", &telemetry), is("kubelet 1.27+", fail));
        assert_eq!(probe("garbage", &telemetry), is("kubelet 1.27+", warn));
        // Device serving alone works from 1.26.
        assert_eq!(probe("Kubernetes v1.26.0", &[]), is("kubelet 1.26+", pass));
        assert_eq!(probe("1.25.16", &[]), is("kubelet 1.26+", fail));
        assert_eq!(probe("Kubernetes v1.24.7", &[]), is("kubelet 1.26+", fail));
        let old = kubelet_check(
            Some(&("v1.25.3".into(), "from the host snapshot".into())),
            &[],
        );
        assert_eq!(
            old.map(|c| (c.detail, c.remedy)),
            Some((
                "kubelet 1.25 (from the host snapshot) sends the plugin socket path as the HTTP/2 :authority, which dxdp's HTTP/2 stack rejects: registration will fail".to_string(),
                Some("upgrade the node to Kubernetes 1.26 or later (see docs/install.md)".to_string())
            ))
        );
        let users = ["telemetry.enabled".to_string(), "health.events".to_string()];
        let no_pod_resources = kubelet_check(
            Some(&("v1.26.3".into(), "kubelet --version".into())),
            &users,
        );
        assert_eq!(
            no_pod_resources.map(|c| (c.detail, c.remedy)),
            Some((
                "kubelet 1.26 (kubelet --version) serves no PodResources API on Windows (from 1.27), which telemetry.enabled and health.events read: they cannot tell which pod holds which GPU".to_string(),
                Some("upgrade the node to Kubernetes 1.27 or later, or turn those settings off to serve devices only (see docs/configuration.md)".to_string())
            ))
        );
    }

    #[test]
    fn build_numbers() {
        assert_eq!(build_number("10.0.20348.1547"), Some(20348));
        assert_eq!(build_number("10.0.17763"), Some(17763));
        assert_eq!(build_number("x"), None);
    }
}
