//! The host snapshot file format (`apiVersion: dxdp/v1alpha1`, `kind: HostSnapshot`).
//!
//! A snapshot holds the same [`HostFacts`] the Windows backend collects, as YAML or JSON, for
//! tests, demos, bug reports and replay. This module reads and writes it; errors name the file,
//! the line and column and the field path (`adapters[0].hardwareId.vendorId`).

use std::cell::RefCell;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::facts::{AdapterFacts, HostFacts, OsFacts, PnpFacts, RegistryKey};
use crate::quote::{bounded, bounded_prefix};
use crate::telemetry::TelemetryFacts;

/// The only snapshot `apiVersion` this build reads and writes.
pub const API_VERSION: &str = "dxdp/v1alpha1";
/// The snapshot `kind`.
pub const KIND: &str = "HostSnapshot";

/// The on-disk document: a header plus the host facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
    api_version: String,
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    os: Option<OsFacts>,
    #[serde(default)]
    adapters: Vec<AdapterFacts>,
    /// `OsFacts::device_nodes`, top-level in the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    device_nodes: Vec<PnpFacts>,
    #[serde(default)]
    registry: Vec<RegistryKey>,
    #[serde(default)]
    files: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    faults: Vec<crate::facts::LogRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    telemetry: Option<TelemetryFacts>,
}

/// Why a snapshot could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The file could not be read. The OS error is part of the message (not a separate
    /// source), so that it is printed once.
    #[error("cannot read host snapshot {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// The file is not a valid snapshot.
    #[error("{}", format_invalid(origin, *line, *column, field.as_deref(), message))]
    Invalid {
        /// Where the text came from (a file path or a description).
        origin: String,
        /// 1-based line, when known.
        line: Option<u64>,
        /// 1-based column, when known.
        column: Option<u64>,
        /// The field path, when known (`adapters[1].luid`).
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// Serialising the facts failed.
    #[error("cannot write host snapshot: {0}")]
    Write(String),
}

fn format_invalid(
    origin: &str,
    line: Option<u64>,
    column: Option<u64>,
    field: Option<&str>,
    message: &str,
) -> String {
    let mut out = origin.to_string();
    if let Some(line) = line {
        out.push_str(&format!(":{line}"));
        if let Some(column) = column {
            out.push_str(&format!(":{column}"));
        }
    }
    out.push_str(": ");
    if let Some(field) = field.filter(|f| !f.is_empty() && *f != ".") {
        out.push_str(&format!("field `{}`: ", bounded(field)));
    }
    out.push_str(&bounded_prefix(message, MAX_MESSAGE));
    out.push_str(&format!(
        " (the host snapshot format is described in docs/host-snapshot.md; apiVersion {API_VERSION})"
    ));
    out
}

/// Reads a snapshot file.
pub fn read_file(path: &Path) -> Result<HostFacts, SnapshotError> {
    let text = std::fs::read_to_string(path).map_err(|error| SnapshotError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    parse(&text, &path.display().to_string())
}

/// Reads a snapshot file with its telemetry section (absent: `None`).
pub fn read_file_full(path: &Path) -> Result<(HostFacts, Option<TelemetryFacts>), SnapshotError> {
    let text = std::fs::read_to_string(path).map_err(|error| SnapshotError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    parse_full(&text, &path.display().to_string())
}

/// Parses snapshot text (YAML, or JSON when it starts with `{`). `origin` names the source in errors.
pub fn parse(text: &str, origin: &str) -> Result<HostFacts, SnapshotError> {
    parse_full(text, origin).map(|(facts, _)| facts)
}

/// [`parse`], with the telemetry section (absent: `None`).
pub fn parse_full(
    text: &str,
    origin: &str,
) -> Result<(HostFacts, Option<TelemetryFacts>), SnapshotError> {
    let text = text.strip_prefix('\u{FEFF}').unwrap_or(text);
    let doc = if text.trim_start().starts_with('{') {
        parse_json(text, origin)?
    } else {
        parse_yaml(text, origin)?
    };
    check_header(&doc, origin)?;
    let mut os = doc.os;
    if !doc.device_nodes.is_empty() {
        os.get_or_insert_with(OsFacts::default).device_nodes = doc.device_nodes;
    }
    let facts = HostFacts {
        os,
        adapters: doc.adapters,
        registry: doc.registry,
        files: doc.files,
        faults: doc.faults,
    };
    Ok((facts, doc.telemetry))
}

fn parse_json(text: &str, origin: &str) -> Result<Document, SnapshotError> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        SnapshotError::Invalid {
            origin: origin.to_string(),
            line: Some(inner.line() as u64),
            column: Some(inner.column() as u64),
            field: Some(field),
            message: strip_position(&inner.to_string()),
        }
    })
}

fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

fn parse_yaml(text: &str, origin: &str) -> Result<Document, SnapshotError> {
    let field: RefCell<Option<String>> = RefCell::new(None);
    let options = serde_saphyr::options! { with_snippet: false };
    let result = serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            *field.borrow_mut() = Some(e.path().to_string());
            e.into_inner()
        })
    });
    result.map_err(|e| {
        let location = e.location();
        SnapshotError::Invalid {
            origin: origin.to_string(),
            line: location.as_ref().map(|l| l.line()),
            column: location.as_ref().map(|l| l.column()),
            field: field.into_inner(),
            message: yaml_message(&e),
        }
    })
}

/// The error message without serde-saphyr's own `line N column M:` prefix and position suffix
/// (callers report the position themselves).
pub fn yaml_message(e: &serde_saphyr::Error) -> String {
    let text = e.without_snippet().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    let first = text.lines().next().unwrap_or_default();
    let message = match first.find(": ") {
        Some(i) if first.starts_with("line ") => &first[i + 2..],
        _ => first,
    };
    bounded_prefix(&strip_position(message), MAX_MESSAGE)
}

/// The most bytes of a parser message quoted in an error (parser messages can echo values).
const MAX_MESSAGE: usize = 400;

fn check_header(doc: &Document, origin: &str) -> Result<(), SnapshotError> {
    let invalid = |field: &str, message: String| SnapshotError::Invalid {
        origin: origin.to_string(),
        line: None,
        column: None,
        field: Some(field.to_string()),
        message,
    };
    if doc.api_version != API_VERSION {
        return Err(invalid(
            "apiVersion",
            format!(
                "unsupported apiVersion `{}`; this dxdp reads `{API_VERSION}`",
                bounded(&doc.api_version)
            ),
        ));
    }
    if doc.kind != KIND {
        return Err(invalid(
            "kind",
            format!("kind must be `{KIND}`, found `{}`", bounded(&doc.kind)),
        ));
    }
    Ok(())
}

/// Output format for [`write()`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// YAML (the default).
    Yaml,
    /// Pretty-printed JSON.
    Json,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Yaml => "yaml",
            Format::Json => "json",
        })
    }
}

/// Renders host facts as a snapshot document that [`parse`] reads back to the same facts.
pub fn write(facts: &HostFacts, format: Format) -> Result<String, SnapshotError> {
    write_full(facts, None, format)
}

/// [`write()`], with a telemetry section when `telemetry` is given.
pub fn write_full(
    facts: &HostFacts,
    telemetry: Option<&TelemetryFacts>,
    format: Format,
) -> Result<String, SnapshotError> {
    let doc = Document {
        api_version: API_VERSION.to_string(),
        kind: KIND.to_string(),
        os: facts.os.clone(),
        adapters: facts.adapters.clone(),
        device_nodes: facts
            .os
            .as_ref()
            .map(|os| os.device_nodes.clone())
            .unwrap_or_default(),
        registry: facts.registry.clone(),
        files: facts.files.clone(),
        faults: facts.faults.clone(),
        telemetry: telemetry.cloned(),
    };
    match format {
        Format::Yaml => {
            serde_saphyr::to_string(&doc).map_err(|e| SnapshotError::Write(e.to_string()))
        }
        Format::Json => serde_json::to_string_pretty(&doc)
            .map(|s| s + "\n")
            .map_err(|e| SnapshotError::Write(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\n";

    #[test]
    fn minimal_document_is_an_empty_host() {
        let facts = parse(MINIMAL, "t.yaml").unwrap();
        assert_eq!(facts, HostFacts::default());
    }

    #[test]
    fn errors_name_origin_line_and_field() {
        // (document, expected fragments of the message)
        let table: &[(&str, &[&str])] = &[
            (
                "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\nadapters:\n  - luid: 1\n    hardwareId: {vendorId: nope, deviceId: 1}\n    isHardware: true\n",
                &["t.yaml:5:", "adapters[0].hardwareId.vendorId", "u32"],
            ),
            (
                "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\nbogus: 1\n",
                &["t.yaml:3:", "unknown field `bogus`"],
            ),
            (
                "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\nadapters:\n  - luid: 1\n    hardwareId: {vendorId: 1, deviceId: 1}\n",
                &["t.yaml:", "isHardware"],
            ),
            (
                "apiVersion: dxdp/v1alpha1\nkind: HostSnapshot\nregistry:\n  - key: 'HKLM\\X'\n    values:\n      - {name: a, type: REG_MULTI_SZ, data: one}\n",
                &["t.yaml:6:", "registry[0].values[0]", "REG_MULTI_SZ needs a list of strings"],
            ),
            (
                "apiVersion: dxdp/v2\nkind: HostSnapshot\n",
                &["t.yaml: field `apiVersion`", "dxdp/v1alpha1"],
            ),
            ("apiVersion: dxdp/v1alpha1\nkind: Pod\n", &["field `kind`", "HostSnapshot"]),
            ("kind: HostSnapshot\n", &["t.yaml:", "apiVersion"]),
            (
                "{\"apiVersion\": \"dxdp/v1alpha1\", \"kind\": \"HostSnapshot\",\n \"files\": [1]}",
                &["t.yaml:2:", "files[0]", "expected a string"],
            ),
            ("adapters: [\n", &["t.yaml:"]),
            ("", &["t.yaml"]),
        ];
        for (doc, fragments) in table {
            let err = parse(doc, "t.yaml").expect_err(doc).to_string();
            for fragment in *fragments {
                assert!(
                    err.contains(fragment),
                    "`{err}` lacks `{fragment}` for {doc:?}"
                );
            }
        }
    }

    #[test]
    fn the_feature_level_round_trips_and_a_bad_one_is_an_error() {
        let adapter = "adapters:\n  - luid: 1\n    hardwareId: {vendorId: 1, deviceId: 1}\n    isHardware: true\n";
        let doc = format!("{MINIMAL}{adapter}    d3d12FeatureLevel: '12_1'\n");
        let facts = parse(&doc, "t.yaml").unwrap();
        assert_eq!(
            facts.adapters[0].d3d12_feature_level.as_deref(),
            Some("12_1")
        );
        for format in [Format::Yaml, Format::Json] {
            let text = write(&facts, format).unwrap();
            assert_eq!(parse(&text, "w").unwrap(), facts, "{text}");
        }
        let doc = format!("{MINIMAL}{adapter}    d3d12FeatureLevel: '12.1'\n");
        let err = parse(&doc, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("t.yaml:7:"), "{err}");
        assert!(
            err.contains("\"12.1\" is not a D3D12 feature level: write it as D3D does, e.g. 12_1"),
            "{err}"
        );
    }

    #[test]
    fn hex_integers_are_accepted() {
        let doc = format!(
            "{MINIMAL}adapters:\n  - luid: -5\n    hardwareId: {{vendorId: 0x10DE, deviceId: 0x1EB8, subSysId: 0x12A210DE, revision: 0xA1}}\n    isHardware: true\n"
        );
        let facts = parse(&doc, "t").unwrap();
        let hw = facts.adapters[0].hardware_id;
        assert_eq!(
            (hw.vendor_id, hw.device_id, hw.sub_sys_id, hw.revision),
            (0x10DE, 0x1EB8, 0x12A2_10DE, 0xA1)
        );
        assert_eq!(facts.adapters[0].luid, -5);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,400}") {
            let _ = parse(&text, "fuzz");
        }

        #[test]
        fn mangled_snapshots_never_panic(cut in 0usize..4000, junk in "[\\[\\]{}:,'\"\\-\\n 0-9a-z]{0,8}") {
            let sample = crate::sample::SAMPLE_HOST_YAML;
            let mut at = cut.min(sample.len());
            while !sample.is_char_boundary(at) {
                at -= 1;
            }
            let text = format!("{}{junk}{}", &sample[..at], &sample[at..]);
            let _ = parse(&text, "fuzz");
        }
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = read_file(Path::new("/nonexistent/dir/host.yaml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/dir/host.yaml"), "{err}");
    }
}
