//! `dxdp hcs`: the OS, the supported HCS schema versions and whether devices can be assigned
//! individually by location path (HCS schema 2.2 and later).

use dxdp_core::assignment::{highest, Assignment, LOCATION_PATH_SCHEMA};
use dxdp_core::facts::OsFacts;

use crate::output::{AssignmentVerdict, HcsReport};

/// Whether `configured` works on the host with `os`: location-path needs HCS schema 2.2+,
/// class-guid needs HCS, auto works wherever HCS does.
pub fn assignment(os: &OsFacts, configured: Assignment) -> AssignmentVerdict {
    let in_force = configured.resolve(os);
    let hcs = highest(&os.hcs_schema_versions).is_some();
    let location_path = dxdp_core::assignment::supports_location_path(os);
    let (works, verdict) = match (configured, in_force) {
        _ if !hcs => (false, "no container can get a device without HCS".to_string()),
        (Assignment::LocationPath, _) if !location_path => (
            false,
            "location-path needs HCS schema 2.2+: every container start would fail; use auto or class-guid here".to_string(),
        ),
        (_, Assignment::ClassGuid) => (
            true,
            "class-guid: each container gets every GPU of the node".to_string(),
        ),
        _ => (true, "location-path: each container gets exactly its devices".to_string()),
    };
    AssignmentVerdict {
        configured: configured.as_str().into(),
        in_force: in_force.as_str().into(),
        works,
        verdict,
    }
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
    fn the_configured_assignment_works_or_says_why_not() {
        use Assignment::*;
        let table: [(&[&str], Assignment, &str, bool); 9] = [
            (&["2.5"], LocationPath, "location-path", true),
            (&["2.5"], Auto, "location-path", true),
            (&["2.5"], ClassGuid, "class-guid", true),
            (&["2.1"], LocationPath, "location-path", false),
            (&["2.1"], Auto, "class-guid", true),
            (&["2.1"], ClassGuid, "class-guid", true),
            (&[], LocationPath, "location-path", false),
            (&[], Auto, "class-guid", false),
            (&[], ClassGuid, "class-guid", false),
        ];
        for (versions, configured, in_force, works) in table {
            let os = OsFacts {
                hcs_schema_versions: versions.iter().map(|s| s.to_string()).collect(),
                ..OsFacts::default()
            };
            let v = assignment(&os, configured);
            assert_eq!(
                (v.in_force.as_str(), v.works),
                (in_force, works),
                "{versions:?} {configured:?}"
            );
        }
    }

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
