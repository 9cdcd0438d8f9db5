//! Hostile input that the fixture hosts do not already cover: deep nesting, alias bombs, wrong
//! types and large files for the host snapshot and configuration parsers; thousands of registry
//! entries, huge values and invalid UTF-16 for the runtime-file rules; device IDs with odd bytes
//! for Allocate. Each gets a clear error (naming the file and line) or is ignored with a warning;
//! none panics or hangs. Sizes are kept small enough for the tests to stay fast.

use std::path::Path;

use dxdp::backend::winparse;
use dxdp_core::allocation::{self, AllocationError};
use dxdp_core::assignment::Assignment;
use dxdp_core::devices::Resource;
use dxdp_core::facts::{RegistryKey, RegistryValue};
use dxdp_core::pipeline::{discover, PipelineConfig};
use dxdp_core::policy::ResourcePolicy;
use dxdp_core::sharing::Sharing;
use dxdp_core::snapshot;

use crate::common;

const HEADER: &str = "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\n";

/// `n` copies of `s`.
fn rep(s: &str, n: usize) -> String {
    s.repeat(n)
}

/// An alias bomb: each level refers to the previous one ten times.
fn alias_bomb(levels: usize) -> String {
    let mut text = String::from("a0: &a0 [x]\n");
    for i in 1..levels {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        text.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    text
}

#[test]
fn hostile_snapshots_give_an_error_naming_the_file_and_line() {
    let deep = 100_000;
    let table: Vec<(&str, String, &str)> = vec![
        (
            "deep flow nesting",
            format!("{HEADER}adapters: {}{}\n", rep("[", deep), rep("]", deep)),
            "recursion limit",
        ),
        (
            "deep mapping nesting",
            format!("{HEADER}registry: {}x{}\n", rep("{a: ", deep), rep("}", deep)),
            "",
        ),
        (
            "deep JSON nesting",
            format!(
                "{{\"apiVersion\": \"dxdp/v1alpha1\", \"kind\": \"HostSnapshot\", \"files\": {}{}}}",
                rep("[", deep),
                rep("]", deep)
            ),
            "",
        ),
        (
            "alias bomb",
            format!("{HEADER}{}", alias_bomb(12)),
            "",
        ),
        (
            "adapters is a string",
            format!("{HEADER}adapters: many\n"),
            "adapters",
        ),
        (
            "luid is a list",
            format!("{HEADER}adapters:\n  - {{luid: [1], hardwareId: {{vendorId: 1, deviceId: 1}}, isHardware: true}}\n"),
            "luid",
        ),
        (
            "registry data of the wrong type",
            format!("{HEADER}registry:\n  - key: k\n    values:\n      - {{name: v, type: REG_DWORD, data: [a]}}\n"),
            "REG_DWORD",
        ),
        (
            "an integer too large",
            format!("{HEADER}adapters:\n  - {{luid: 99999999999999999999999, hardwareId: {{vendorId: 1, deviceId: 1}}, isHardware: true}}\n"),
            "luid",
        ),
        (
            "a NUL byte",
            format!("{HEADER}files: [\"a\0b\"]\n\0"),
            "",
        ),
        (
            "a huge key",
            format!("{HEADER}{}: 1\n", rep("k", 1 << 20)),
            "",
        ),
    ];
    for (what, text, mentions) in table {
        let err = match snapshot::parse(&text, "hostile.yaml") {
            Err(e) => e.to_string(),
            Ok(facts) => panic!("{what}: accepted as {facts:?}"),
        };
        assert!(err.starts_with("hostile.yaml"), "{what}: {err}");
        assert!(err.contains(mentions), "{what}: {err}");
        assert!(err.len() < 2000, "{what}: a {} byte message", err.len());
        eprintln!("{what}: {err}");
    }
}

#[test]
fn a_large_snapshot_with_thousands_of_registry_entries_is_read_and_bounded() {
    // 5,000 values in one CopyToVm key (about 0.5 MB of YAML), each naming a missing file, plus
    // 500 escapes from the driver store and one huge value: the pipeline keeps going, warns about
    // what it drops and lists the files that exist.
    let mut facts = common::facts("sample");
    let key = facts
        .registry
        .iter()
        .position(|k| k.key.ends_with(r"\0001\CopyToVmOverwrite"))
        .unwrap();
    let values = &mut facts.registry[key].values;
    let value = |name: String, data: Vec<String>| -> RegistryValue {
        RegistryValue {
            name,
            kind: dxdp_core::facts::RegType::REG_MULTI_SZ,
            data: dxdp_core::facts::RegData::Strings(data),
        }
    };
    for i in 0..5000 {
        values.push(value(format!("extra{i}"), vec![format!("extra{i}.dll")]));
    }
    for i in 0..500 {
        values.push(value(
            format!("escape{i}"),
            vec![format!(r"..\..\..\escape{i}.dll"), format!("ok{i}.dll")],
        ));
    }
    values.push(value("huge".into(), vec![rep("a", 4 << 20)]));
    let text = snapshot::write(&facts, snapshot::Format::Yaml).unwrap();
    assert!(text.len() > 4 << 20);
    let parsed = snapshot::parse(&text, "large.yaml").unwrap();
    assert_eq!(parsed, facts);

    let d = discover(&parsed, &PipelineConfig::default());
    let plain = discover(&common::facts("sample"), &PipelineConfig::default());
    assert_eq!(d.devices.len(), plain.devices.len());
    // No added entry names an existing file, so every device mounts exactly what it did before.
    for (a, b) in d.devices.iter().zip(&plain.devices) {
        let existing = |f: &dxdp_core::devices::Device| -> Vec<String> {
            f.runtime_files
                .iter()
                .filter(|(_, f)| f.exists)
                .map(|(_, f)| f.host_path.clone())
                .collect()
        };
        assert_eq!(existing(a), existing(b), "{}", a.id);
    }
    assert!(
        d.warnings.iter().any(|w| w.message.contains("escape")),
        "escapes are warned about"
    );
    let longest = d
        .warnings
        .iter()
        .map(|w| w.message.len())
        .max()
        .unwrap_or(0);
    assert!(longest < 2000, "a {longest} byte warning");
}

#[test]
fn registry_values_with_invalid_utf16_from_windows_become_replaced_text_then_safe_files() {
    // REG_MULTI_SZ bytes as RegQueryValueExW returns them: an unpaired surrogate, a lone low
    // surrogate, an odd trailing byte and no final terminator.
    let table: Vec<(&str, Vec<u8>, usize)> = vec![
        (
            "unpaired high surrogate",
            vec![0x00, 0xD8, b'a', 0, 0, 0],
            1,
        ),
        ("lone low surrogate", vec![0x00, 0xDC, 0, 0], 1),
        (
            "odd trailing byte",
            vec![b'a', 0, b'.', 0, b'd', 0, 0, 0, 0, 0, 0x41],
            1,
        ),
        ("no terminator", vec![b'x', 0, b'y', 0], 1),
        ("two strings", vec![b'a', 0, 0, 0, b'b', 0, 0, 0, 0, 0], 2),
        ("empty", vec![], 0),
    ];
    for (what, bytes, strings) in table {
        let (kind, data) = winparse::reg_value(winparse::reg_type::MULTI_SZ, &bytes);
        dxdp_core::facts::check_data_shape(kind, &data).unwrap();
        let dxdp_core::facts::RegData::Strings(list) = &data else {
            panic!("{what}: {data:?}");
        };
        assert_eq!(list.len(), strings, "{what}: {list:?}");
        // Into a snapshot and through the pipeline: the value is used or warned about.
        let mut facts = common::facts("sample");
        facts.registry.push(RegistryKey {
            key: r"HKLM\SYSTEM\CurrentControlSet\Control\Class\{4d36e968-e325-11ce-bfc1-08002be10318}\0002\CopyToVmWhenNewer".into(),
            values: vec![RegistryValue {
                name: "odd".into(),
                kind,
                data: data.clone(),
            }],
        });
        let text = snapshot::write(&facts, snapshot::Format::Json).unwrap();
        let parsed = snapshot::parse(&text, "odd.json").unwrap();
        let d = discover(&parsed, &PipelineConfig::default());
        assert_eq!(d.devices.len(), 3, "{what}");
    }
}

fn resolve_config(dir: &Path, text: &str) -> Result<dxdp::config::Resolved, String> {
    let path = dir.join("config.yaml");
    std::fs::write(&path, text).unwrap();
    dxdp::config::Inputs {
        file: Some((path, true)),
        ..Default::default()
    }
    .resolve()
    .map_err(|e| e.to_string())
}

#[test]
fn hostile_configuration_files_give_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let deep = 100_000;
    let table: Vec<(&str, String, &str)> = vec![
        (
            "deep flow nesting",
            format!(
                "devices: {{exclude: {}{}}}\n",
                rep("[", deep),
                rep("]", deep)
            ),
            "",
        ),
        (
            "deep mapping nesting",
            format!("resources: {}1{}\n", rep("{a: ", deep), rep("}", deep)),
            "",
        ),
        ("alias bomb", alias_bomb(12), ""),
        (
            "replicas is a map",
            "resources: {display: {replicas: {a: 1}}}\n".into(),
            "config.yaml:1:",
        ),
        (
            "replicas too large",
            "resources: {display: {replicas: 18446744073709551616}}\n".into(),
            "config.yaml:1:33:",
        ),
        ("a list at the top", "- a\n- b\n".into(), ""),
        (
            "a huge unknown key",
            format!("{}: 1\n", rep("k", 1 << 20)),
            "",
        ),
        (
            "thousands of selectors with a bad one last",
            format!(
                "devices:\n  exclude:\n{}    - vendor: 0x1FFFFFFFF\n",
                rep("    - {vendor: nvidia, deviceId: 0x2236}\n", 5000)
            ),
            "",
        ),
    ];
    for (what, text, mentions) in table {
        let err = match resolve_config(dir.path(), &text) {
            Err(e) => e,
            Ok(c) => panic!("{what}: accepted as {c:?}"),
        };
        assert!(err.contains("config.yaml"), "{what}: {err}");
        assert!(err.contains(mentions), "{what}: {err}");
        assert!(err.len() < 2000, "{what}: a {} byte message", err.len());
        eprintln!("{what}: {err}");
    }
    // A large valid file is read.
    let many = format!(
        "devices:\n  exclude:\n{}",
        rep("    - {vendor: nvidia, deviceId: 0x2236}\n", 5000)
    );
    assert!(resolve_config(dir.path(), &many).is_ok());
}

#[test]
fn device_ids_with_odd_bytes_are_refused_as_malformed() {
    let facts = common::facts("sample");
    let d = discover(&facts, &PipelineConfig::default());
    let good = allocation::advertise(&d, Resource::Display, Sharing::Replicas(2))[0]
        .id
        .clone();
    let table: Vec<(&str, String)> = vec![
        ("empty", String::new()),
        ("NUL", format!("{good}\0")),
        ("newline", format!("{good}\n")),
        ("escape sequence", format!("\u{1b}[31m{good}")),
        ("right-to-left override", format!("{good}\u{202e}")),
        (
            "replacement character (invalid UTF-8 decoded)",
            format!("{good}\u{fffd}"),
        ),
        ("path", format!("../{good}")),
        ("backslash", format!(r"{good}\x")),
        ("64 characters", rep("a", 64)),
        ("non-ASCII digit replica", format!("{good}-r\u{0661}")),
        ("space", format!(" {good}")),
    ];
    for (what, id) in table {
        for assignment in [Assignment::LocationPath, Assignment::ClassGuid] {
            let err = allocation::allocate(
                &d,
                Resource::Display,
                Resource::Display.default_resource_name(),
                Sharing::Replicas(2),
                assignment,
                &ResourcePolicy::default(),
                &[good.clone(), id.clone()],
            )
            .unwrap_err();
            assert!(
                matches!(err, AllocationError::Malformed(_)),
                "{what}: {err:?}"
            );
            let message = err.to_string();
            assert!(
                !message.contains(['\0', '\n', '\u{1b}', '\u{202e}']),
                "{what}: the message quotes control characters: {message:?}"
            );
        }
    }
    // Well-formed IDs that are not advertised are unknown, not malformed.
    for id in [
        format!("{good}-r2"),
        format!("{good}-r01"),
        "gpu-0".to_string(),
    ] {
        let err = allocation::allocate(
            &d,
            Resource::Display,
            Resource::Display.default_resource_name(),
            Sharing::Replicas(2),
            Assignment::Auto,
            &ResourcePolicy::default(),
            std::slice::from_ref(&id),
        )
        .unwrap_err();
        assert!(
            matches!(err, AllocationError::Unknown { .. }),
            "{id}: {err:?}"
        );
    }
}
