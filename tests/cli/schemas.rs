//! The JSON Schemas in docs/schemas/ are the ones generated from the output types.
//!
//! After changing an output type, regenerate them with
//! `DXDP_UPDATE_SCHEMAS=1 cargo test --test cli schemas::` and review the diff.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn schema_path(kind: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("docs/schemas")
        .join(format!("{kind}.schema.json"))
}

#[test]
fn checked_in_schemas_match_the_types() {
    let update = std::env::var_os("DXDP_UPDATE_SCHEMAS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (kind, schema) in dxdp::output::schemas() {
        let path = schema_path(kind);
        let want = dxdp::output::schema_text(&schema);
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have == want {
            continue;
        }
        if update {
            std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        } else {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "these JSON Schemas differ from the output types: {}\n\
         regenerate them with `DXDP_UPDATE_SCHEMAS=1 cargo test --test cli schemas::` and review the diff",
        stale.join(", ")
    );
}

#[test]
fn no_stray_schema_files() {
    let kinds: Vec<String> = dxdp::output::schemas()
        .into_iter()
        .map(|(k, _)| format!("{k}.schema.json"))
        .collect();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/schemas");
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(
            kinds.contains(&name),
            "docs/schemas/{name} is not generated from any output type; delete it"
        );
    }
}

/// A small JSON Schema checker for what schemars emits (`type`, `const`, `enum`, `properties`,
/// `required`, `additionalProperties`, `items`, `$ref`, `anyOf`, `oneOf`, `allOf`): the errors
/// of `value` against `schema`, each with its JSON path.
fn violations(value: &Value, schema: &Value, root: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let target = r
            .strip_prefix("#/$defs/")
            .and_then(|name| root["$defs"].get(name));
        match target {
            Some(t) => violations(value, t, root, path, out),
            None => out.push(format!("{path}: unresolvable $ref {r}")),
        }
    }
    if let Some(types) = schema.get("type") {
        let names: Vec<&str> = match types {
            Value::String(s) => vec![s.as_str()],
            Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let ok = names.iter().any(|t| match *t {
            "null" => value.is_null(),
            "boolean" => value.is_boolean(),
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "array" => value.is_array(),
            "object" => value.is_object(),
            _ => false,
        });
        if !ok {
            out.push(format!("{path}: {value} is not of type {names:?}"));
        }
    }
    if let Some(c) = schema.get("const") {
        if c != value {
            out.push(format!("{path}: {value} is not {c}"));
        }
    }
    if let Some(Value::Array(options)) = schema.get("enum") {
        if !options.contains(value) {
            out.push(format!("{path}: {value} is not one of {options:?}"));
        }
    }
    for (key, all) in [("anyOf", false), ("oneOf", false), ("allOf", true)] {
        if let Some(Value::Array(branches)) = schema.get(key) {
            let matching = branches
                .iter()
                .filter(|b| {
                    let mut errors = Vec::new();
                    violations(value, b, root, path, &mut errors);
                    errors.is_empty()
                })
                .count();
            let ok = if all {
                matching == branches.len()
            } else {
                matching > 0
            };
            if !ok {
                out.push(format!("{path}: {value} matches no branch of {key}"));
            }
        }
    }
    if let Value::Object(map) = value {
        let properties = schema.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(required)) = schema.get("required") {
            for r in required.iter().filter_map(Value::as_str) {
                if !map.contains_key(r) {
                    out.push(format!("{path}: required field {r} is missing"));
                }
            }
        }
        for (k, v) in map {
            let child = format!("{path}.{k}");
            match (
                properties.and_then(|p| p.get(k)),
                schema.get("additionalProperties"),
            ) {
                (Some(s), _) => violations(v, s, root, &child, out),
                (None, Some(Value::Bool(false))) => out.push(format!("{child}: not in the schema")),
                (None, Some(s @ Value::Object(_))) => violations(v, s, root, &child, out),
                // An object schema that names its properties documents all of them.
                (None, _) if properties.is_some() => {
                    out.push(format!("{child}: not in the schema"))
                }
                (None, _) => {}
            }
        }
    }
    if let (Value::Array(items), Some(s)) = (value, schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            violations(item, s, root, &format!("{path}[{i}]"), out);
        }
    }
}

fn fixtures() -> Vec<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().display().to_string())
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    files.sort();
    files
}

fn dxdp_json(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_dxdp"))
        .args(args)
        .env_clear()
        .output()
        .unwrap_or_else(|e| panic!("dxdp {args:?}: {e}"));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "dxdp {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn every_json_output_conforms_to_its_schema() {
    let schemas: Vec<(&str, Value)> = dxdp::output::schemas()
        .into_iter()
        .map(|(k, s)| (k, s.as_value().clone()))
        .collect();
    let schema = |kind: &str| {
        schemas
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    };
    let mut runs: Vec<(&str, Vec<String>)> = vec![(
        "Configuration",
        vec!["config".into(), "show".into(), "--json".into()],
    )];
    for f in fixtures() {
        for (kind, args) in [
            ("Discovery", &["discover", "--json"][..]),
            ("DoctorReport", &["doctor", "--json"]),
            ("HcsReport", &["hcs", "--json"]),
            ("Mounts", &["mounts", "--all", "--format", "json"]),
            ("Audit", &["audit", "-o", "json"]),
            ("Validation", &["validate", "-o", "json", "--timeout", "5"]),
        ] {
            let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            a.extend(["--host-snapshot".to_string(), f.clone()]);
            runs.push((kind, a));
        }
    }
    let mut kinds_seen = std::collections::BTreeSet::new();
    for (kind, args) in runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let doc = dxdp_json(&args);
        let s = schema(kind);
        let mut errors = Vec::new();
        violations(&doc, &s, &s, "$", &mut errors);
        assert!(errors.is_empty(), "dxdp {args:?}:\n{}", errors.join("\n"));
        assert_eq!(doc["apiVersion"], "dxdp/v1", "{args:?}");
        assert_eq!(doc["kind"], kind, "{args:?}");
        kinds_seen.insert(kind);
    }
    assert_eq!(kinds_seen.len(), schemas.len());
    // `audit` inside a container (DXDP_ADAPTER_LUIDS set) writes its other scope.
    for luids in ["7048070", "not-a-luid"] {
        let fixture =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/telemetry-t4.yaml");
        let out = Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .args(["audit", "-o", "json", "--host-snapshot"])
            .arg(&fixture)
            .env_clear()
            .env("DXDP_ADAPTER_LUIDS", luids)
            .output()
            .unwrap();
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let s = schema("Audit");
        let mut errors = Vec::new();
        violations(&doc, &s, &s, "$", &mut errors);
        assert!(
            errors.is_empty(),
            "audit in a container ({luids}):\n{}",
            errors.join("\n")
        );
        assert_eq!(doc["scope"], "container");
    }
    // `validate` in a container given GPUs (the hints set), and with hints that do not parse.
    for luids in ["7048070", "not-a-luid"] {
        let fixture =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/telemetry-t4.yaml");
        let out = Command::new(env!("CARGO_BIN_EXE_dxdp"))
            .args(["validate", "-o", "json", "--host-snapshot"])
            .arg(&fixture)
            .env_clear()
            .env("DXDP_ADAPTER_LUIDS", luids)
            .env("DXDP_DEVICE_IDS", "PCI\\VEN_10DE&DEV_1EB8\\1")
            .env("DXDP_RUNTIME_FILES", "C:\\Windows\\System32\\nvcuda.dll")
            .output()
            .unwrap();
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let s = schema("Validation");
        let mut errors = Vec::new();
        violations(&doc, &s, &s, "$", &mut errors);
        assert!(
            errors.is_empty(),
            "validate in a container ({luids}):\n{}",
            errors.join("\n")
        );
        // Off Windows nothing but the adapters can be checked: exit code 3 (could not tell), never 0.
        assert_eq!(out.status.code(), Some(3), "{luids}");
    }
}

#[test]
fn the_checker_finds_what_does_not_conform() {
    let schema: Value = serde_json::json!({
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"$ref": "#/$defs/B"}},
        "required": ["a"],
        "$defs": {"B": {"type": "array", "items": {"enum": ["x"]}}}
    });
    let check = |v: Value| {
        let mut errors = Vec::new();
        violations(&v, &schema, &schema, "$", &mut errors);
        errors
    };
    assert!(check(serde_json::json!({"a": "s", "b": ["x"]})).is_empty());
    assert_eq!(check(serde_json::json!({"b": []})).len(), 1, "required");
    assert_eq!(check(serde_json::json!({"a": 1})).len(), 1, "type");
    assert_eq!(
        check(serde_json::json!({"a": "s", "c": 1})).len(),
        1,
        "unknown field"
    );
    assert_eq!(
        check(serde_json::json!({"a": "s", "b": ["y"]})).len(),
        1,
        "enum via $ref"
    );
}

/// The chart's schema of its `config` value (dxdp's configuration file).
fn chart_config_schema() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/dxdp/values.schema.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    doc["properties"]["config"].clone()
}

#[test]
fn the_chart_config_schema_is_the_binary_schema() {
    let mut generated = dxdp::config::file::config_schema();
    generated
        .as_object_mut()
        .expect("the schema is an object")
        .remove("title");
    assert!(
        chart_config_schema() == generated,
        "deploy/helm/dxdp/values.schema.json's properties.config differs from `dxdp config schema`;\n\
         update it with `cargo run -q -- config schema | python3 deploy/sync_config_schema.py` and review the diff"
    );
}

/// The ```yaml blocks of docs/configuration.md.
fn configuration_examples() -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```yaml") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn every_configuration_example_is_valid_for_dxdp_and_the_chart() {
    let examples = configuration_examples();
    assert!(
        examples.len() >= 2,
        "docs/configuration.md has {} yaml examples",
        examples.len()
    );
    let schema = chart_config_schema();
    for (i, text) in examples.iter().enumerate() {
        let origin = format!("docs/configuration.md example {}", i + 1);
        if let Err(e) = dxdp::config::parse::parse::<dxdp::config::file::ConfigFile>(text, &origin)
        {
            panic!("{e}");
        }
        let value: Value = serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{origin}: {e}"));
        let mut out = Vec::new();
        violations(&value, &schema, &schema, "$", &mut out);
        assert!(
            out.is_empty(),
            "{origin} against the chart's config schema: {out:?}"
        );
    }
}

#[test]
fn the_chart_config_schema_refuses_what_dxdp_refuses() {
    let schema = chart_config_schema();
    for bad in [
        "resources: {display: {replica: 2}}",
        "configurations: {a: {logLevel: info}}",
        "assignment: guid",
        "devices: {include: [{vendr: nvidia}]}",
        "resources: {display: {replicas: two}}",
    ] {
        let value: Value = serde_saphyr::from_str(bad).expect("YAML");
        let mut out = Vec::new();
        violations(&value, &schema, &schema, "$", &mut out);
        assert!(!out.is_empty(), "the chart's schema accepts {bad}");
        assert!(
            dxdp::config::parse::parse::<dxdp::config::file::ConfigFile>(bad, "t").is_err(),
            "dxdp accepts {bad}"
        );
    }
}
