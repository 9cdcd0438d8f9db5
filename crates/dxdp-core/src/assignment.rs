//! How containers are given devices, and which modes the host's HCS can do.
//!
//! HCS schema 2.2 (Windows 10 1903, Windows Server 2022) added `Device.LocationPath`, so a device
//! can be assigned individually by `vpci-location-path://`; older hosts (Windows Server 2019,
//! schema 2.1) only assign by interface class GUID, which gives a container every GPU.

use serde::{Deserialize, Serialize};

use crate::facts::OsFacts;

/// The schema version that added `Device.LocationPath` (Windows 10 1903 / Server 2022).
pub const LOCATION_PATH_SCHEMA: (u64, u64) = (2, 2);

/// How containers are given devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assignment {
    /// `vpci-location-path://<path>`: one device (HCS schema 2.2+).
    LocationPath,
    /// `class/5B45201D-…`: every display adapter of the node (Windows Server 2019, HCS < 2.2).
    ClassGuid,
    /// location-path when the host's HCS schema is at least 2.2, else class-guid.
    Auto,
}

impl Assignment {
    /// Every mode, in the order the docs list them.
    pub const ALL: [Assignment; 3] = [
        Assignment::LocationPath,
        Assignment::ClassGuid,
        Assignment::Auto,
    ];

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Assignment::LocationPath => "location-path",
            Assignment::ClassGuid => "class-guid",
            Assignment::Auto => "auto",
        }
    }

    /// Parses the configuration spelling.
    pub fn parse(text: &str) -> Option<Assignment> {
        Assignment::ALL
            .into_iter()
            .find(|a| a.as_str() == text.trim())
    }

    /// The mode in force on a host: `auto` becomes location-path on HCS schema 2.2+, else
    /// class-guid; an explicit mode stays as configured.
    pub fn resolve(self, os: &OsFacts) -> Assignment {
        match self {
            Assignment::Auto if supports_location_path(os) => Assignment::LocationPath,
            Assignment::Auto => Assignment::ClassGuid,
            other => other,
        }
    }
}

/// Parses `major.minor`.
pub fn parse_version(v: &str) -> Option<(u64, u64)> {
    let (major, minor) = v.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The highest version in a list (unparsable entries are ignored).
pub fn highest(versions: &[String]) -> Option<(u64, u64)> {
    versions.iter().filter_map(|v| parse_version(v)).max()
}

/// Whether the host's HCS can assign a device by location path.
pub fn supports_location_path(os: &OsFacts) -> bool {
    highest(&os.hcs_schema_versions).is_some_and(|v| v >= LOCATION_PATH_SCHEMA)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(versions: &[&str]) -> OsFacts {
        OsFacts {
            hcs_schema_versions: versions.iter().map(|v| v.to_string()).collect(),
            ..OsFacts::default()
        }
    }

    #[test]
    fn auto_follows_the_hcs_schema_and_explicit_modes_stay() {
        use Assignment::*;
        let table: [(Assignment, &[&str], Assignment); 8] = [
            (Auto, &["2.5"], LocationPath),
            (Auto, &["2.2"], LocationPath),
            (Auto, &["1.0", "2.10"], LocationPath),
            (Auto, &["2.1"], ClassGuid),
            (Auto, &[], ClassGuid),
            (Auto, &["bogus"], ClassGuid),
            (LocationPath, &["2.1"], LocationPath),
            (ClassGuid, &["2.5"], ClassGuid),
        ];
        for (configured, versions, expected) in table {
            assert_eq!(
                configured.resolve(&os(versions)),
                expected,
                "{configured:?} {versions:?}"
            );
        }
    }

    #[test]
    fn spellings_round_trip() {
        for a in Assignment::ALL {
            assert_eq!(Assignment::parse(a.as_str()), Some(a));
        }
        assert_eq!(Assignment::parse(" auto "), Some(Assignment::Auto));
        assert_eq!(Assignment::parse("location_path"), None);
    }
}
