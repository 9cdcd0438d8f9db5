//! `dxdp hcs`: the OS, the supported HCS schema versions and whether devices can be assigned
//! individually by location path (HCS schema 2.2 and later).

use serde::Serialize;

use dxdp_core::assignment::{highest, LOCATION_PATH_SCHEMA};
use dxdp_core::facts::OsFacts;

/// The verdict of `dxdp hcs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HcsReport {
    /// OS product name.
    pub product_name: Option<String>,
    /// OS display version.
    pub display_version: Option<String>,
    /// OS build (`10.0.20348.1547`).
    pub build: Option<String>,
    /// Supported schema versions, highest minor per major.
    pub hcs_schema_versions: Vec<String>,
    /// The highest schema version.
    pub highest_schema: Option<String>,
    /// Whether `vpci-location-path` assignment works.
    pub location_path_assignment: bool,
    /// `location-path`, `class-guid`, or null when HCS is unavailable.
    pub recommended_assignment: Option<String>,
    /// One line for people.
    pub verdict: String,
}

/// Builds the report from the OS facts.
pub fn report(os: &OsFacts) -> HcsReport {
    let top = highest(&os.hcs_schema_versions);
    let (location_path, recommended, verdict) = match top {
        None => (
            false,
            None,
            "HCS is unavailable (no schema versions): install the Containers feature; no container can get a device".to_string(),
        ),
        Some(v) if v >= LOCATION_PATH_SCHEMA => (
            true,
            Some("location-path".to_string()),
            format!(
                "Individual device assignment by location path is supported (HCS schema {}.{} >= 2.2): use assignment mode location-path",
                v.0, v.1
            ),
        ),
        Some(v) => (
            false,
            Some("class-guid".to_string()),
            format!(
                "HCS schema {}.{} is below 2.2: devices cannot be assigned individually; use assignment mode class-guid (every GPU of the node goes to the container)",
                v.0, v.1
            ),
        ),
    };
    HcsReport {
        product_name: os.product_name.clone(),
        display_version: os.display_version.clone(),
        build: os.build.clone(),
        hcs_schema_versions: os.hcs_schema_versions.clone(),
        highest_schema: top.map(|(a, b)| format!("{a}.{b}")),
        location_path_assignment: location_path,
        recommended_assignment: recommended,
        verdict,
    }
}

/// The report for people.
pub fn text(r: &HcsReport) -> String {
    let mut out = String::new();
    out.push_str("Operating system: ");
    out.push_str(r.product_name.as_deref().unwrap_or("unknown"));
    if let Some(v) = &r.display_version {
        out.push_str(&format!(", version {v}"));
    }
    if let Some(b) = &r.build {
        out.push_str(&format!(" (OS build {b})"));
    }
    out.push('\n');
    out.push_str("Supported HCS schema versions: ");
    if r.hcs_schema_versions.is_empty() {
        out.push_str("none");
    } else {
        out.push_str(&r.hcs_schema_versions.join(", "));
    }
    out.push('\n');
    out.push_str(&format!("Verdict: {}\n", r.verdict));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let table: [(&[&str], bool, Option<&str>); 6] = [
            (&["2.5"], true, Some("location-path")),
            (&["1.0", "2.2"], true, Some("location-path")),
            (&["2.1"], false, Some("class-guid")),
            (&["2.10"], true, Some("location-path")),
            (&[], false, None),
            (&["bogus"], false, None),
        ];
        for (versions, ok, mode) in table {
            let os = OsFacts {
                hcs_schema_versions: versions.iter().map(|s| s.to_string()).collect(),
                ..OsFacts::default()
            };
            let r = report(&os);
            assert_eq!(r.location_path_assignment, ok, "{versions:?}");
            assert_eq!(r.recommended_assignment.as_deref(), mode, "{versions:?}");
        }
    }
}
