//! Configuration tests: every key, precedence, compatibility variables and files.

use super::*;
use dxdp_core::devices::{PerResource, TargetDir};
use std::io::Write;

use dxdp_core::policy::{AllocationPolicy, MultiDevice};

impl Resolved {
    /// The effective values with their origins as JSON: `{key: {"value", "origin"}}`, values
    /// typed (booleans, numbers, lists, objects).
    fn show_json(&self) -> serde_json::Map<String, serde_json::Value> {
        self.entries()
            .into_iter()
            .map(|(key, value, origin)| {
                let entry = serde_json::json!({"value": value, "origin": origin});
                (key.to_string(), entry)
            })
            .collect()
    }

    /// Where the value of the key named `key` came from, as `config show` prints it (`default`
    /// for a name that is no key).
    pub(crate) fn origin(&self, key: &str) -> String {
        Key::parse(key).map_or_else(
            || Origin::Default.to_string(),
            |k| self.origin_of(k).to_string(),
        )
    }
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    path
}

fn inputs(file: Option<PathBuf>, env: &[(&str, &str)], flags: Flags) -> Inputs {
    Inputs {
        file: file.map(|p| (p, true)),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        flags,
        node: None,
    }
}

const FULL: &str = r#"
resources:
  display:
    enabled: true
    name: example.com/gpu
    replicas: 4
    aliases: [microsoft.com/directx]
    allocationPolicy: pack
    multiDevice: fail
    cudaVisibleDevices: true
    memorySharing: {enabled: false, name: example.com/gpu-memory, unit: 512Mi, reserve: 2Gi}
  compute:
    enabled: false
devices:
  includeIntegrated: true
  includeDetachable: true
  include:
    - vendor: nvidia
    - {vendor: 0x1002, deviceId: 0x7362}
  exclude:
    - locationPath: 'PCIROOT(0)#PCI(0200)#PCI(0000)'
    - description: '*Basic*'
assignment: class-guid
runtimeFiles:
  enabled: false
  exclude: [nvcuda.dll]
  additional:
    nvidia:
      system32: [{source: 'extra\nvextra64.dll', destination: nvextra.dll}]
      syswow64: [{source: nvextra32.dll}]
health:
  enabled: true
  ignoreProblemCodes: [43]
  signals:
    tdr: {action: unhealthy_for, for: 15m, count: 3, window: 10m}
  ignore: [live_kernel_event]
  expectedDevices:
    display: 4
    instanceTypes:
      my-box: {display: 8, compute: 1}
  events: false
  nodeConditions: true
  remediation: {evictPods: true, cordon: true, gracePeriod: 15m}
  thermal:
    marginCelsius: 3
startupTaint: directx.microsoft.com/gpu-not-ready=true:NoSchedule
logLevel: debug
logFormat: json
nodeLabels:
  enabled: false
  prefix: example.com/gpu-
metrics:
  address: 0.0.0.0:9466
  probeAddress: 127.0.0.1:9467
  webConfigFile: C:\etc\dxdp\web\web-config.yml
  authorization: kubernetes
  tokenAudiences: [dxdp-metrics]
  allowPlainHttpTokens: true
telemetry:
  enabled: true
  interval: 30s
  podResourcesEndpoint: /var/lib/kubelet/pod-resources/kubelet.sock
  criEndpoint: npipe:////./pipe/containerd-containerd
  podLabels: [team, 'app\.kubernetes\.io/.*']
  podUid: true
isolation:
  policy: taint
  events: false
validation:
  enabled: true
  interval: 12h
  timeout: 30m
  image: mcr.microsoft.com/windows/servercore:ltsc2025
  hostDir: D:\dxdp\validation
  gate: true
"#;

#[test]
fn every_key_of_the_file_is_applied_with_its_origin() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "config.yaml", FULL);
    let c = inputs(Some(path.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    let d = &c.resources[&Resource::Display];
    assert_eq!(
        (d.enabled, d.name.as_str(), d.replicas),
        (true, "example.com/gpu", 4)
    );
    assert_eq!(d.aliases, ["microsoft.com/directx"]);
    assert_eq!(
        c.policy(Resource::Display),
        ResourcePolicy {
            allocation: AllocationPolicy::Pack,
            multi_device: MultiDevice::Fail,
            cuda_visible_devices: true,
        }
    );
    assert_eq!(c.policy(Resource::Compute), ResourcePolicy::default());
    assert_eq!(
        d.memory_sharing,
        MemorySharingSettings {
            enabled: false,
            name: "example.com/gpu-memory".into(),
            unit_bytes: 512 << 20,
            reserve_bytes: 2 << 30,
        }
    );
    assert_eq!(c.sharing(Resource::Display), Sharing::Replicas(4));
    assert_eq!(c.memory_resource_name(Resource::Display), None);
    assert!(!c.resources[&Resource::Compute].enabled);
    assert_eq!(c.pipeline.include_integrated, PerResource::both(true));
    assert_eq!(c.pipeline.include_detachable, PerResource::both(true));
    assert_eq!(c.pipeline.include.len(), 2);
    assert_eq!(c.pipeline.include[1].device_id, Some(0x7362));
    assert_eq!(
        c.pipeline.exclude[1].description.as_deref(),
        Some("*Basic*")
    );
    assert_eq!(c.assignment, Assignment::ClassGuid);
    // Compute is not served here, so only the display count is judged.
    assert_eq!(
        c.expected_counts(),
        BTreeMap::from([(Resource::Display, 4)])
    );
    assert_eq!(c.expected_devices.rows.len(), 1);
    assert!(!c.pipeline.runtime_files);
    assert_eq!(c.pipeline.runtime_exclude, ["nvcuda.dll"]);
    assert_eq!(c.pipeline.additional_files.len(), 2);
    assert_eq!(
        c.pipeline.additional_files[0].source,
        r"extra\nvextra64.dll"
    );
    assert_eq!(c.log_level.0, "debug");
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(
        c.node_labels,
        NodeLabels {
            enabled: false,
            prefix: "example.com/gpu-".into()
        }
    );
    assert_eq!(c.health_thermal.margin_celsius, 3);
    let origin = format!("file {}", path.display());
    for key in Key::all() {
        let name = key.to_string();
        if name == "configuration" {
            assert_eq!(c.origin(&name), "default: no configuration selected");
        } else if !name.starts_with("resources.compute.") || name == "resources.compute.enabled" {
            assert_eq!(c.origin(&name), origin, "{key}");
            assert_eq!(
                c.origin_of(key),
                &crate::config::origin::Origin::file(&path),
                "{key}"
            );
        }
    }
    assert_eq!(c.origin("resources.compute.replicas"), "default");
    assert_eq!(
        c.endpoints(),
        [
            (Resource::Display, "example.com/gpu".to_string()),
            (Resource::Display, "microsoft.com/directx".to_string())
        ]
    );
}

#[test]
fn defaults() {
    let c = Inputs::default().resolve().unwrap();
    assert_eq!(c.config, Config::default());
    assert_eq!(c.endpoints().len(), 2);
    assert!(c
        .show()
        .contains("resources.display.replicas: 1  # default"));
}

#[test]
fn precedence_is_defaults_file_env_flags() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "c.yaml", "resources: {display: {replicas: 2}, compute: {replicas: 2}}\nassignment: class-guid\nlogLevel: warn\n");
    type Row<'a> = (
        Vec<(&'a str, &'a str)>,
        Flags,
        u32,
        Assignment,
        &'a str,
        &'a str,
    );
    let table: Vec<Row> = vec![
        (
            vec![],
            Flags::default(),
            2,
            Assignment::ClassGuid,
            "warn",
            "file",
        ),
        (
            vec![
                ("DXDP_REPLICAS", "3"),
                ("DXDP_ASSIGNMENT", "auto"),
                ("DXDP_LOG_LEVEL", "error"),
            ],
            Flags::default(),
            3,
            Assignment::Auto,
            "error",
            "env DXDP_REPLICAS",
        ),
        (
            vec![("DXDP_REPLICAS", "3"), ("DXDP_ASSIGNMENT", "auto")],
            Flags {
                replicas: Some(5),
                assignment: Some(Assignment::LocationPath),
                log_level: Some(values::LogLevelName("trace".into())),
                ..Flags::default()
            },
            5,
            Assignment::LocationPath,
            "trace",
            "flag --replicas",
        ),
    ];
    for (env, flags, replicas, assignment, level, origin) in table {
        let c = inputs(Some(path.clone()), &env, flags).resolve().unwrap();
        assert_eq!(c.replicas(Resource::Display), replicas, "{env:?}");
        assert_eq!(c.assignment, assignment);
        assert_eq!(c.log_level.0, level);
        assert!(
            c.origin("resources.display.replicas").starts_with(origin),
            "{}",
            c.origin("resources.display.replicas")
        );
    }
}

#[test]
fn reference_plugin_variables_behave_as_they_did() {
    type Check = fn(&Config) -> bool;
    let table: Vec<(&str, &str, Check)> = vec![
        ("WDDM_DEVICE_PLUGIN_MULTITENANCY", "3", |c| {
            c.replicas(Resource::Display) == 3 && c.replicas(Resource::Compute) == 1
        }),
        ("MCDM_DEVICE_PLUGIN_MULTITENANCY", "4", |c| {
            c.replicas(Resource::Compute) == 4 && c.replicas(Resource::Display) == 1
        }),
        // Each plugin's switch acts on its own resource only.
        ("WDDM_DEVICE_PLUGIN_INCLUDE_INTEGRATED", "true", |c| {
            c.pipeline.include_integrated
                == PerResource {
                    display: true,
                    compute: false,
                }
        }),
        ("MCDM_DEVICE_PLUGIN_INCLUDE_INTEGRATED", "1", |c| {
            c.pipeline.include_integrated
                == PerResource {
                    display: false,
                    compute: true,
                }
        }),
        ("WDDM_DEVICE_PLUGIN_INCLUDE_DETACHABLE", "true", |c| {
            c.pipeline.include_detachable
                == PerResource {
                    display: true,
                    compute: false,
                }
                && c.pipeline.include_integrated == PerResource::both(false)
        }),
        ("MCDM_DEVICE_PLUGIN_INCLUDE_DETACHABLE", "true", |c| {
            c.pipeline.include_detachable
                == PerResource {
                    display: false,
                    compute: true,
                }
        }),
        ("WDDM_DEVICE_PLUGIN_INCLUDE_INTEGRATED", "false", |c| {
            c.pipeline.include_integrated == PerResource::both(false)
        }),
    ];
    for (name, value, check) in table {
        let c = inputs(None, &[(name, value)], Flags::default())
            .resolve()
            .unwrap();
        assert!(check(&c), "{name}={value}");
    }
    let dir = tempfile::tempdir().unwrap();
    let wddm = write(
        &dir,
        "wddm.yml",
        "multitenancy: 2\nincludeIntegrated: true\nadditionalMounts:\n  nvidia:\n    - {source: nvextra64.dll, destination: nvextra.dll}\nadditionalMountsWow64:\n  nvidia:\n    - {source: nvextra32.dll, destination: nvextra.dll}\n",
    );
    let mcdm = write(&dir, "mcdm.yml", "multitenancy: 6\n");
    let c = inputs(
        None,
        &[
            ("WDDM_DEVICE_PLUGIN_CONFIG_FILE", wddm.to_str().unwrap()),
            ("MCDM_DEVICE_PLUGIN_CONFIG_FILE", mcdm.to_str().unwrap()),
        ],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert_eq!(
        (c.replicas(Resource::Display), c.replicas(Resource::Compute)),
        (2, 6)
    );
    // The WDDM file's includeIntegrated is the display plugin's.
    assert_eq!(
        c.pipeline.include_integrated,
        PerResource {
            display: true,
            compute: false
        }
    );
    assert_eq!(c.pipeline.additional_files.len(), 2);
    assert_eq!(c.pipeline.additional_files[1].target, TargetDir::SysWow64);
    // The env variable beats the reference file.
    let c = inputs(
        None,
        &[
            ("WDDM_DEVICE_PLUGIN_CONFIG_FILE", wddm.to_str().unwrap()),
            ("WDDM_DEVICE_PLUGIN_MULTITENANCY", "9"),
        ],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert_eq!(c.replicas(Resource::Display), 9);
}

#[test]
fn bad_values_are_rejected_with_what_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let table: Vec<(&str, &str)> = vec![
        ("resources: {display: {replicas: 0}}\n", ":1:"),
        ("resources: {display: {replicas: 65}}\n", "from 1 to 64"),
        ("resources:\n  display:\n    replicas: many\n", ":3:"),
        ("resources: {display: {name: gpu}}\n", "domain.example/name"),
        ("resources: {gpu: {}}\n", "unknown key `gpu`"),
        ("devices: {include: [{}]}\n", "at least one of vendor"),
        ("devices: {include: [{vendor: acme}]}\n", "unknown vendor"),
        ("devices: {include: [{model: x}]}\n", "unknown key `model`"),
        ("assignment: pci\n", "location-path"),
        ("runtimeFiles: {additional: {nvidia: {system32: [{source: '..\\x.dll'}]}}}\n", "`..`"),
        ("runtimeFiles: {additional: {nvidia: {system32: [{source: x.dll, destination: 'a\\b.dll'}]}}}\n", "bare file name"),
        ("runtimeFiles: {additional: {acme: {}}}\n", "unknown vendor"),
        ("logFormat: xml\n", "text"),
        ("resources: {display: {allocationPolicy: even}}\n", "spread, pack"),
        ("resources: {compute: {multiDevice: error}}\n", "warn, fail"),
        ("resources: {display: {cudaVisibleDevices: yes please}}\n", "true or false"),
        ("nodeLabels: {prefix: directx.microsoft.com}\n", "must contain '/'"),
        ("nodeLabels: {prefix: Example.com/}\n", "not a DNS subdomain"),
        ("nodeLabels: {labels: true}\n", "unknown key `labels`"),
        ("configurations: {'big gpu': {}}\n", "not a valid label value"),
        ("configurations:\n  big:\n    logLevel: debug\n", ":3:"),
        ("configurations: {big: {nodeLabels: {enabled: false}}}\n", "unknown key `nodeLabels`"),
        ("configurations: {big: {configurations: {}}}\n", "unknown key `configurations`"),
        ("configurations: {big: {resources: {display: {replicas: 0}}}}\n", "from 1 to 64"),
        ("version: v2\n", "bad.yaml:1:10: unknown configuration version \"v2\""),
        ("version: 1\n", "reads version v1"),
        ("configurations: {big: {version: v1}}\n", "unknown key `version`"),
    ];
    for (text, fragment) in table {
        let path = write(&dir, "bad.yaml", text);
        let err = inputs(Some(path), &[], Flags::default())
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(err.contains(fragment), "{text:?}: {err}");
        assert!(err.contains("bad.yaml"), "{err}");
    }
    for (name, value, fragment) in [
        ("DXDP_REPLICAS", "0", "from 1 to 64"),
        ("WDDM_DEVICE_PLUGIN_MULTITENANCY", "x", "whole number"),
        ("DXDP_ASSIGNMENT", "gpu", "class-guid"),
        ("DXDP_NODE_LABELS", "maybe", "true or false"),
        ("DXDP_NODE_LABEL_PREFIX", "gpu", "must contain '/'"),
        ("DXDP_RESOURCES", "gpu", "display, compute"),
        (
            "MCDM_DEVICE_PLUGIN_INCLUDE_DETACHABLE",
            "maybe",
            "true or false",
        ),
    ] {
        let err = inputs(None, &[(name, value)], Flags::default())
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(err.contains(name) && err.contains(fragment), "{err}");
    }
    let err = inputs(Some(dir.path().join("missing.yaml")), &[], Flags::default())
        .resolve()
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.yaml"), "{err}");
}

#[test]
fn empty_file_is_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "empty.yaml", "");
    let c = inputs(Some(path), &[], Flags::default()).resolve().unwrap();
    assert_eq!(c.replicas(Resource::Display), 1);
}

#[test]
fn config_path_choice() {
    let env: Env = [("DXDP_CONFIG".to_string(), "/x/env.yaml".to_string())].into();
    assert_eq!(
        choose_path(Some(Path::new("/x/flag.yaml")), &env),
        Some((PathBuf::from("/x/flag.yaml"), true))
    );
    assert_eq!(
        choose_path(None, &env),
        Some((PathBuf::from("/x/env.yaml"), true))
    );
}

proptest::proptest! {
    #[test]
    fn arbitrary_config_text_never_panics(text in "\\PC{0,300}") {
        let _ = parse::parse::<ConfigFile>(&text, "fuzz");
        let _ = parse::parse::<ReferenceFile>(&text, "fuzz");
    }
}

#[test]
fn false_in_a_reference_variable_turns_a_switch_off_and_config_show_names_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "config.yaml",
        "devices:\n  includeIntegrated: true\n  includeDetachable: true\n",
    );
    let c = inputs(
        Some(file.clone()),
        &[
            ("WDDM_DEVICE_PLUGIN_INCLUDE_INTEGRATED", "false"),
            ("MCDM_DEVICE_PLUGIN_INCLUDE_DETACHABLE", "no"),
        ],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert_eq!(
        c.pipeline.include_integrated,
        PerResource {
            display: false,
            compute: true
        }
    );
    assert_eq!(
        c.pipeline.include_detachable,
        PerResource {
            display: true,
            compute: false
        }
    );
    let file_origin = format!("file {}", file.display());
    assert_eq!(
        c.origin("resources.display.includeIntegrated"),
        format!("env WDDM_DEVICE_PLUGIN_INCLUDE_INTEGRATED (overrides {file_origin}: true)")
    );
    assert_eq!(c.origin("resources.compute.includeIntegrated"), file_origin);
    assert_eq!(
        c.origin("resources.compute.includeDetachable"),
        format!("env MCDM_DEVICE_PLUGIN_INCLUDE_DETACHABLE (overrides {file_origin}: true)")
    );
    assert_eq!(c.origin("resources.display.includeDetachable"), file_origin);
    // A per-resource key in dxdp's own file overrides the node-wide one.
    let file = write(
        &dir,
        "per-resource.yaml",
        "devices:\n  includeIntegrated: true\nresources:\n  compute:\n    includeIntegrated: false\n",
    );
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    assert_eq!(
        c.pipeline.include_integrated,
        PerResource {
            display: true,
            compute: false
        }
    );
}

#[test]
fn config_show_json_values_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "config.yaml",
        "resources:\n  display:\n    replicas: 4\n    aliases: [microsoft.com/directx]\ndevices:\n  exclude:\n    - vendor: nvidia\nruntimeFiles:\n  exclude: [nvml.dll]\n",
    );
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    let json = c.show_json();
    let value = |k: &str| json[k]["value"].clone();
    assert_eq!(value("resources.display.replicas"), serde_json::json!(4));
    assert_eq!(value("resources.display.enabled"), serde_json::json!(true));
    assert_eq!(
        value("resources.display.aliases"),
        serde_json::json!(["microsoft.com/directx"])
    );
    assert_eq!(
        value("devices.exclude"),
        serde_json::json!([{"vendor": "0x10DE"}])
    );
    assert_eq!(
        value("runtimeFiles.exclude"),
        serde_json::json!(["nvml.dll"])
    );
    assert_eq!(value("assignment"), serde_json::json!("auto"));
    assert_eq!(
        json["resources.display.replicas"]["origin"],
        serde_json::json!(format!("file {}", file.display()))
    );
}

#[test]
fn health_checks_are_configurable_and_reach_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "config.yaml",
        "health:\n  enabled: false\n  ignoreProblemCodes: [43, 31]\n",
    );
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    assert!(!c.pipeline.health.enabled);
    assert_eq!(c.pipeline.health.ignore_problem_codes, vec![43, 31]);
    assert_eq!(
        c.origin("health.enabled"),
        format!("file {}", file.display())
    );
    let json = c.show_json();
    assert_eq!(
        json["health.ignoreProblemCodes"]["value"],
        serde_json::json!([43, 31])
    );
    let d = Resolved::default();
    assert!(d.pipeline.health.enabled && d.pipeline.health.ignore_problem_codes.is_empty());
    let bad = write(
        &dir,
        "bad.yaml",
        "health:\n  ignoreProblemCodes: [forty-three]\n",
    );
    assert!(inputs(Some(bad), &[], Flags::default()).resolve().is_err());
}

const NAMED: &str = r#"
resources:
  display:
    replicas: 2
configurations:
  big:
    resources:
      display:
        replicas: 8
    assignment: class-guid
  small: {}
"#;

fn node(labels: &[(&str, &str)]) -> Option<NodeInfo> {
    Some(NodeInfo {
        name: "n1".into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..NodeInfo::default()
    })
}

#[test]
fn the_node_label_selects_a_named_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "config.yaml", NAMED);
    let file = format!("file {}", path.display());
    let key = "directx.microsoft.com/device-plugin.config";
    // (node labels, env, flag) -> (replicas, assignment, selected, reason, warned)
    type Want<'a> = (u32, Assignment, Option<&'a str>, &'a str, bool);
    type Row<'a> = (
        Option<NodeInfo>,
        Vec<(&'a str, &'a str)>,
        Option<&'a str>,
        Want<'a>,
    );
    let table: Vec<Row> = vec![
        (None, vec![], None, (2, Assignment::Auto, None, "default: no configuration selected", false)),
        (node(&[]), vec![], None, (2, Assignment::Auto, None, "default: node n1 has no label directx.microsoft.com/device-plugin.config", false)),
        (node(&[(key, "big")]), vec![], None, (8, Assignment::ClassGuid, Some("big"), "node label directx.microsoft.com/device-plugin.config on node n1", false)),
        (node(&[(key, "small")]), vec![], None, (2, Assignment::Auto, Some("small"), "node label directx.microsoft.com/device-plugin.config on node n1", false)),
        (node(&[(key, "huge")]), vec![], None, (2, Assignment::Auto, None, "default: \"huge\" (node label directx.microsoft.com/device-plugin.config on node n1) is unknown", true)),
        (node(&[("example.com/device-plugin.config", "big")]), vec![], None, (2, Assignment::Auto, None, "default: node n1 has no label directx.microsoft.com/device-plugin.config", false)),
        (node(&[("example.com/device-plugin.config", "big")]), vec![("DXDP_NODE_LABEL_PREFIX", "example.com/")], None, (8, Assignment::ClassGuid, Some("big"), "node label example.com/device-plugin.config on node n1", false)),
        (node(&[(key, "small")]), vec![("DXDP_CONFIGURATION", "big")], None, (8, Assignment::ClassGuid, Some("big"), "env DXDP_CONFIGURATION", false)),
        (node(&[(key, "small")]), vec![("DXDP_CONFIGURATION", "big")], Some("small"), (2, Assignment::Auto, Some("small"), "flag --configuration", false)),
        // The environment still overrides what the named configuration sets.
        (node(&[(key, "big")]), vec![("DXDP_REPLICAS", "3")], None, (3, Assignment::ClassGuid, Some("big"), "node label directx.microsoft.com/device-plugin.config on node n1", false)),
    ];
    for (node, env, flag, want) in table {
        let mut i = inputs(
            Some(path.clone()),
            &env,
            Flags {
                configuration: flag.map(str::to_string),
                ..Flags::default()
            },
        );
        i.node = node.clone();
        let c = i.resolve().unwrap();
        let got = (
            c.replicas(Resource::Display),
            c.assignment,
            c.selection.name.as_deref(),
            c.selection.reason.as_str(),
            c.selection.warning.is_some(),
        );
        assert_eq!(got, want, "{node:?} {env:?} {flag:?}");
        assert_eq!(c.origin("configuration"), c.selection.reason);
        let replicas_origin = c.origin("resources.display.replicas");
        match (c.selection.name.as_deref(), env.is_empty()) {
            (Some("big"), true) => {
                assert_eq!(&replicas_origin, &format!("{file} (configuration big)"))
            }
            (_, true) => assert_eq!(&replicas_origin, &file),
            _ => {}
        }
        let shown = c.show();
        let line = format!(
            "configuration: {}  # {}",
            c.selection.name.as_deref().unwrap_or("default"),
            c.selection.reason
        );
        assert!(shown.contains(&line), "{shown}");
    }
    // The warning names the file, what asked and what the file has.
    let mut i = inputs(Some(path.clone()), &[], Flags::default());
    i.node = node(&[(key, "huge")]);
    let w = i.resolve().unwrap().selection.warning.unwrap();
    assert!(
        w.contains("config.yaml") && w.contains("big, small") && w.contains("node n1"),
        "{w}"
    );
}

#[test]
fn metrics_address_follows_the_precedence_and_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "config.yaml", "metrics:\n  address: 0.0.0.0:9466\n");
    let addr = |s: &str| Some(s.parse::<std::net::SocketAddr>().unwrap());
    // Off by default.
    let d = Resolved::default();
    assert_eq!(d.metrics_address, None);
    assert_eq!(d.origin("metrics.address"), "default");
    assert!(d.show().contains("metrics.address: none  # default\n"));
    assert_eq!(
        d.show_json()["metrics.address"]["value"],
        serde_json::Value::Null
    );
    // (file, environment, flags, expected address, expected origin)
    type Case<'a> = (
        Option<PathBuf>,
        Vec<(&'a str, &'a str)>,
        Flags,
        Option<std::net::SocketAddr>,
        String,
    );
    let table: Vec<Case> = vec![
        (
            Some(file.clone()),
            vec![],
            Flags::default(),
            addr("0.0.0.0:9466"),
            format!("file {}", file.display()),
        ),
        (
            Some(file.clone()),
            vec![("DXDP_METRICS_ADDRESS", "127.0.0.1:9000")],
            Flags::default(),
            addr("127.0.0.1:9000"),
            format!(
                "env DXDP_METRICS_ADDRESS (overrides file {}: 0.0.0.0:9466)",
                file.display()
            ),
        ),
        // An empty variable turns the endpoint off.
        (
            Some(file.clone()),
            vec![("DXDP_METRICS_ADDRESS", "")],
            Flags::default(),
            None,
            format!(
                "env DXDP_METRICS_ADDRESS (overrides file {}: 0.0.0.0:9466)",
                file.display()
            ),
        ),
        (
            Some(file.clone()),
            vec![("DXDP_METRICS_ADDRESS", "127.0.0.1:9000")],
            Flags {
                metrics_address: Some(addr("[::1]:9466")),
                ..Flags::default()
            },
            addr("[::1]:9466"),
            "flag --metrics-address".into(),
        ),
    ];
    for (file, env, flags, want, origin) in table {
        let c = inputs(file, &env, flags).resolve().unwrap();
        assert_eq!(c.metrics_address, want, "{env:?}");
        assert_eq!(c.origin("metrics.address"), origin);
    }
    let c = inputs(Some(file), &[], Flags::default()).resolve().unwrap();
    assert!(
        c.show().contains("metrics.address: 0.0.0.0:9466  # file "),
        "{}",
        c.show()
    );
    assert_eq!(c.show_json()["metrics.address"]["value"], "0.0.0.0:9466");
    // What is not IP:PORT is refused with what is allowed, in the file and the environment.
    for text in [
        "metrics: {address: 'localhost:9466'}\n",
        "metrics: {address: '9466'}\n",
        "metrics: {port: 9466}\n",
    ] {
        let bad = write(&dir, "bad.yaml", text);
        let err = inputs(Some(bad), &[], Flags::default())
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad.yaml:1:"), "{text}: {err}");
        assert!(
            err.contains("0.0.0.0:9466") || err.contains("unknown key `port`"),
            "{text}: {err}"
        );
    }
    let err = inputs(
        None,
        &[("DXDP_METRICS_ADDRESS", "0.0.0.0")],
        Flags::default(),
    )
    .resolve()
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("DXDP_METRICS_ADDRESS") && err.contains("IP:PORT"),
        "{err}"
    );
}

#[test]
fn reference_multitenancy_zero_means_one_with_a_notice() {
    let c = inputs(
        None,
        &[("WDDM_DEVICE_PLUGIN_MULTITENANCY", "0")],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert_eq!(c.replicas(Resource::Display), 1);
    assert_eq!(
        c.notices,
        ["env WDDM_DEVICE_PLUGIN_MULTITENANCY=0 means 1 (exclusive devices), as in the reference plugin; resources.display.replicas is 1"]
    );
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "mcdm.yaml", "multitenancy: 0\n");
    let env = [("MCDM_DEVICE_PLUGIN_CONFIG_FILE", path.to_str().unwrap())];
    let c = inputs(None, &env, Flags::default()).resolve().unwrap();
    assert_eq!(c.replicas(Resource::Compute), 1);
    assert_eq!(c.notices.len(), 1, "{:?}", c.notices);
    assert!(
        c.notices[0].contains("multitenancy: 0 means 1"),
        "{:?}",
        c.notices
    );
    // Still refused: above the maximum.
    let err = inputs(
        None,
        &[("WDDM_DEVICE_PLUGIN_MULTITENANCY", "65")],
        Flags::default(),
    )
    .resolve()
    .unwrap_err();
    assert!(err.to_string().contains("from 1 to 64"), "{err}");
}

#[test]
fn a_dxdp_variable_over_a_reference_variable_names_both() {
    let env = [
        ("WDDM_DEVICE_PLUGIN_MULTITENANCY", "4"),
        ("DXDP_REPLICAS", "2"),
        ("MCDM_DEVICE_PLUGIN_INCLUDE_INTEGRATED", "true"),
        ("DXDP_INCLUDE_INTEGRATED", "false"),
    ];
    let c = inputs(None, &env, Flags::default()).resolve().unwrap();
    assert_eq!(c.replicas(Resource::Display), 2);
    assert_eq!(
        c.origin("resources.display.replicas"),
        "env DXDP_REPLICAS (overrides env WDDM_DEVICE_PLUGIN_MULTITENANCY=4)"
    );
    // Nothing overridden for compute's replicas: a plain origin, no notice about it.
    assert_eq!(c.origin("resources.compute.replicas"), "env DXDP_REPLICAS");
    assert_eq!(
        c.origin("resources.compute.includeIntegrated"),
        "env DXDP_INCLUDE_INTEGRATED (overrides env MCDM_DEVICE_PLUGIN_INCLUDE_INTEGRATED=true)"
    );
    assert_eq!(
        c.notices,
        [
            "resources.display.replicas: env DXDP_REPLICAS=2 overrides the reference plugin's env WDDM_DEVICE_PLUGIN_MULTITENANCY=4; unset one of them (dxdp's variables win)",
            "resources.compute.includeIntegrated: env DXDP_INCLUDE_INTEGRATED=false overrides the reference plugin's env MCDM_DEVICE_PLUGIN_INCLUDE_INTEGRATED=true; unset one of them (dxdp's variables win)",
        ]
    );
}

#[test]
fn reference_default_files_in_the_reference_directory() {
    let dir = tempfile::tempdir().unwrap();
    let wddm = write(&dir, "wddm.yaml", "multitenancy: 3\n");
    let d = dir.path().to_str().unwrap();
    let c = inputs(None, &[(REFERENCE_DIR_VAR, d)], Flags::default())
        .resolve()
        .unwrap();
    assert_eq!(c.replicas(Resource::Display), 3);
    assert_eq!(
        c.replicas(Resource::Compute),
        1,
        "no mcdm.yaml: nothing read"
    );
    assert_eq!(
        c.origin("resources.display.replicas"),
        format!(
            "file {} (the reference plugin's default file, as WDDM_DEVICE_PLUGIN_CONFIG_FILE)",
            wddm.display()
        )
    );
    assert_eq!(c.notices.len(), 1);
    assert!(c.notices[0].starts_with(&format!("read the reference plugin's {}", wddm.display())));
    // Both are watched, present or not, so a file that appears later is read.
    let i = inputs(None, &[(REFERENCE_DIR_VAR, d)], Flags::default());
    assert_eq!(
        i.watched_files(),
        [wddm.clone(), dir.path().join("mcdm.yaml")]
    );
    // The variable naming a file wins over the default file, as in the reference plugin.
    let other = write(&dir, "other.yaml", "multitenancy: 5\n");
    let env = [
        (REFERENCE_DIR_VAR, d),
        ("WDDM_DEVICE_PLUGIN_CONFIG_FILE", other.to_str().unwrap()),
    ];
    let c = inputs(None, &env, Flags::default()).resolve().unwrap();
    assert_eq!(c.replicas(Resource::Display), 5);
    assert!(c.notices.is_empty(), "{:?}", c.notices);
}

#[test]
fn vendor_keys_as_windows_reports_the_manufacturer() {
    let text = "additionalMounts:\n  Advanced Micro Devices, Inc.:\n    - source: amdx.dll\n  NVIDIA:\n    - source: nvx.dll\n  intel corporation:\n    - source: igx.dll\n";
    let f: ReferenceFile = parse::parse(text, "t").unwrap();
    let keys: Vec<u32> = f.additional_mounts.unwrap().keys().map(|k| k.0).collect();
    assert_eq!(keys, [0x1002, 0x10DE, 0x8086]);
    let err = parse::parse::<ReferenceFile>(
        "additionalMounts:\n  Acme GPUs:\n    - source: a.dll\n",
        "t",
    )
    .unwrap_err();
    assert!(
        err.message.contains("unknown vendor \"Acme GPUs\""),
        "{err}"
    );
}

#[test]
fn errors_in_the_words_an_operator_uses() {
    let cases = [
        (
            "resources: {display: {replicas: two}}\n",
            "t:1:33: expected a whole number, got \"two\"",
        ),
        (
            "- a\n- b\n",
            "t:1:1: the file must be a mapping of keys (key: value), not a list",
        ),
        (
            "logLevel: info\nlogLevel: debug\n",
            "t:2:1: key logLevel appears twice in the same mapping: keep one",
        ),
        (
            "resources: {display: {enabled: maybe}}\n",
            "t:1:32: expected true or false, got \"maybe\"",
        ),
        (
            "resources: [1]\n",
            "t:1:12: expected a mapping of keys (key: value) here, got a list",
        ),
        (
            "assignment: guid\n",
            "t:1:13: unknown value `guid`: use one of location-path, class-guid, auto",
        ),
    ];
    for (text, want) in cases {
        let err = parse::parse::<ConfigFile>(text, "t").unwrap_err();
        assert_eq!(err.to_string(), want, "{text}");
        for jargon in [
            "invalid u64",
            "mapping start",
            "DuplicateKeyPolicy",
            "variant",
        ] {
            assert!(!err.to_string().contains(jargon), "{err}");
        }
    }
}

#[test]
fn every_error_of_a_file_at_once() {
    let text = "resources:\n  display:\n    replicas: two\n  compute:\n    replica: 2\ndevices:\n  includeIntegrated: maybe\nassignment: guid\nlogLevel: info\n";
    let errors = parse::parse_all::<ConfigFile>(text, "t", parse::MAX_ERRORS).unwrap_err();
    let got: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "t:3:15: expected a whole number, got \"two\"",
            "t:5:5: unknown key `replica`: the keys allowed here are enabled, name, replicas, aliases, includeIntegrated, includeDetachable, allocationPolicy, multiDevice, cudaVisibleDevices, memorySharing",
            "t:7:22: expected true or false, got \"maybe\"",
            "t:8:13: unknown value `guid`: use one of location-path, class-guid, auto",
        ]
    );
    // Two errors in one block, three keys deep: both.
    let nested =
        "resources:\n  display:\n    replicas: 0\n    enabled: maybe\n  compute: {replicas: -1}\n";
    let errors = parse::parse_all::<ConfigFile>(nested, "t", parse::MAX_ERRORS).unwrap_err();
    let got: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        [
            "t:3:15: replicas must be from 1 to 64, got 0",
            "t:4:14: expected true or false, got \"maybe\"",
            "t:5:23: expected a whole number of at least 0, got \"-1\"",
        ]
    );
    // A tab in the indentation: one error, on the tab's line, that says so.
    let errors =
        parse::parse_all::<ConfigFile>("resources:\n\tdisplay: {}\n", "t", parse::MAX_ERRORS)
            .unwrap_err();
    let got: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        got,
        ["t:2:1: this line is indented with a tab: YAML indents with spaces only (replace the tab with spaces)"]
    );
    // A rule across two keys of a valid block (a name used by the other resource) is not
    // blamed on a key parsed alone: only the real error.
    let across = "resources:\n  display:\n    name: directx.microsoft.com/compute\n  compute:\n    enabled: false\nlogLevel: [x]\n";
    let errors = parse::parse_all::<ConfigFile>(across, "t", parse::MAX_ERRORS).unwrap_err();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].to_string().starts_with("t:6:"), "{}", errors[0]);
    // Bounded.
    let many: String = (0..30).map(|i| format!("bad{i}: 1\n")).collect();
    let errors = parse::parse_all::<ConfigFile>(&many, "t", 5).unwrap_err();
    assert_eq!(errors.len(), 5);
    // A valid file parses as with parse.
    assert!(parse::parse_all::<ConfigFile>(FULL, "t", 5).is_ok());
    // Start and reload name the first error and say how many more there are.
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "multi.yaml", text);
    let err = inputs(Some(path.clone()), &[], Flags::default())
        .resolve()
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!(
            "{p}:3:15: expected a whole number, got \"two\" (and 3 more: `dxdp config check {p}` lists them all)",
            p = path.display()
        )
    );
}

/// Issue 43: the PodResources endpoint as the kubelet writes it on Windows (`npipe://` with the
/// pipe's name in backslashes, kubelet's `LocalEndpoint`) or as containerd-style
/// `npipe:////./pipe/…`, in the file and in `DXDP_POD_RESOURCES_ENDPOINT`.
#[test]
fn pod_resources_endpoints_take_the_kubelets_npipe_spelling() {
    use crate::transport::Endpoint;
    let pipe = |name: &str| Some(Endpoint::Pipe(name.to_string()));
    // (text, the endpoint dxdp connects to, or part of the error)
    let table: [(&str, Result<Option<Endpoint>, &str>); 10] = [
        ("", Ok(None)),
        (
            r"npipe://\\.\pipe\kubelet-pod-resources",
            Ok(pipe(r"\\.\pipe\kubelet-pod-resources")),
        ),
        (
            "npipe:////./pipe/kubelet-pod-resources",
            Ok(pipe(r"\\.\pipe\kubelet-pod-resources")),
        ),
        (
            r"\\.\pipe\kubelet-pod-resources",
            Ok(pipe(r"\\.\pipe\kubelet-pod-resources")),
        ),
        (
            "unix:///var/lib/kubelet/pod-resources/kubelet.sock",
            Ok(Some(Endpoint::Socket(
                "/var/lib/kubelet/pod-resources/kubelet.sock".into(),
            ))),
        ),
        (
            "/run/pr.sock",
            Ok(Some(Endpoint::Socket("/run/pr.sock".into()))),
        ),
        (
            r"npipe://\\server\pipe\kubelet-pod-resources",
            Err(r#"PodResources endpoint "npipe://\\\\server\\pipe\\kubelet-pod-resources" is not a named pipe on this machine"#),
        ),
        (
            "tcp://127.0.0.1:10250",
            Err("PodResources endpoint \"tcp://127.0.0.1:10250\" uses tcp://, which dxdp does not speak (the PodResources API is local)"),
        ),
        ("unix://", Err("has no absolute socket path")),
        (
            "https://x",
            Err(r"e.g. npipe://\\.\pipe\kubelet-pod-resources (as the kubelet writes it on Windows)"),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (text, want) in table {
        let env = inputs(
            None,
            &[("DXDP_POD_RESOURCES_ENDPOINT", text)],
            Flags::default(),
        );
        let yaml = format!("telemetry:\n  podResourcesEndpoint: '{text}'\n");
        let file = inputs(
            Some(write(&dir, "config.yaml", &yaml)),
            &[],
            Flags::default(),
        );
        for (how, got) in [("env", env.resolve()), ("file", file.resolve())] {
            match (got, &want) {
                (Ok(c), Ok(want)) => {
                    assert_eq!(&c.telemetry.pod_resources_endpoint, want, "{how} {text}")
                }
                (Err(e), Err(part)) => {
                    let e = e.to_string();
                    assert!(e.contains(part), "{how} {text}: {e}")
                }
                (got, want) => panic!("{how} {text}: {got:?}, wanted {want:?}"),
            }
        }
    }
}

#[test]
fn cri_endpoints_are_local_sockets_or_pipes() {
    // (text, the address dxdp connects to, or part of the error)
    let table = [
        ("", Ok(None)),
        (
            "npipe:////./pipe/containerd-containerd",
            Ok(Some(r"\\.\pipe\containerd-containerd")),
        ),
        ("npipe://./pipe/cri", Ok(Some(r"\\.\pipe\cri"))),
        ("NPIPE:////./PIPE/cri", Ok(Some(r"\\.\pipe\cri"))),
        (
            r"\\.\pipe\containerd-containerd",
            Ok(Some(r"\\.\pipe\containerd-containerd")),
        ),
        ("//./pipe/x", Ok(Some("//./pipe/x"))),
        (
            "unix:///run/containerd/containerd.sock",
            Ok(Some("/run/containerd/containerd.sock")),
        ),
        ("unix:///C:/run/cri.sock", Ok(Some("C:/run/cri.sock"))),
        ("  /run/crio/crio.sock ", Ok(Some("/run/crio/crio.sock"))),
        ("unix://run/x.sock", Err("no absolute socket path")),
        ("unix://", Err("no absolute socket path")),
        (
            "npipe:////server/pipe/x",
            Err("not a named pipe on this machine"),
        ),
        ("npipe:////./pipe/", Err("not a named pipe on this machine")),
        ("tcp://10.0.0.1:1234", Err("uses tcp://")),
        ("https://x", Err("use unix:///PATH, npipe:////./pipe/NAME")),
    ];
    for (text, want) in table {
        match (values::CriEndpoint::parse(text), want) {
            (Ok(got), Ok(want)) => assert_eq!(got.as_deref(), want, "{text}"),
            (Err(e), Err(part)) => assert!(e.contains(part), "{text}: {e}"),
            (got, want) => panic!("{text}: {got:?}, wanted {want:?}"),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "config.yaml",
        "telemetry: {criEndpoint: 'tcp://x:1'}\n",
    );
    let err = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap_err()
        .to_string();
    assert!(err.contains("uses tcp://"), "{err}");
    let err = inputs(None, &[("DXDP_CRI_ENDPOINT", "http://x")], Flags::default())
        .resolve()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("DXDP_CRI_ENDPOINT") && err.contains("uses http://"),
        "{err}"
    );
    let c = inputs(
        None,
        &[(
            "DXDP_CRI_ENDPOINT",
            "unix:///run/k3s/containerd/containerd.sock",
        )],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert_eq!(
        c.telemetry.cri_endpoint,
        Some(crate::config::values::CriAddress {
            written: "unix:///run/k3s/containerd/containerd.sock".into(),
            address: "/run/k3s/containerd/containerd.sock".into(),
        })
    );
    assert_eq!(c.origin("telemetry.criEndpoint"), "env DXDP_CRI_ENDPOINT");
    assert!(Resolved::default()
        .show()
        .contains("telemetry.criEndpoint: none  # default\n"));
}

#[test]
fn telemetry_keys_follow_the_precedence_and_intervals_are_checked() {
    let d = Resolved::default();
    assert!(d.telemetry.enabled);
    assert_eq!(d.telemetry.interval, std::time::Duration::from_secs(10));
    assert!(d.show().contains("telemetry.interval: 10s  # default\n"));
    assert!(d
        .show()
        .contains("telemetry.podResourcesEndpoint: none  # default\n"));
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "config.yaml",
        "telemetry:\n  enabled: false\n  interval: 1m\n  podResourcesEndpoint: /run/pr.sock\n",
    );
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    assert!(!c.telemetry.enabled);
    assert_eq!(c.telemetry.interval, std::time::Duration::from_secs(60));
    assert_eq!(
        c.telemetry.pod_resources_endpoint,
        Some(crate::transport::Endpoint::Socket("/run/pr.sock".into()))
    );
    assert_eq!(
        c.origin("telemetry.interval"),
        format!("file {}", file.display())
    );
    assert_eq!(c.show_json()["telemetry.interval"]["value"], "1m");
    let file_origin = format!("file {}", file.display());
    let c = inputs(
        Some(file),
        &[
            ("DXDP_TELEMETRY", "true"),
            ("DXDP_TELEMETRY_INTERVAL", "1500ms"),
        ],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert!(c.telemetry.enabled);
    assert_eq!(c.telemetry.interval, std::time::Duration::from_millis(1500));
    assert_eq!(
        c.origin("telemetry.enabled"),
        format!("env DXDP_TELEMETRY (overrides {file_origin}: false)")
    );
    // (text, seconds or error)
    let table = [
        ("10", Ok(10_000)),
        ("10s", Ok(10_000)),
        ("2m", Ok(120_000)),
        ("1000ms", Ok(1_000)),
        ("60m", Ok(3_600_000)),
        ("999ms", Err("from 1s to 1h")),
        ("61m", Err("from 1s to 1h")),
        ("0", Err("from 1s to 1h")),
        ("ten", Err("use e.g. 10s")),
        ("-5s", Err("use e.g. 10s")),
        ("", Err("use e.g. 10s")),
    ];
    for (text, want) in table {
        match (values::Interval::parse(text), want) {
            (Ok(d), Ok(ms)) => assert_eq!(d.as_millis(), ms, "{text}"),
            (Err(e), Err(part)) => assert!(e.contains(part), "{text}: {e}"),
            (got, want) => panic!("{text}: {got:?}, wanted {want:?}"),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    for (text, part) in [
        ("telemetry: {interval: 0s}\n", "from 1s to 1h"),
        ("telemetry: {intervall: 10s}\n", "unknown key `intervall`"),
        // Not a whole number nor a text: what to write, not the Rust type's name.
        (
            "telemetry: {interval: 0.5}\n",
            "a duration: a whole number of seconds, or a number with its unit such as 500ms, 90s, 15m or 1h",
        ),
        (
            "validation: {timeout: true}\n",
            "a duration: a whole number of seconds, or a number with its unit such as 500ms, 90s, 15m or 1h",
        ),
        (
            "telemetry: {enabled: maybe}\n",
            "expected true or false, got",
        ),
    ] {
        let f = write(&dir, "bad.yaml", text);
        let err = inputs(Some(f), &[], Flags::default())
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(err.contains(part), "{text}: {err}");
    }
}

#[test]
fn isolation_keys_follow_the_precedence_and_policies_are_checked() {
    let d = Resolved::default();
    assert_eq!(d.isolation.policy, file::IsolationPolicy::Audit);
    assert!(d.isolation.events);
    assert!(d.show().contains("isolation.policy: audit  # default\n"));
    assert!(d.show().contains("isolation.events: true  # default\n"));
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "config.yaml",
        "isolation:\n  policy: taint\n  events: false\n",
    );
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    assert_eq!(c.isolation.policy, file::IsolationPolicy::Taint);
    assert!(!c.isolation.events);
    assert_eq!(
        c.origin("isolation.policy"),
        format!("file {}", file.display())
    );
    assert_eq!(c.show_json()["isolation.policy"]["value"], "taint");
    let file_origin = format!("file {}", file.display());
    let c = inputs(
        Some(file),
        &[
            ("DXDP_ISOLATION_POLICY", " Audit "),
            ("DXDP_ISOLATION_EVENTS", "true"),
        ],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert_eq!(c.isolation.policy, file::IsolationPolicy::Audit);
    assert!(c.isolation.events);
    assert_eq!(
        c.origin("isolation.policy"),
        format!("env DXDP_ISOLATION_POLICY (overrides {file_origin}: taint)")
    );
    let err = inputs(
        None,
        &[("DXDP_ISOLATION_POLICY", "cordon")],
        Flags::default(),
    )
    .resolve()
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("DXDP_ISOLATION_POLICY") && err.contains("not audit, withdraw or taint"),
        "{err}"
    );
    for (text, part) in [
        ("isolation: {policy: cordon}\n", "cordon"),
        ("isolation: {polcy: taint}\n", "unknown key `polcy`"),
    ] {
        let f = write(&dir, "bad.yaml", text);
        let err = inputs(Some(f), &[], Flags::default())
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(err.contains(part), "{text}: {err}");
    }
}

#[test]
fn probe_address_follows_the_precedence_and_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "config.yaml",
        "metrics:\n  probeAddress: 127.0.0.1:9467\n",
    );
    let addr = |s: &str| Some(s.parse::<std::net::SocketAddr>().unwrap());
    let d = Resolved::default();
    assert_eq!(d.probe_address, None);
    assert!(d.show().contains("metrics.probeAddress: none  # default\n"));
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    assert_eq!(c.probe_address, addr("127.0.0.1:9467"));
    assert_eq!(
        c.origin("metrics.probeAddress"),
        format!("file {}", file.display())
    );
    assert_eq!(
        c.show_json()["metrics.probeAddress"]["value"],
        "127.0.0.1:9467"
    );
    let c = inputs(
        Some(file.clone()),
        &[("DXDP_PROBE_ADDRESS", "127.0.0.1:9000")],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert_eq!(c.probe_address, addr("127.0.0.1:9000"));
    assert_eq!(
        c.origin("metrics.probeAddress"),
        format!(
            "env DXDP_PROBE_ADDRESS (overrides file {}: 127.0.0.1:9467)",
            file.display()
        )
    );
    let c = inputs(
        Some(file),
        &[("DXDP_PROBE_ADDRESS", "127.0.0.1:9000")],
        Flags {
            probe_address: Some(None),
            ..Flags::default()
        },
    )
    .resolve()
    .unwrap();
    assert_eq!(c.probe_address, None);
    assert_eq!(c.origin("metrics.probeAddress"), "flag --probe-address");
    let err = inputs(
        None,
        &[("DXDP_PROBE_ADDRESS", "localhost:9467")],
        Flags::default(),
    )
    .resolve()
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("DXDP_PROBE_ADDRESS") && err.contains("IP:PORT"),
        "{err}"
    );
}

#[test]
fn a_variable_over_a_file_value_names_the_file_value_in_show_and_a_notice() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "config.yaml",
        "resources:\n  display:\n    replicas: 2\nlogLevel: debug\nisolation:\n  policy: taint\n",
    );
    let env = [
        ("DXDP_REPLICAS", "4"),
        ("DXDP_LOG_LEVEL", "debug"),
        ("DXDP_ISOLATION_POLICY", "audit"),
    ];
    let c = inputs(Some(path.clone()), &env, Flags::default())
        .resolve()
        .unwrap();
    let file = format!("file {}", path.display());
    assert_eq!(c.replicas(Resource::Display), 4);
    assert_eq!(
        c.origin("resources.display.replicas"),
        format!("env DXDP_REPLICAS (overrides {file}: 2)")
    );
    // The file did not set compute's replicas, and logLevel has the same value in both: plain.
    assert_eq!(c.origin("resources.compute.replicas"), "env DXDP_REPLICAS");
    assert_eq!(c.origin("logLevel"), "env DXDP_LOG_LEVEL");
    assert_eq!(
        c.origin("isolation.policy"),
        format!("env DXDP_ISOLATION_POLICY (overrides {file}: taint)")
    );
    assert!(c.show().contains(&format!(
        "resources.display.replicas: 4  # env DXDP_REPLICAS (overrides {file}: 2)\n"
    )));
    assert_eq!(
        c.notices,
        [
            format!("resources.display.replicas: env DXDP_REPLICAS=4 overrides {file} (resources.display.replicas: 2): editing the file changes nothing while DXDP_REPLICAS is set; unset the variable to use the file's value"),
            format!("isolation.policy: env DXDP_ISOLATION_POLICY=audit overrides {file} (isolation.policy: taint): editing the file changes nothing while DXDP_ISOLATION_POLICY is set; unset the variable to use the file's value"),
        ]
    );
}

#[test]
fn web_config_file_and_metrics_authorization_follow_the_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "config.yaml",
        "metrics:\n  webConfigFile: /etc/dxdp/web.yml\n  authorization: kubernetes\n",
    );
    let d = Resolved::default();
    assert_eq!(d.web_config_file, None);
    assert!(d
        .show()
        .contains("metrics.webConfigFile: none  # default\n"));
    assert!(d
        .show()
        .contains("metrics.authorization: none  # default\n"));
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    assert_eq!(
        c.web_config_file,
        Some(std::path::PathBuf::from("/etc/dxdp/web.yml"))
    );
    assert_eq!(
        c.metrics_authorization,
        file::MetricsAuthorization::Kubernetes
    );
    assert_eq!(
        c.origin("metrics.webConfigFile"),
        format!("file {}", file.display())
    );
    let c = inputs(
        Some(file.clone()),
        &[
            ("DXDP_WEB_CONFIG_FILE", "/run/web.yml"),
            ("DXDP_METRICS_AUTHORIZATION", "none"),
        ],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert_eq!(
        c.web_config_file,
        Some(std::path::PathBuf::from("/run/web.yml"))
    );
    assert_eq!(c.metrics_authorization, file::MetricsAuthorization::None);
    // The variable names the file value it overrides (issue 34: no silent override).
    assert_eq!(
        c.origin("metrics.authorization"),
        format!(
            "env DXDP_METRICS_AUTHORIZATION (overrides file {}: kubernetes)",
            file.display()
        )
    );
    let c = inputs(
        Some(file),
        &[("DXDP_WEB_CONFIG_FILE", "/run/web.yml")],
        Flags {
            web_config_file: Some(None),
            ..Flags::default()
        },
    )
    .resolve()
    .unwrap();
    assert_eq!(c.web_config_file, None);
    assert_eq!(c.origin("metrics.webConfigFile"), "flag --web-config-file");
    let err = inputs(
        None,
        &[("DXDP_METRICS_AUTHORIZATION", "rbac")],
        Flags::default(),
    )
    .resolve()
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("DXDP_METRICS_AUTHORIZATION") && err.contains("none or kubernetes"),
        "{err}"
    );
}

#[test]
fn pod_labels_and_pod_uid_are_read_from_the_file_and_a_bad_pattern_is_refused() {
    let d = Resolved::default();
    assert!(!d.telemetry.pod_info());
    assert!(
        d.show().contains("telemetry.podLabels: []  # default\n"),
        "{}",
        d.show()
    );
    assert!(d.show().contains("telemetry.podUid: false  # default\n"));
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "config.yaml",
        "telemetry:\n  podLabels: ['team', 'app\\.kubernetes\\.io/.*']\n  podUid: true\n",
    );
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    assert!(c.telemetry.pod_info() && c.telemetry.pod_uid);
    let labels = &c.telemetry.pod_labels;
    assert_eq!(labels.patterns(), ["team", r"app\.kubernetes\.io/.*"]);
    // Whole keys only.
    assert!(labels.allows("team") && labels.allows("app.kubernetes.io/name"));
    assert!(!labels.allows("steam") && !labels.allows("team2"));
    assert!(!labels.allows("appxkubernetes.io/name"));
    assert_eq!(
        c.origin("telemetry.podLabels"),
        c.origin("telemetry.podUid")
    );
    assert!(c.origin("telemetry.podLabels").contains("config.yaml"));

    let bad = write(
        &dir,
        "bad.yaml",
        "telemetry:\n  podLabels: ['team', 'app(']\n",
    );
    let err = inputs(Some(bad), &[], Flags::default())
        .resolve()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bad.yaml")
            && err.contains("telemetry.podLabels")
            && err.contains("\"app(\"")
            && err.contains("unclosed group")
            && err.contains("not a valid regular expression"),
        "{err}"
    );
    let empty = write(&dir, "empty.yaml", "telemetry:\n  podLabels: ['']\n");
    let err = inputs(Some(empty), &[], Flags::default())
        .resolve()
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty.yaml") && err.contains(".*"), "{err}");
}

#[test]
fn health_signals_and_ignore_reach_the_policy_and_wrong_ones_are_refused_by_file_and_key() {
    use dxdp_core::health::reason::Reason;
    use dxdp_core::health::{Action, Ambiguous, SignalPolicy};
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "config.yaml",
        "health:\n  signals:\n    tdr: {action: unhealthy_for, for: 15m, count: 3, window: 10m, ambiguous: all_of_vendor}\n    driver_update: {action: event_only}\n  ignore: [live_kernel_event]\n",
    );
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    let p = &c.pipeline.health.policy;
    assert_eq!(
        p.of(Reason::Tdr),
        SignalPolicy {
            action: Action::UnhealthyFor(Duration::from_secs(900)),
            count: 3,
            window: Duration::from_secs(600),
            ambiguous: Ambiguous::AllOfVendor,
        }
    );
    assert_eq!(p.of(Reason::DriverUpdate).action, Action::EventOnly);
    assert_eq!(p.of(Reason::LiveKernelEvent).action, Action::Ignore);
    assert_eq!(
        p.of(Reason::ProblemCode).action,
        Action::UnhealthyUntilCleared
    );
    assert_eq!(
        c.origin("health.signals"),
        format!("file {}", file.display())
    );
    let json = c.show_json();
    assert_eq!(
        json["health.signals"]["value"]["tdr"],
        serde_json::json!({"action": "unhealthy_for", "for": "15m", "count": 3, "window": "10m", "ambiguous": "all_of_vendor"})
    );
    assert_eq!(
        json["health.ignore"]["value"],
        serde_json::json!(["live_kernel_event"])
    );
    for (name, text, want) in [
        (
            "unknown.yaml",
            "health:\n  signals:\n    xid: {action: ignore}\n",
            "unknown health signal \"xid\"",
        ),
        (
            "unknown-ignore.yaml",
            "health:\n  ignore: [healthy]\n",
            "unknown health signal \"healthy\"",
        ),
        (
            "no-for.yaml",
            "health:\n  signals:\n    tdr: {action: unhealthy_for}\n",
            "health.signals.tdr: action unhealthy_for needs `for`",
        ),
        (
            "condition.yaml",
            "health:\n  signals:\n    problem_code: {action: unhealthy_for, for: 5m}\n",
            "health.signals.problem_code: problem_code is a condition",
        ),
    ] {
        let bad = write(&dir, name, text);
        let e = inputs(Some(bad.clone()), &[], Flags::default())
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{name}: {e}");
        assert!(e.contains(&bad.display().to_string()), "{name}: {e}");
        assert!(e.contains("health"), "{name} names the key: {e}");
    }
}

#[test]
fn version_v1_and_no_version_read_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let with = write(
        &dir,
        "with.yaml",
        "version: v1\nresources: {display: {replicas: 3}}\n",
    );
    let without = write(
        &dir,
        "without.yaml",
        "resources: {display: {replicas: 3}}\n",
    );
    let a = inputs(Some(with), &[], Flags::default()).resolve().unwrap();
    let b = inputs(Some(without), &[], Flags::default())
        .resolve()
        .unwrap();
    assert_eq!(a.replicas(Resource::Display), 3);
    assert_eq!(b.replicas(Resource::Display), 3);
    assert_eq!(a.resources, b.resources);
}

#[test]
fn health_events_and_node_conditions_follow_the_precedence() {
    let d = Resolved::default();
    assert!(d.health_reports.events);
    assert!(!d.health_reports.node_conditions);
    assert!(d.show().contains("health.events: true  # default\n"));
    assert!(d
        .show()
        .contains("health.nodeConditions: false  # default\n"));
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "c.yaml",
        "health:\n  events: false\n  nodeConditions: true\n",
    );
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    assert!(!c.health_reports.events);
    assert!(c.health_reports.node_conditions);
    assert_eq!(
        c.origin("health.nodeConditions"),
        format!("file {}", file.display())
    );
    let c = inputs(
        Some(file),
        &[
            ("DXDP_NODE_CONDITIONS", "false"),
            ("DXDP_HEALTH_EVENTS", "true"),
        ],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert!(c.health_reports.events);
    assert!(!c.health_reports.node_conditions);
    assert!(c
        .origin("health.nodeConditions")
        .starts_with("env DXDP_NODE_CONDITIONS"));
    let f = write(&dir, "bad.yaml", "health:\n  nodeCondition: true\n");
    let err = inputs(Some(f), &[], Flags::default())
        .resolve()
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown key `nodeCondition`"), "{err}");
}

#[test]
fn the_startup_taint_and_remediation_follow_the_precedence() {
    let d = Resolved::default();
    assert_eq!(d.startup_taint, None);
    assert_eq!(
        d.remediation,
        super::health::Remediation {
            evict_pods: false,
            cordon: false,
            grace_period: std::time::Duration::from_secs(600),
        }
    );
    let shown = d.show();
    for line in [
        "startupTaint: none  # default\n",
        "health.remediation.evictPods: false  # default\n",
        "health.remediation.cordon: false  # default\n",
        "health.remediation.gracePeriod: 10m  # default\n",
        "validation.gate: false  # default\n",
    ] {
        assert!(shown.contains(line), "{line}{shown}");
    }
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "c.yaml",
        "startupTaint: directx.microsoft.com/gpu-not-ready:NoSchedule\nhealth:\n  remediation:\n    evictPods: true\n    gracePeriod: 90s\nvalidation:\n  gate: true\n",
    );
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    assert_eq!(
        c.startup_taint.as_ref().map(ToString::to_string).as_deref(),
        Some("directx.microsoft.com/gpu-not-ready:NoSchedule")
    );
    assert!(c.remediation.evict_pods && !c.remediation.cordon && c.validation.gate);
    assert_eq!(
        c.remediation.grace_period,
        std::time::Duration::from_secs(90)
    );
    let c = inputs(
        Some(file.clone()),
        &[
            ("DXDP_STARTUP_TAINT", ""),
            ("DXDP_EVICT_PODS", "false"),
            ("DXDP_CORDON", "true"),
            ("DXDP_REMEDIATION_GRACE_PERIOD", "15m"),
            ("DXDP_VALIDATION_GATE", "false"),
        ],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert_eq!(c.startup_taint, None);
    assert!(!c.remediation.evict_pods && c.remediation.cordon && !c.validation.gate);
    assert_eq!(
        c.remediation.grace_period,
        std::time::Duration::from_secs(900)
    );
    assert!(c
        .origin("startupTaint")
        .starts_with("env DXDP_STARTUP_TAINT"));
    for (text, want) in [
        (
            "startupTaint: gpu-not-ready\n",
            "startupTaint: taint \"gpu-not-ready\" has no effect",
        ),
        (
            "health:\n  remediation:\n    gracePeriod: 0s\n",
            "is not from 1s to 7 days",
        ),
        (
            "health:\n  remediation:\n    evict: true\n",
            "unknown key `evict`",
        ),
    ] {
        let f = write(&dir, "bad.yaml", text);
        let err = inputs(Some(f), &[], Flags::default())
            .resolve()
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{err}");
    }
    let err = inputs(None, &[("DXDP_STARTUP_TAINT", "x:Never")], Flags::default())
        .resolve()
        .unwrap_err()
        .to_string();
    assert!(err.contains("DXDP_STARTUP_TAINT"), "{err}");
}

/// Configuration files inside a HostProcess container on containerd 1.6.
mod sandbox {
    use super::super::{resolve_in_sandbox, Env};
    use crate::util::host_process::testing::{fs, SANDBOX};
    use std::path::{Path, PathBuf};

    #[test]
    fn resolves_the_file_and_the_reference_variables() {
        let exists = fs(&[
            r"C:\C\0f3a\etc\dxdp\config.yaml",
            r"C:\C\0f3a\ref\wddm.yaml",
        ]);
        let mut env = Env::new();
        env.insert("DXDP_CONFIG".into(), r"C:\etc\dxdp\config.yaml".into());
        env.insert(
            "WDDM_DEVICE_PLUGIN_CONFIG_FILE".into(),
            r"C:\ref\wddm.yaml".into(),
        );
        env.insert("MCDM_DEVICE_PLUGIN_CONFIG_FILE".into(), String::new());
        env.insert("DXDP_REPLICAS".into(), r"C:\ref\wddm.yaml".into());
        let file = Some((PathBuf::from(r"C:\etc\dxdp\config.yaml"), true));
        let got = resolve_in_sandbox(file, &mut env, Path::new(r"C:\d"), Some(SANDBOX), &exists);
        assert_eq!(
            got,
            Some((PathBuf::from(r"C:\C\0f3a\etc\dxdp\config.yaml"), true))
        );
        assert_eq!(env["DXDP_CONFIG"], r"C:\C\0f3a\etc\dxdp\config.yaml");
        assert_eq!(
            env["WDDM_DEVICE_PLUGIN_CONFIG_FILE"],
            r"C:\C\0f3a\ref\wddm.yaml"
        );
        assert_eq!(env["MCDM_DEVICE_PLUGIN_CONFIG_FILE"], "");
        assert_eq!(
            env["DXDP_REPLICAS"], r"C:\ref\wddm.yaml",
            "not a file variable"
        );
    }

    #[test]
    fn the_default_file_under_the_sandbox_is_optional() {
        let default = Path::new(r"C:\etc\directx-device-plugins\config.yaml");
        let mut env = Env::new();
        let exists = fs(&[r"C:\C\0f3a\etc\directx-device-plugins\config.yaml"]);
        assert_eq!(
            resolve_in_sandbox(None, &mut env, default, Some(SANDBOX), &exists),
            Some((
                PathBuf::from(r"C:\C\0f3a\etc\directx-device-plugins\config.yaml"),
                false
            ))
        );
        assert_eq!(
            resolve_in_sandbox(None, &mut env, default, Some(SANDBOX), fs(&[])),
            None
        );
        assert_eq!(
            resolve_in_sandbox(None, &mut env, default, None, &exists),
            None
        );
    }
}

#[test]
fn token_audiences_and_plain_http_tokens_follow_the_precedence() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "config.yaml",
        "metrics:\n  authorization: kubernetes\n  tokenAudiences: [dxdp-metrics, ' dxdp-metrics', '', other]\n  allowPlainHttpTokens: true\n",
    );
    let d = Resolved::default();
    assert!(d.show().contains("metrics.tokenAudiences: []  # default\n"));
    assert!(d
        .show()
        .contains("metrics.allowPlainHttpTokens: false  # default\n"));
    let c = inputs(Some(file.clone()), &[], Flags::default())
        .resolve()
        .unwrap();
    assert_eq!(c.metrics_token_audiences, ["dxdp-metrics", "other"]);
    assert!(c.metrics_allow_plain_http_tokens);
    let c = inputs(
        Some(file.clone()),
        &[
            ("DXDP_METRICS_TOKEN_AUDIENCES", "a, b,,a"),
            ("DXDP_METRICS_ALLOW_PLAIN_HTTP_TOKENS", "false"),
        ],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert_eq!(c.metrics_token_audiences, ["a", "b"]);
    assert!(!c.metrics_allow_plain_http_tokens);
    assert_eq!(
        c.origin("metrics.allowPlainHttpTokens"),
        format!(
            "env DXDP_METRICS_ALLOW_PLAIN_HTTP_TOKENS (overrides file {}: true)",
            file.display()
        )
    );
    let err = inputs(
        None,
        &[("DXDP_METRICS_ALLOW_PLAIN_HTTP_TOKENS", "maybe")],
        Flags::default(),
    )
    .resolve()
    .unwrap_err()
    .to_string();
    assert!(err.contains("use true or false"), "{err}");
}

#[test]
fn the_metrics_address_variable_takes_an_ipv6_address_without_brackets() {
    for (text, want) in [
        ("10.0.0.5:9466", "10.0.0.5:9466"),
        ("fd00::5:9466", "[fd00::5]:9466"),
        ("[fd00::5]:9466", "[fd00::5]:9466"),
    ] {
        let c = inputs(None, &[("DXDP_METRICS_ADDRESS", text)], Flags::default())
            .resolve()
            .unwrap();
        assert_eq!(
            c.metrics_address.map(|a| a.to_string()).as_deref(),
            Some(want)
        );
    }
    for bad in ["::1", "fd00::5:99999", "node-1:9466", "1.2.3.4:"] {
        assert!(
            inputs(None, &[("DXDP_METRICS_ADDRESS", bad)], Flags::default())
                .resolve()
                .is_err(),
            "{bad}"
        );
    }
    // The file keeps the brackets (its schema says so).
    assert!(values::MetricsAddress::parse("fd00::5:9466").is_err());
}

#[test]
fn memory_sharing_turns_a_resource_into_memory_units() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "config.yaml",
        "resources:\n  compute:\n    memorySharing:\n      enabled: true\n      unit: 256Mi\n",
    );
    let c = inputs(Some(path), &[], Flags::default()).resolve().unwrap();
    assert_eq!(
        c.sharing(Resource::Compute),
        Sharing::Memory(dxdp_core::sharing::MemorySharing {
            unit_bytes: 268_435_456,
            reserve_bytes: 1_073_741_824,
        })
    );
    assert_eq!(
        c.memory_resource_name(Resource::Compute),
        Some("directx.microsoft.com/compute-memory")
    );
    assert_eq!(c.sharing(Resource::Display), Sharing::Replicas(1));
    assert_eq!(c.memory_resource_name(Resource::Display), None);
    let shown = c.show_json();
    assert_eq!(
        shown["resources.compute.memorySharing"]["value"],
        serde_json::json!({
            "enabled": true,
            "name": "directx.microsoft.com/compute-memory",
            "unit": "256Mi",
            "reserve": "1Gi"
        })
    );
    // Replicas given another way are not used, and that is said.
    let c = inputs(
        Some(write(
            &dir,
            "c2.yaml",
            "resources: {display: {memorySharing: {enabled: true}}}\n",
        )),
        &[("DXDP_REPLICAS", "3")],
        Flags::default(),
    )
    .resolve()
    .unwrap();
    assert!(matches!(c.sharing(Resource::Display), Sharing::Memory(_)));
    assert!(
        c.notices.iter().any(|n| n
            == "resources.display.replicas 3 (env DXDP_REPLICAS) is not used: resources.display.memorySharing is on, and a GPU is shared by memory units or by replicas, not both"),
        "{:?}",
        c.notices
    );
}

#[test]
fn memory_sharing_errors_name_the_key_and_what_to_write() {
    for (text, want) in [
        (
            "resources:\n  display:\n    replicas: 2\n    memorySharing: {enabled: true}\n",
            "resources.display has both replicas and memorySharing: a GPU is shared by time-slicing (replicas) or by memory units, not both; remove resources.display.replicas or turn memorySharing off",
        ),
        (
            "resources:\n  display:\n    memorySharing: {unit: 32Mi}\n",
            "resources.display.memorySharing.unit is 32Mi: a unit must be at least 64Mi (each unit is one device ID; use e.g. 256Mi, 512Mi or 1Gi)",
        ),
        (
            "resources:\n  display:\n    memorySharing: {unit: 1.5Gi}\n",
            "size \"1.5Gi\" is not a whole number of bytes or of Ki, Mi, Gi, Ti (k, M, G, T): write e.g. 512Mi, 1Gi or 1536Mi",
        ),
        (
            "resources:\n  display:\n    memorySharing: {enabled: true, name: directx.microsoft.com/compute}\n",
            "resource name directx.microsoft.com/compute is used twice (resources.display.memorySharing.name and resources.compute.name); every served name must be unique",
        ),
    ] {
        let err = parse::parse::<ConfigFile>(text, "t").unwrap_err().to_string();
        assert!(err.contains(want), "{text}: {err}");
    }
}

#[test]
fn sizes_parse_as_kubernetes_quantities() {
    use super::values::Bytes;
    for (text, bytes) in [
        ("1Gi", 1u64 << 30),
        ("512Mi", 512 << 20),
        ("1536Mi", 1536 << 20),
        ("2G", 2_000_000_000),
        ("64Ki", 65_536),
        ("1000", 1000),
        ("1Ti", 1 << 40),
    ] {
        assert_eq!(Bytes::parse(text), Ok(bytes), "{text}");
    }
    for bad in [
        "",
        "Gi",
        "1.5Gi",
        "-1Gi",
        "1 GB",
        "1gi",
        "99999999999999999999Ti",
    ] {
        assert!(Bytes::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(Bytes::text(1 << 30), "1Gi");
    assert_eq!(Bytes::text(1536 << 20), "1536Mi");
    assert_eq!(Bytes::text(1000), "1000");
    assert_eq!(Bytes::text(0), "0");
}
