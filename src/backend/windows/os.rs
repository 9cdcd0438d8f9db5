//! Operating system facts: product, version, build and UBR from the registry, `%SystemRoot%`,
//! and the HCS schema versions (queried once per process: loading `computecore.dll` on every
//! health poll bought nothing, since enabling the Containers feature needs a reboot anyway).

use std::sync::OnceLock;

use windows::Win32::System::Registry::HKEY_LOCAL_MACHINE;

use super::{hcs, registry};
use crate::backend::winparse;
use dxdp_core::facts::{OsFacts, RegData};

const CURRENT_VERSION: &str = r"SOFTWARE\Microsoft\Windows NT\CurrentVersion";

fn string(name: &str) -> Option<String> {
    match registry::read_value(HKEY_LOCAL_MACHINE, CURRENT_VERSION, name) {
        Ok(Some(RegData::String(s))) if !s.is_empty() => Some(s),
        _ => None,
    }
}

fn number(name: &str) -> Option<u64> {
    match registry::read_value(HKEY_LOCAL_MACHINE, CURRENT_VERSION, name) {
        Ok(Some(RegData::Integer(n))) => Some(n),
        _ => None,
    }
}

/// Reads the OS facts; what cannot be read is left out, HCS problems are logged.
pub(crate) fn read() -> OsFacts {
    let build = winparse::os_build(
        number("CurrentMajorVersionNumber"),
        number("CurrentMinorVersionNumber"),
        string("CurrentBuildNumber").as_deref(),
        number("UBR"),
    );
    let hcs_schema_versions = hcs_schema_versions().to_vec();
    OsFacts {
        product_name: string("ProductName"),
        display_version: string("DisplayVersion").or_else(|| string("ReleaseId")),
        build,
        system_root: std::env::var("SystemRoot").ok().filter(|s| !s.is_empty()),
        hcs_schema_versions,
        containerd_version: None,
        kubelet_version: None,
        device_nodes: Vec::new(),
    }
}

/// The HCS schema versions, queried (and a failure logged) on the first call only.
fn hcs_schema_versions() -> &'static [String] {
    static VERSIONS: OnceLock<Vec<String>> = OnceLock::new();
    VERSIONS.get_or_init(|| match hcs::schema_versions() {
        Ok(v) => v,
        Err(e) => {
            tracing::info!("HCS is unavailable, so containers cannot run here: {e}");
            Vec::new()
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn hcs_is_queried_once_per_process() {
        // The same slice, not an equal copy: the second call did not query again.
        assert!(std::ptr::eq(
            super::hcs_schema_versions(),
            super::hcs_schema_versions()
        ));
    }

    #[test]
    fn reads_the_os_version_from_the_registry() {
        let os = super::read();
        assert!(os.product_name.is_some(), "{os:?}");
        let build = os.build.expect("a build number");
        assert!(build.split('.').count() >= 3, "{build}");
        assert!(os.system_root.is_some_and(|r| r.len() > 2));
    }
}
