//! `dxdp validate`: runs the checks of a container given GPUs by dxdp, each under a time limit,
//! and builds the `Validation` document and its text. The probes are behind
//! [`crate::backend::probe::Probes`] (native on Windows, fakes in tests); what their
//! answers mean is judged in `dxdp_core::validation`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::probe::Probes;
use crate::backend::HostFactsSource;
use crate::output::{ApiVersion, ValidatedDevice, ValidationDoc, ValidationKind};
use crate::util::bounded::{run_thread, Overdue};
use dxdp_core::facts::Attribute;
use dxdp_core::luid;
use dxdp_core::telemetry::isolation::{container_check, parse_luids};
use dxdp_core::validation::{
    feature_levels, is_loadable, judge_api, judge_d3d12, judge_runtime_files, parse_runtime_files,
    verdict, Api, CheckResult, FileState, Outcome,
};

/// The `DXDP_*` hints a container was given (the environment variables' raw values).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hints {
    /// `DXDP_ADAPTER_LUIDS`.
    pub(crate) luids: Option<String>,
    /// `DXDP_DEVICE_IDS`.
    pub(crate) device_ids: Option<String>,
    /// `DXDP_LOCATION_PATHS`.
    pub(crate) location_paths: Option<String>,
    /// `DXDP_VENDOR`.
    pub(crate) vendor: Option<String>,
    /// `DXDP_RUNTIME_FILES`.
    pub(crate) runtime_files: Option<String>,
}

impl Hints {
    /// The hints of this process's environment.
    pub fn from_env() -> Hints {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
        Hints {
            luids: var("DXDP_ADAPTER_LUIDS"),
            device_ids: var("DXDP_DEVICE_IDS"),
            location_paths: var("DXDP_LOCATION_PATHS"),
            vendor: var("DXDP_VENDOR"),
            runtime_files: var("DXDP_RUNTIME_FILES"),
        }
    }
}

/// What to check and how.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The hints.
    pub hints: Hints,
    /// Where the vendor DLLs are looked up (System32 unless overridden).
    pub library_dir: Option<PathBuf>,
    /// The vendor APIs to probe.
    pub apis: Vec<Api>,
    /// The time limit of each check.
    pub timeout: Duration,
    /// Bytes of the D3D12 round trip.
    pub bytes: usize,
    /// Whether adapters the container was not given make the adapters check fail.
    pub fail_on_leak: bool,
}

/// An adapter the container can see.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Visible {
    luid: i64,
    name: String,
    /// Whether it does graphics (DXCore attributes), unknown under DXGI.
    graphics: Option<bool>,
}

fn overdue(name: &str, e: &Overdue) -> CheckResult {
    match e {
        Overdue::TimedOut { .. } | Overdue::StillRunning { .. } => {
            CheckResult::new(name, Outcome::TimedOut, e.to_string()).remedy(
                "the call did not return: a hung driver or DLL; check the node's event log and the driver version, then run `dxdp validate` again",
            )
        }
        Overdue::Panicked { .. } => CheckResult::new(name, Outcome::Unknown, e.to_string()),
    }
}

/// Enumerates the adapters: DXCore (the facts source) first, DXGI where DXCore cannot be loaded.
fn visible(
    source: Arc<dyn HostFactsSource>,
    probes: Arc<dyn Probes>,
    limit: Duration,
) -> (String, Result<Vec<Visible>, String>) {
    let described = format!("DXCore ({})", source.describe());
    let src = source.clone();
    let dxcore = run_thread(limit, "enumerating adapters with DXCore", move || {
        src.load()
    })
    .map_err(|e| e.to_string())
    .and_then(|r| r.map_err(|e| e.to_string()));
    match dxcore {
        Ok(facts) => {
            let list = facts
                .adapters
                .iter()
                .filter(|a| a.is_hardware)
                .map(|a| Visible {
                    luid: a.luid,
                    name: a.driver_description.clone(),
                    graphics: if a.attributes.contains(&Attribute::D3D12_GRAPHICS)
                        || a.attributes.contains(&Attribute::D3D11_GRAPHICS)
                    {
                        Some(true)
                    } else if a.attributes.contains(&Attribute::D3D12_CORE_COMPUTE) {
                        Some(false)
                    } else {
                        None
                    },
                })
                .collect();
            (described, Ok(list))
        }
        Err(why) if source.is_simulated() => (described, Err(why)),
        Err(why) => {
            let p = probes.clone();
            let dxgi = run_thread(limit, "enumerating adapters with DXGI", move || {
                p.dxgi_adapters()
            })
            .map_err(|e| e.to_string())
            .and_then(|r| r);
            let described = format!("DXGI (DXCore cannot be used here: {why})");
            match dxgi {
                Ok(list) => (
                    described,
                    Ok(list
                        .into_iter()
                        .filter(|(_, _, software)| !software)
                        .map(|(luid, name, _)| Visible {
                            luid,
                            name,
                            graphics: None,
                        })
                        .collect()),
                ),
                Err(e) => (described, Err(format!("{why}; DXGI: {e}"))),
            }
        }
    }
}

fn list(text: &Option<String>) -> Vec<String> {
    text.as_deref()
        .map(|t| t.split(',').map(|s| s.trim().to_string()).collect())
        .unwrap_or_default()
}

/// Runs every check and builds the document.
pub fn run(
    plan: &Plan,
    source: Arc<dyn HostFactsSource>,
    probes: Arc<dyn Probes>,
) -> ValidationDoc {
    let mut checks: Vec<CheckResult> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let unavailable = probes.unavailable();
    let library_dir = plan
        .library_dir
        .clone()
        .unwrap_or_else(|| probes.library_dir());

    // 1. The adapters the container can see, against the ones it was given.
    let start = Instant::now();
    let (source_text, seen) = visible(source, probes.clone(), plan.timeout);
    let given = plan.hints.luids.as_deref().map(parse_luids);
    let mut adapters = match (&given, &seen) {
        (Some(Err(why)), _) => CheckResult::new("adapters", Outcome::Unknown, why.clone())
            .remedy("DXDP_ADAPTER_LUIDS is set by dxdp's Allocate: do not set it by hand, or set it to the LUIDs the container was given"),
        (_, Err(why)) => CheckResult::new(
            "adapters",
            Outcome::Unknown,
            format!("cannot enumerate the adapters in this container: {why}"),
        ),
        (None, Ok(v)) => CheckResult::new(
            "adapters",
            if v.is_empty() { Outcome::Unknown } else { Outcome::Skipped },
            format!(
                "DXDP_ADAPTER_LUIDS is not set (not a container dxdp gave GPUs), so there is nothing to compare; {} hardware adapter{} visible, each is validated",
                v.len(),
                if v.len() == 1 { "" } else { "s" }
            ),
        ),
        (Some(Ok(luids)), Ok(v)) => {
            let visible_pairs: Vec<(i64, String)> =
                v.iter().map(|a| (a.luid, a.name.clone())).collect();
            let check = container_check(luids, &visible_pairs);
            let mut c = if !check.missing.is_empty() {
                let names: Vec<String> = check.missing.iter().map(|a| luid::label(a.luid)).collect();
                CheckResult::new(
                    "adapters",
                    Outcome::Fail,
                    format!(
                        "{} of {} given adapter{} not visible here (LUID {})",
                        check.missing.len(),
                        check.allocated.len(),
                        if check.allocated.len() == 1 { " is" } else { "s are" },
                        names.join(", ")
                    ),
                )
                .remedy("the container did not get every GPU it was allocated: check the pod's events, `dxdp hcs` on the node (location-path assignment needs HCS schema 2.2+), and whether the node rebooted since the pod started (LUIDs change)")
            } else {
                CheckResult::new(
                    "adapters",
                    Outcome::Pass,
                    format!(
                        "every given adapter is visible ({} given, {} visible)",
                        check.allocated.len(),
                        check.visible.len()
                    ),
                )
            };
            if check.leaks() {
                let extra = format!(
                    "{} adapter{} visible that the container was not given (the Windows leak of microsoft/Windows-Containers#333; `dxdp audit` judges isolation)",
                    check.extra.len(),
                    if check.extra.len() == 1 { " is" } else { "s are" }
                );
                if plan.fail_on_leak && c.result == Outcome::Pass {
                    c.result = Outcome::Fail;
                    c.detail = extra;
                    c.remedy = Some("run one GPU per node, or one GPU-using pod per node, where isolation matters (docs/allocation.md)".into());
                } else {
                    notes.push(extra);
                }
            }
            c
        }
    };
    adapters.seconds = start.elapsed().as_secs_f64();
    checks.push(adapters);

    // The devices: the ones given, else every visible hardware adapter.
    let seen_list = seen.as_ref().map(|v| v.as_slice()).unwrap_or(&[]);
    let luids: Vec<i64> = match &given {
        Some(Ok(l)) => l.clone(),
        Some(Err(_)) => Vec::new(),
        None => seen_list.iter().map(|a| a.luid).collect(),
    };
    let (ids, paths, vendors) = (
        list(&plan.hints.device_ids),
        list(&plan.hints.location_paths),
        list(&plan.hints.vendor),
    );
    let hinted = matches!(given, Some(Ok(_)));
    let devices: Vec<ValidatedDevice> = luids
        .iter()
        .enumerate()
        .map(|(i, &luid)| ValidatedDevice {
            luid,
            model: seen_list
                .iter()
                .find(|a| a.luid == luid)
                .map(|a| a.name.clone())
                .unwrap_or_default(),
            device_id: hinted.then(|| ids.get(i).cloned()).flatten(),
            location_path: hinted.then(|| paths.get(i).cloned()).flatten(),
            vendor: hinted.then(|| vendors.get(i).cloned()).flatten(),
        })
        .collect();

    // 2. D3D12 on each device.
    for d in &devices {
        let start = Instant::now();
        let mut c = match &unavailable {
            Some(why) => CheckResult::new("d3d12", Outcome::Unknown, why.clone()),
            None => {
                let graphics = seen_list
                    .iter()
                    .find(|a| a.luid == d.luid)
                    .and_then(|a| a.graphics);
                let levels = feature_levels(graphics);
                let (p, luid, bytes, limit) = (probes.clone(), d.luid, plan.bytes, plan.timeout);
                let what = format!("the D3D12 round trip on adapter {}", luid::label(luid));
                match run_thread(plan.timeout, &what, move || {
                    p.d3d12(luid, &levels, bytes, limit)
                }) {
                    Ok(Ok(answer)) => judge_d3d12(luid, &answer),
                    Ok(Err(why)) => CheckResult::new(
                        "d3d12",
                        Outcome::Unknown,
                        format!("D3D12 could not be tried: {why}"),
                    ),
                    Err(e) => overdue("d3d12", &e),
                }
            }
        };
        c.device = Some(luid::label(d.luid));
        c.seconds = start.elapsed().as_secs_f64();
        checks.push(c);
    }
    if devices.is_empty() {
        checks.push(CheckResult::new(
            "d3d12",
            Outcome::Unknown,
            "no adapter to run D3D12 on (see the adapters check)",
        ));
    }

    // 3. The runtime files dxdp mounted.
    let start = Instant::now();
    let mut files_check = match (&plan.hints.runtime_files, &unavailable) {
        (None, _) => CheckResult::new(
            "runtime-files",
            Outcome::Skipped,
            "DXDP_RUNTIME_FILES is not set: dxdp mounted no runtime files, or the container was not given its GPU by dxdp",
        ),
        (Some(_), Some(why)) => CheckResult::new("runtime-files", Outcome::Unknown, why.clone()),
        (Some(text), None) => {
            let files = parse_runtime_files(text);
            let p = probes.clone();
            match run_thread(plan.timeout, "loading the runtime files", move || {
                files
                    .into_iter()
                    .map(|path| {
                        let present = Path::new(&path).is_file();
                        let load_error = (present && is_loadable(&path))
                            .then(|| p.load(Path::new(&path)).err())
                            .flatten();
                        FileState {
                            path,
                            present,
                            load_error,
                        }
                    })
                    .collect::<Vec<_>>()
            }) {
                Ok(states) => judge_runtime_files(&states),
                Err(e) => overdue("runtime-files", &e),
            }
        }
    };
    files_check.seconds = start.elapsed().as_secs_f64();
    checks.push(files_check);

    // 4. The vendor APIs.
    for &api in &plan.apis {
        let start = Instant::now();
        let mut c = match &unavailable {
            Some(why) => CheckResult::new(api.name(), Outcome::Unknown, why.clone()),
            None => {
                let (p, dir) = (probes.clone(), library_dir.clone());
                let what = format!("{} ({})", api.name(), api.dll());
                match run_thread(plan.timeout, &what, move || p.api(api, &dir)) {
                    Ok(answer) => judge_api(api, &answer),
                    Err(e) => overdue(api.name(), &e),
                }
            }
        };
        c.seconds = start.elapsed().as_secs_f64();
        checks.push(c);
    }

    let (v, failed) = verdict(&checks);
    if let Some(why) = &unavailable {
        notes.push(format!("{why}: only the adapters could be checked"));
    }
    ValidationDoc {
        api_version: ApiVersion,
        kind: ValidationKind,
        verdict: v,
        failed,
        source: source_text,
        devices,
        checks,
        notes,
    }
}

/// The document for people.
pub fn text(doc: &ValidationDoc) -> String {
    let mut out = String::new();
    let head = match doc.verdict {
        dxdp_core::validation::Verdict::Pass => "PASS: every check passed".to_string(),
        dxdp_core::validation::Verdict::Fail => format!("FAIL: {}", doc.failed.join(", ")),
        dxdp_core::validation::Verdict::Unknown => {
            format!("UNKNOWN: could not tell ({})", doc.failed.join(", "))
        }
    };
    out.push_str(&format!(
        "Validation {head} (exit code {})\n",
        doc.verdict.exit_code()
    ));
    out.push_str(&format!("Adapters from {}\n", doc.source));
    for d in &doc.devices {
        let mut line = format!("  device LUID {}", luid::label(d.luid));
        if !d.model.is_empty() {
            line.push_str(&format!(" {}", d.model));
        }
        if let Some(id) = &d.device_id {
            line.push_str(&format!(" ({id})"));
        }
        out.push_str(&line);
        out.push('\n');
    }
    for c in &doc.checks {
        let on = c
            .device
            .as_ref()
            .map(|d| format!(" on {d}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "{:<9} {}{on} ({:.1} s): {}\n",
            c.result.as_str().to_uppercase(),
            c.name,
            c.seconds,
            c.detail
        ));
        if let Some(r) = &c.remedy {
            out.push_str(&format!("          remedy: {r}\n"));
        }
    }
    for n in &doc.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::probe::ListedAdapter;
    use crate::backend::SourceError;
    use dxdp_core::facts::HostFacts;
    use dxdp_core::validation::{ApiAnswer, D3d12Answer, Verdict};

    /// No DXCore (as under Wine): the DXGI fallback must be used.
    struct NoDxcore;
    impl HostFactsSource for NoDxcore {
        fn describe(&self) -> String {
            "this Windows host".into()
        }
        fn is_simulated(&self) -> bool {
            false
        }
        fn load(&self) -> Result<HostFacts, SourceError> {
            Err(SourceError::Unavailable("dxcore.dll is missing".into()))
        }
    }

    struct Fake {
        adapters: Vec<ListedAdapter>,
        d3d12: D3d12Answer,
        hang: Option<Api>,
    }

    impl Probes for Fake {
        fn unavailable(&self) -> Option<String> {
            None
        }
        fn library_dir(&self) -> PathBuf {
            PathBuf::from("/nonexistent")
        }
        fn dxgi_adapters(&self) -> Result<Vec<ListedAdapter>, String> {
            Ok(self.adapters.clone())
        }
        fn d3d12(
            &self,
            _: i64,
            levels: &[u32],
            _: usize,
            _: Duration,
        ) -> Result<D3d12Answer, String> {
            assert_eq!(levels, [0xb000, 0x1000], "DXGI: 11_0, then 1_0_CORE");
            Ok(self.d3d12.clone())
        }
        fn load(&self, _: &Path) -> Result<(), String> {
            Ok(())
        }
        fn api(&self, api: Api, _: &Path) -> ApiAnswer {
            if self.hang == Some(api) {
                std::thread::sleep(Duration::from_secs(3600));
            }
            match api {
                Api::Cuda => ApiAnswer::Answered {
                    version: Some("12.4".into()),
                    devices: vec!["NVIDIA A10".into()],
                    needs_device: true,
                },
                _ => ApiAnswer::NotShipped,
            }
        }
    }

    fn plan(luids: Option<&str>) -> Plan {
        Plan {
            hints: Hints {
                luids: luids.map(str::to_string),
                device_ids: Some(r"PCI\VEN_10DE&DEV_2236\4&1".into()),
                ..Hints::default()
            },
            library_dir: None,
            apis: vec![Api::Cuda, Api::Vulkan],
            timeout: Duration::from_millis(300),
            bytes: 64,
            fail_on_leak: false,
        }
    }

    fn good() -> D3d12Answer {
        D3d12Answer {
            enumerator: Some("DXCore".into()),
            adapter: Some("NVIDIA A10".into()),
            feature_level: Some(0xb000),
            failed_step: None,
            mismatches: vec![],
            bytes: 64,
            gpu_seconds: Some(0.001),
        }
    }

    fn outcomes(doc: &ValidationDoc) -> Vec<(String, &'static str)> {
        doc.checks
            .iter()
            .map(|c| (c.name.clone(), c.result.as_str()))
            .collect()
    }

    #[test]
    fn a_container_with_its_gpu_passes_through_the_dxgi_fallback() {
        let fake = Fake {
            adapters: vec![
                (42, "NVIDIA A10".into(), false),
                (7, "Microsoft Basic Render Driver".into(), true),
            ],
            d3d12: good(),
            hang: None,
        };
        let doc = run(&plan(Some("42")), Arc::new(NoDxcore), Arc::new(fake));
        assert_eq!(doc.verdict, Verdict::Pass, "{}", text(&doc));
        assert!(
            doc.source
                .starts_with("DXGI (DXCore cannot be used here: dxcore.dll is missing"),
            "{}",
            doc.source
        );
        assert_eq!(
            outcomes(&doc),
            vec![
                ("adapters".into(), "pass"),
                ("d3d12".into(), "pass"),
                ("runtime-files".into(), "skipped"),
                ("cuda".into(), "pass"),
                ("vulkan".into(), "absent"),
            ]
        );
        assert_eq!(
            doc.devices[0].device_id.as_deref(),
            Some(r"PCI\VEN_10DE&DEV_2236\4&1")
        );
        assert_eq!(doc.devices[0].model, "NVIDIA A10");
        assert_eq!(
            doc.checks[1].device.as_deref(),
            Some("0x00000000_0x0000002A")
        );
    }

    #[test]
    fn a_missing_adapter_and_a_hung_api_fail_and_the_run_still_returns() {
        let fake = Fake {
            adapters: vec![
                (42, "NVIDIA A10".into(), false),
                (43, "NVIDIA A10".into(), false),
            ],
            d3d12: D3d12Answer::default(),
            hang: Some(Api::Cuda),
        };
        let started = Instant::now();
        let doc = run(&plan(Some("41")), Arc::new(NoDxcore), Arc::new(fake));
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(doc.verdict, Verdict::Fail);
        assert_eq!(
            doc.failed,
            vec!["adapters".to_string(), "d3d12".into(), "cuda".into()]
        );
        assert_eq!(
            doc.checks[0].detail,
            "1 of 1 given adapter is not visible here (LUID 0x00000000_0x00000029)"
        );
        assert_eq!(doc.checks[3].result, Outcome::TimedOut);
        assert!(
            doc.notes[0].starts_with("2 adapters are visible that the container was not given"),
            "{:?}",
            doc.notes
        );
        let t = text(&doc);
        assert!(
            t.starts_with("Validation FAIL: adapters, d3d12, cuda (exit code 1)\n"),
            "{t}"
        );
    }

    #[test]
    fn leaks_fail_only_when_asked_and_bad_hints_are_unknown() {
        let fake = || Fake {
            adapters: vec![(42, "A".into(), false), (43, "B".into(), false)],
            d3d12: good(),
            hang: None,
        };
        let mut p = plan(Some("42"));
        p.fail_on_leak = true;
        let doc = run(&p, Arc::new(NoDxcore), Arc::new(fake()));
        assert_eq!(doc.failed, vec!["adapters".to_string()]);
        let doc = run(&plan(Some("x")), Arc::new(NoDxcore), Arc::new(fake()));
        assert_eq!(doc.verdict, Verdict::Unknown);
        assert_eq!(doc.failed, vec!["adapters".to_string(), "d3d12".into()]);
        // No hints: every visible hardware adapter is validated.
        let doc = run(&plan(None), Arc::new(NoDxcore), Arc::new(fake()));
        assert_eq!(doc.verdict, Verdict::Pass);
        assert_eq!(doc.devices.len(), 2);
        assert_eq!(doc.devices[0].device_id, None);
        assert_eq!(doc.checks[0].result, Outcome::Skipped);
    }

    #[test]
    fn runtime_files_missing_in_the_container_fail() {
        let dir = tempfile::tempdir().unwrap();
        let here = dir.path().join("nvapi64.dll");
        std::fs::write(&here, b"MZ").unwrap();
        let mut p = plan(Some("42"));
        p.hints.runtime_files = Some(format!(
            "{};{}",
            here.display(),
            dir.path().join("nvcuda.dll").display()
        ));
        let fake = Fake {
            adapters: vec![(42, "A".into(), false)],
            d3d12: good(),
            hang: None,
        };
        let doc = run(&p, Arc::new(NoDxcore), Arc::new(fake));
        let files = &doc.checks[2];
        assert_eq!(files.result, Outcome::Fail);
        assert_eq!(
            files.detail,
            format!("missing: {}", dir.path().join("nvcuda.dll").display())
        );
    }
}
