//! Runtime files: the driver's `CopyToVm*` registry values turned into files to mount.
//!
//! Drivers list the user-mode DLLs that non-DirectX APIs (CUDA, OpenCL, Vulkan, NVENC, ...) need
//! in four subkeys of their driver key. Every entry is validated so that nothing can point outside
//! the driver store or land outside `System32` / `SysWOW64`; problems become warnings, never errors.

use std::collections::{HashMap, HashSet};

use crate::devices::{Origin, RuntimeFile, RuntimeFiles, TargetDir, Warning, WarningCode};
use crate::facts::{RegData, RegType, RegistryKey, RegistryValue};
use crate::pipeline::winpath;
use crate::quote;

/// The driver class root in the registry.
pub const CLASS_ROOT: &str = r"HKLM\SYSTEM\CurrentControlSet\Control\Class";

/// The four subkeys, in the order they are read, with their target directory.
pub const SUBKEYS: [(&str, TargetDir); 4] = [
    ("CopyToVmOverwrite", TargetDir::System32),
    ("CopyToVmWhenNewer", TargetDir::System32),
    ("CopyToVmOverwriteWow64", TargetDir::SysWow64),
    ("CopyToVmWhenNewerWow64", TargetDir::SysWow64),
];

/// Built-in additions per PCI vendor: (vendor ID, target, source, destination).
const VENDOR_DEFAULTS: [(u32, TargetDir, &str, &str); 3] = [
    (
        crate::vendor::NVIDIA,
        TargetDir::System32,
        "nvidia-smi.exe",
        "nvidia-smi.exe",
    ),
    (
        crate::vendor::NVIDIA,
        TargetDir::System32,
        "vulkaninfo-x64.exe",
        "vulkaninfo.exe",
    ),
    (
        crate::vendor::NVIDIA,
        TargetDir::SysWow64,
        "vulkaninfo-x86.exe",
        "vulkaninfo.exe",
    ),
];

/// Registry keys indexed for case-insensitive lookup.
pub struct RegistryIndex<'a> {
    keys: HashMap<String, &'a RegistryKey>,
}

impl<'a> RegistryIndex<'a> {
    /// Indexes `keys`; when a key appears twice the first one is used.
    pub fn new(keys: &'a [RegistryKey]) -> Self {
        let mut map = HashMap::new();
        for key in keys {
            map.entry(registry_key_id(&key.key)).or_insert(key);
        }
        RegistryIndex { keys: map }
    }

    /// The key at `path`, if the host has it.
    pub fn get(&self, path: &str) -> Option<&'a RegistryKey> {
        self.keys.get(&registry_key_id(path)).copied()
    }
}

fn registry_key_id(path: &str) -> String {
    let key = winpath::compare_key(path);
    match key.strip_prefix(r"hkey_local_machine\") {
        Some(rest) => format!(r"hklm\{rest}"),
        None => key,
    }
}

/// Host files indexed for case-insensitive lookup.
pub struct FileIndex {
    files: HashSet<String>,
}

impl FileIndex {
    /// Indexes the given absolute host paths.
    pub fn new(files: &[String]) -> Self {
        FileIndex {
            files: files.iter().map(|f| winpath::compare_key(f)).collect(),
        }
    }

    /// Whether `path` exists on the host.
    pub fn contains(&self, path: &str) -> bool {
        self.files.contains(&winpath::compare_key(path))
    }
}

/// A runtime file added by configuration (`runtimeFiles.additional`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdditionalFile {
    /// The PCI vendor whose devices get the file.
    pub vendor_id: u32,
    /// System32 or SysWOW64.
    pub target: TargetDir,
    /// Source relative to the driver store.
    pub source: String,
    /// Destination file name; the source's file name when absent.
    pub destination: Option<String>,
}

/// What the rules need to know about one device.
pub struct DeviceContext<'a> {
    /// How warnings name the device.
    pub label: &'a str,
    /// The kubelet device ID, for the warnings' `device`.
    pub device_id: &'a str,
    /// The adapter LUID, for the warnings' `luid`.
    pub luid: i64,
    /// The driver key below [`CLASS_ROOT`].
    pub driver_key: &'a str,
    /// The expanded driver store directory.
    pub driver_store: &'a str,
    /// PCI vendor ID, for the built-in and configured additions.
    pub vendor_id: u32,
    /// Configured additions (all vendors; filtered here).
    pub additional: &'a [AdditionalFile],
    /// Destination names never mounted (case-insensitive).
    pub exclude: &'a [String],
}

/// An entry before its host path is resolved.
struct Entry {
    source: String,
    destination: String,
    origin: Origin,
    registry_value: Option<String>,
}

/// Resolves the runtime files of one device; problems are appended to `warnings`.
pub fn resolve(
    device: &DeviceContext<'_>,
    registry: &RegistryIndex<'_>,
    files: &FileIndex,
    warnings: &mut Vec<Warning>,
) -> RuntimeFiles {
    let warning = |code, message| Warning::device(code, device.device_id, device.luid, message);
    let mut result = RuntimeFiles::default();
    for target in [TargetDir::System32, TargetDir::SysWow64] {
        let mut entries: Vec<Entry> = Vec::new();
        let mut taken: HashMap<String, String> = HashMap::new();
        for (subkey, _) in SUBKEYS.iter().filter(|(_, t)| *t == target) {
            let path = format!(r"{CLASS_ROOT}\{}\{subkey}", device.driver_key);
            let Some(key) = registry.get(&path) else {
                continue;
            };
            let mut values: Vec<&RegistryValue> = key.values.iter().collect();
            values.sort_by(|a, b| {
                a.name
                    .to_lowercase()
                    .cmp(&b.name.to_lowercase())
                    .then_with(|| a.name.cmp(&b.name))
            });
            for value in values {
                let label = format!(r"{subkey}\{}", quote::bounded(&value.name));
                let Some(entry) = parse_value(value, &label, device, warnings) else {
                    continue;
                };
                let dest_key = entry.destination.to_lowercase();
                if let Some(first) = taken.get(&dest_key) {
                    warnings.push(warning(WarningCode::RuntimeFileDuplicate, format!(
                        "device {}: registry value {label} maps to {}\\{} which {first} already provides; dropped",
                        device.label,
                        target.name(),
                        quote::bounded(&entry.destination)
                    )));
                    continue;
                }
                taken.insert(dest_key, label);
                entries.push(entry);
            }
        }
        for (vendor, t, source, destination) in VENDOR_DEFAULTS {
            if vendor != device.vendor_id || t != target {
                continue;
            }
            if taken.contains_key(&destination.to_lowercase()) {
                continue;
            }
            taken.insert(destination.to_lowercase(), "a vendor default".into());
            entries.push(Entry {
                source: source.into(),
                destination: destination.into(),
                origin: Origin::VendorDefault,
                registry_value: None,
            });
        }
        for extra in device
            .additional
            .iter()
            .filter(|a| a.vendor_id == device.vendor_id && a.target == target)
        {
            let label = format!("runtimeFiles.additional {}", quote::bounded(&extra.source));
            let strings: Vec<String> = std::iter::once(extra.source.clone())
                .chain(extra.destination.clone())
                .collect();
            let value = RegistryValue {
                name: label.clone(),
                kind: RegType::REG_MULTI_SZ,
                data: RegData::Strings(strings),
            };
            let Some(mut entry) = parse_value(&value, &label, device, warnings) else {
                continue;
            };
            if taken.contains_key(&entry.destination.to_lowercase()) {
                warnings.push(warning(
                    WarningCode::RuntimeFileDuplicate,
                    format!(
                    "device {}: {label} maps to {}\\{} which the driver already provides; dropped",
                    device.label,
                    target.name(),
                    quote::bounded(&entry.destination)
                ),
                ));
                continue;
            }
            taken.insert(entry.destination.to_lowercase(), label);
            entry.origin = Origin::Config;
            entry.registry_value = None;
            entries.push(entry);
        }
        entries.retain(|e| {
            !device
                .exclude
                .iter()
                .any(|x| x.eq_ignore_ascii_case(&e.destination))
        });
        let resolved: Vec<RuntimeFile> = entries
            .into_iter()
            .map(|e| {
                let host_path = winpath::join(device.driver_store, &e.source);
                let exists = files.contains(&host_path);
                if !exists && e.origin != Origin::VendorDefault {
                    warnings.push(warning(WarningCode::RuntimeFileMissing, format!(
                        "device {}: runtime file {} (for {}\\{}) does not exist on the host; it will not be mounted",
                        device.label,
                        quote::bounded(&host_path),
                        target.name(),
                        quote::bounded(&e.destination)
                    )));
                }
                RuntimeFile {
                    source: e.source,
                    destination: e.destination,
                    origin: e.origin,
                    registry_value: e.registry_value,
                    host_path,
                    exists,
                }
            })
            .collect();
        match target {
            TargetDir::System32 => result.system32 = resolved,
            TargetDir::SysWow64 => result.syswow64 = resolved,
        }
    }
    result
}

/// Every host path the runtime-file rules would look at for `facts`, whether or not it exists:
/// what a backend must check for existence to fill `files`. Includes integrated and detachable
/// adapters so that a later configuration change needs no new facts.
pub fn candidate_host_paths(facts: &crate::facts::HostFacts) -> Vec<String> {
    let (facts, _) = super::matching::attach(facts);
    let facts = facts.as_ref();
    let system_root = facts
        .os
        .as_ref()
        .map(|os| os.system_root())
        .unwrap_or(crate::facts::DEFAULT_SYSTEM_ROOT);
    let registry = RegistryIndex::new(&facts.registry);
    let nothing_exists = FileIndex::new(&[]);
    let mut paths = Vec::new();
    for adapter in &facts.adapters {
        let (Some(store), Some(driver_key)) = (
            adapter
                .driver_store_path
                .as_deref()
                .filter(|p| !p.is_empty()),
            adapter
                .pnp
                .as_ref()
                .and_then(|p| p.driver_key.as_deref())
                .filter(|k| !k.is_empty()),
        ) else {
            continue;
        };
        let store = winpath::expand_system_root(store, system_root);
        let device = DeviceContext {
            label: "",
            device_id: "",
            luid: adapter.luid,
            driver_key,
            driver_store: &store,
            vendor_id: adapter.hardware_id.vendor_id,
            additional: &[],
            exclude: &[],
        };
        let files = resolve(&device, &registry, &nothing_exists, &mut Vec::new());
        paths.extend(files.iter().map(|(_, f)| f.host_path.clone()));
    }
    paths.sort();
    paths.dedup();
    paths
}

/// Turns one registry value into an entry, or explains in `warnings` why not.
fn parse_value(
    value: &RegistryValue,
    label: &str,
    device: &DeviceContext<'_>,
    warnings: &mut Vec<Warning>,
) -> Option<Entry> {
    let mut warn = |code, what: String| {
        warnings.push(Warning::device(
            code,
            device.device_id,
            device.luid,
            format!("device {}: registry value {label} {what}", device.label),
        ));
    };
    let strings: Vec<&str> = match (value.kind, &value.data) {
        (RegType::REG_SZ, RegData::String(s)) => vec![s.as_str()],
        (RegType::REG_MULTI_SZ, RegData::Strings(list)) => {
            if list.len() > 2 {
                warn(
                    WarningCode::RegistryValueExtraStrings,
                    format!(
                        "has {} strings; only the first two (source, destination) are used",
                        list.len()
                    ),
                );
            }
            list.iter().take(2).map(String::as_str).collect()
        }
        (kind, _) => {
            warn(
                WarningCode::RegistryValueType,
                format!("has type {kind:?}; only REG_SZ and REG_MULTI_SZ are used; ignored"),
            );
            return None;
        }
    };
    let raw_source = strings.first().copied().unwrap_or_default();
    if raw_source.is_empty() {
        warn(
            WarningCode::RuntimeFileEmptySource,
            "has an empty source; ignored".into(),
        );
        return None;
    }
    let source = match winpath::normalize_source(raw_source) {
        Ok(s) => s,
        Err(why) => {
            warn(
                WarningCode::RuntimeFileSourceRejected,
                format!("rejected: source {} {why}", quote::quote(raw_source)),
            );
            return None;
        }
    };
    let destination = match strings.get(1).copied().filter(|d| !d.is_empty()) {
        Some(d) => d.to_string(),
        None => winpath::file_name(&source).to_string(),
    };
    if let Err(why) = winpath::check_destination(&destination) {
        warn(
            WarningCode::RuntimeFileDestinationRejected,
            format!("rejected: destination {} {why}", quote::quote(&destination)),
        );
        return None;
    }
    Some(Entry {
        source,
        destination,
        origin: Origin::Registry,
        registry_value: Some(label.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DRIVER_KEY: &str = r"{4d36e968-e325-11ce-bfc1-08002be10318}\0001";
    const STORE: &str = r"C:\Windows\System32\DriverStore\FileRepository\drv.inf_amd64_1";

    fn sz(name: &str, s: &str) -> RegistryValue {
        RegistryValue {
            name: name.into(),
            kind: RegType::REG_SZ,
            data: RegData::String(s.into()),
        }
    }

    fn multi(name: &str, list: &[&str]) -> RegistryValue {
        RegistryValue {
            name: name.into(),
            kind: RegType::REG_MULTI_SZ,
            data: RegData::Strings(list.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn key(subkey: &str, values: Vec<RegistryValue>) -> RegistryKey {
        RegistryKey {
            key: format!(r"{CLASS_ROOT}\{DRIVER_KEY}\{subkey}"),
            values,
        }
    }

    fn run(keys: &[RegistryKey], vendor_id: u32, files: &[&str]) -> (RuntimeFiles, Vec<Warning>) {
        let files: Vec<String> = files.iter().map(|f| format!(r"{STORE}\{f}")).collect();
        let ctx = DeviceContext {
            label: "GPU",
            device_id: "dev-1",
            luid: 9,
            driver_key: DRIVER_KEY,
            driver_store: STORE,
            vendor_id,
            additional: &[],
            exclude: &[],
        };
        let mut warnings = Vec::new();
        let rf = resolve(
            &ctx,
            &RegistryIndex::new(keys),
            &FileIndex::new(&files),
            &mut warnings,
        );
        (rf, warnings)
    }

    fn pairs(files: &[RuntimeFile]) -> Vec<(String, String)> {
        files
            .iter()
            .map(|f| (f.source.clone(), f.destination.clone()))
            .collect()
    }

    fn p(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn value_shapes() {
        // (value, expected (source, destination) or None, expected warning fragment)
        type Row = (
            RegistryValue,
            Option<(&'static str, &'static str)>,
            Option<(&'static str, WarningCode)>,
        );
        let table: Vec<Row> = vec![
            (
                multi("a", &["nvcuda_loader64.dll", "nvcuda.dll"]),
                Some(("nvcuda_loader64.dll", "nvcuda.dll")),
                None,
            ),
            (
                multi("a", &["lib\\x.dll"]),
                Some(("lib\\x.dll", "x.dll")),
                None,
            ),
            (multi("a", &["x.dll", ""]), Some(("x.dll", "x.dll")), None),
            (
                sz("a", "OpenCL64.dll"),
                Some(("OpenCL64.dll", "OpenCL64.dll")),
                None,
            ),
            (
                multi("a", &["x.dll", "y.dll", "z.dll"]),
                Some(("x.dll", "y.dll")),
                Some(("has 3 strings", WarningCode::RegistryValueExtraStrings)),
            ),
            (
                multi("a", &[]),
                None,
                Some(("empty source", WarningCode::RuntimeFileEmptySource)),
            ),
            (
                multi("a", &["", "y.dll"]),
                None,
                Some(("empty source", WarningCode::RuntimeFileEmptySource)),
            ),
            (
                sz("a", ""),
                None,
                Some(("empty source", WarningCode::RuntimeFileEmptySource)),
            ),
            (
                multi("a", &["..\\evil.dll"]),
                None,
                Some(("`..`", WarningCode::RuntimeFileSourceRejected)),
            ),
            (
                multi("a", &["C:\\evil.dll"]),
                None,
                Some(("drive-qualified", WarningCode::RuntimeFileSourceRejected)),
            ),
            (
                multi("a", &["\\\\srv\\share\\evil.dll"]),
                None,
                Some(("UNC", WarningCode::RuntimeFileSourceRejected)),
            ),
            (
                multi("a", &["x.dll", "..\\evil.dll"]),
                None,
                Some(("destination", WarningCode::RuntimeFileDestinationRejected)),
            ),
            (
                multi("a", &["x.dll", "a\\b.dll"]),
                None,
                Some((
                    "bare file name",
                    WarningCode::RuntimeFileDestinationRejected,
                )),
            ),
            (
                multi("a", &["x.dll", ".."]),
                None,
                Some(("destination", WarningCode::RuntimeFileDestinationRejected)),
            ),
            (
                multi("a", &["x.dll", "a\u{7}.dll"]),
                None,
                Some(("control", WarningCode::RuntimeFileDestinationRejected)),
            ),
            (
                RegistryValue {
                    name: "a".into(),
                    kind: RegType::REG_DWORD,
                    data: RegData::Integer(1),
                },
                None,
                Some(("REG_DWORD", WarningCode::RegistryValueType)),
            ),
            (
                RegistryValue {
                    name: "a".into(),
                    kind: RegType::REG_EXPAND_SZ,
                    data: RegData::String("x.dll".into()),
                },
                None,
                Some(("REG_EXPAND_SZ", WarningCode::RegistryValueType)),
            ),
        ];
        for (value, expected, warning) in table {
            let desc = format!("{value:?}");
            let (rf, warnings) = run(&[key("CopyToVmOverwrite", vec![value])], 0x1002, &[]);
            let got = pairs(&rf.system32);
            match expected {
                Some(pair) => assert_eq!(got, p(&[pair]), "{desc}"),
                None => assert!(got.is_empty(), "{desc}: {got:?}"),
            }
            if let Some((fragment, code)) = warning {
                assert!(
                    warnings.iter().any(|w| w.message.contains(fragment)
                        && w.code == code
                        && w.device.as_deref() == Some("dev-1")
                        && w.luid == Some(9)),
                    "{desc}: {warnings:?}"
                );
            }
        }
    }

    #[test]
    fn order_targets_and_duplicates() {
        let keys = vec![
            key(
                "CopyToVmWhenNewer",
                vec![
                    multi("A", &["new.dll", "shared.dll"]),
                    multi("b", &["only-new.dll"]),
                ],
            ),
            key(
                "CopyToVmOverwrite",
                vec![
                    multi("Zeta", &["z.dll"]),
                    multi("alpha", &["over.dll", "SHARED.dll"]),
                ],
            ),
            key("CopyToVmOverwriteWow64", vec![multi("x", &["wow.dll"])]),
            key(
                "CopyToVmWhenNewerWow64",
                vec![multi("x", &["wow2.dll", "WOW.DLL"])],
            ),
        ];
        let (rf, warnings) = run(&keys, 0x1002, &[]);
        assert_eq!(
            pairs(&rf.system32),
            p(&[
                ("over.dll", "SHARED.dll"),
                ("z.dll", "z.dll"),
                ("only-new.dll", "only-new.dll")
            ])
        );
        assert_eq!(pairs(&rf.syswow64), p(&[("wow.dll", "wow.dll")]));
        assert_eq!(
            rf.system32[0].registry_value.as_deref(),
            Some(r"CopyToVmOverwrite\alpha")
        );
        let dups: Vec<_> = warnings
            .iter()
            .filter(|w| w.message.contains("already provides"))
            .collect();
        assert_eq!(dups.len(), 2, "{warnings:?}");
    }

    #[test]
    fn nvidia_vendor_defaults_follow_registry_entries() {
        let keys = vec![key(
            "CopyToVmOverwrite",
            vec![multi("smi", &["bin\\nvidia-smi.exe"])],
        )];
        let (rf, _) = run(
            &keys,
            0x10DE,
            &["bin\\nvidia-smi.exe", "vulkaninfo-x64.exe"],
        );
        assert_eq!(
            pairs(&rf.system32),
            p(&[
                ("bin\\nvidia-smi.exe", "nvidia-smi.exe"),
                ("vulkaninfo-x64.exe", "vulkaninfo.exe")
            ])
        );
        assert_eq!(rf.system32[0].origin, Origin::Registry);
        assert_eq!(rf.system32[1].origin, Origin::VendorDefault);
        assert_eq!(
            pairs(&rf.syswow64),
            p(&[("vulkaninfo-x86.exe", "vulkaninfo.exe")])
        );
        assert!(!rf.syswow64[0].exists);
        let (amd, _) = run(&[], 0x1002, &[]);
        assert!(amd.is_empty());
    }

    #[test]
    fn configured_additions_and_exclusions() {
        let keys = vec![key(
            "CopyToVmOverwrite",
            vec![
                multi("a", &["nvcuda_loader64.dll", "nvcuda.dll"]),
                multi("b", &["x.dll"]),
            ],
        )];
        let additional = vec![
            AdditionalFile {
                vendor_id: 0x1002,
                target: TargetDir::System32,
                source: r"sub\extra.dll".into(),
                destination: None,
            },
            AdditionalFile {
                vendor_id: 0x1002,
                target: TargetDir::SysWow64,
                source: "e32.dll".into(),
                destination: Some("extra.dll".into()),
            },
            AdditionalFile {
                vendor_id: 0x1002,
                target: TargetDir::System32,
                source: "other.dll".into(),
                destination: Some("X.DLL".into()),
            },
            AdditionalFile {
                vendor_id: 0x1002,
                target: TargetDir::System32,
                source: r"..\evil.dll".into(),
                destination: None,
            },
            AdditionalFile {
                vendor_id: 0x10DE,
                target: TargetDir::System32,
                source: "nv-only.dll".into(),
                destination: None,
            },
        ];
        let exclude = vec!["NVCUDA.dll".to_string()];
        let ctx = DeviceContext {
            label: "GPU",
            device_id: "dev-1",
            luid: 9,
            driver_key: DRIVER_KEY,
            driver_store: STORE,
            vendor_id: 0x1002,
            additional: &additional,
            exclude: &exclude,
        };
        let mut warnings = Vec::new();
        let rf = resolve(
            &ctx,
            &RegistryIndex::new(&keys),
            &FileIndex::new(&[]),
            &mut warnings,
        );
        assert_eq!(
            pairs(&rf.system32),
            p(&[("x.dll", "x.dll"), (r"sub\extra.dll", "extra.dll")])
        );
        assert_eq!(rf.system32[1].origin, Origin::Config);
        assert_eq!(pairs(&rf.syswow64), p(&[("e32.dll", "extra.dll")]));
        assert!(
            warnings
                .iter()
                .any(|w| w.message.contains("X.DLL") && w.message.contains("already provides")),
            "{warnings:?}"
        );
        assert!(
            warnings.iter().any(|w| w.message.contains("`..`")),
            "{warnings:?}"
        );
    }

    #[test]
    fn existence_and_host_paths() {
        let keys = vec![key(
            "CopyToVmOverwrite",
            vec![multi("a", &["Sub/A.dll"]), multi("b", &["b.dll"])],
        )];
        let (rf, warnings) = run(&keys, 0x1002, &["sub\\a.DLL"]);
        assert_eq!(rf.system32[0].host_path, format!(r"{STORE}\Sub\A.dll"));
        assert!(rf.system32[0].exists);
        assert!(!rf.system32[1].exists);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].message.contains(r"b.dll") && warnings[0].message.contains("GPU"),
            "{warnings:?}"
        );
    }

    #[test]
    fn candidate_paths_cover_every_file_the_rules_look_at() {
        let facts = crate::sample::sample_host().unwrap();
        let candidates = candidate_host_paths(&facts);
        let mut listed = facts.files.clone();
        listed.sort();
        // The sample host lists exactly the files that exist; all of them are candidates.
        for f in &listed {
            assert!(candidates.contains(f), "{f}");
        }
        assert!(candidates.iter().any(|c| c.ends_with("vulkaninfo-x86.exe")));
        // Adapters the default configuration does not advertise are covered too, so that a
        // configuration change needs no new facts.
        let mut hidden = facts.clone();
        for a in &mut hidden.adapters {
            a.is_integrated = true;
            a.is_detachable = true;
        }
        assert_eq!(candidate_host_paths(&hidden), candidates);
    }

    #[test]
    fn registry_lookup_is_case_insensitive_and_accepts_long_hive_name() {
        let k = RegistryKey {
            key: format!(
                r"HKEY_LOCAL_MACHINE\system\currentcontrolset\control\class\{}\copytovmoverwrite",
                DRIVER_KEY.to_uppercase()
            ),
            values: vec![multi("a", &["a.dll"])],
        };
        let (rf, _) = run(&[k], 0x1002, &[]);
        assert_eq!(rf.system32.len(), 1);
    }

    fn arb_value() -> impl Strategy<Value = RegistryValue> {
        let s = prop_oneof![
            "\\PC{0,12}",
            "[a-z.\\\\/:]{0,12}",
            Just("..".to_string()),
            Just("..\\x.dll".to_string()),
            Just("C:\\x".to_string()),
        ];
        (
            any::<String>(),
            prop::collection::vec(s, 0..4),
            any::<bool>(),
        )
            .prop_map(|(name, list, as_sz)| {
                if as_sz {
                    RegistryValue {
                        name,
                        kind: RegType::REG_SZ,
                        data: RegData::String(list.concat()),
                    }
                } else {
                    RegistryValue {
                        name,
                        kind: RegType::REG_MULTI_SZ,
                        data: RegData::Strings(list),
                    }
                }
            })
    }

    proptest! {
        #[test]
        fn no_runtime_file_escapes_its_directories(
            values in prop::collection::vec(arb_value(), 0..8),
            subkey in 0usize..4,
        ) {
            let keys = vec![key(SUBKEYS[subkey].0, values)];
            let (rf, _) = run(&keys, 0x10DE, &[]);
            let mut seen = HashSet::new();
            for (target, file) in rf.iter() {
                let prefix = format!("{STORE}\\");
                prop_assert!(file.host_path.starts_with(&prefix));
                let rest = &file.host_path[prefix.len()..];
                prop_assert!(!rest.is_empty());
                prop_assert!(!rest.split('\\').any(|c| c.is_empty() || c == "." || c == ".."), "{}", rest);
                prop_assert!(!rest.contains(['/', ':']) && !rest.chars().any(char::is_control));
                prop_assert!(winpath::check_destination(&file.destination).is_ok());
                prop_assert!(seen.insert((target, file.destination.to_lowercase())), "duplicate {}", file.destination);
            }
        }
    }
}
