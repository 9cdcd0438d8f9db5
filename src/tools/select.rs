//! Device selection for `dxdp mounts`: every selector adds devices (a union); a selector that
//! matches nothing is an error naming it.

use dxdp_core::allocation;
use dxdp_core::devices::{Device, Discovery, Resource};
use dxdp_core::pipeline::winpath::compare_key;

/// One selector from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Every device.
    All,
    /// The device at this position in `dxdp discover` order (0-based).
    Index(usize),
    /// The device with this LUID (as `discover` shows it, `0x00000000_0x006B8B86`; or decimal,
    /// or one `0x` hex number).
    Luid(String),
    /// The device at this location path (case-insensitive).
    LocationPath(String),
    /// Devices of a vendor: a name (`nvidia`) or PCI vendor ID (`0x10DE`, `10de`).
    Vendor(String),
    /// Devices of a resource.
    Resource(Resource),
    /// The device behind a kubelet device ID (a physical ID or a replica `<id>-r<k>`).
    Id(String),
}

/// Why a selection failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// Nothing was selected at all.
    #[error("select devices with --all, --index, --id, --luid, --location-path, --vendor, --display or --compute")]
    Nothing,
    /// A selector matched no device.
    #[error("{0} matches no device (see `dxdp discover`)")]
    NoMatch(String),
    /// A selector value is malformed.
    #[error("{0}")]
    Invalid(String),
}

fn vendor_matches(device: &Device, wanted: &str) -> Option<bool> {
    dxdp_core::vendor::parse(wanted).map(|id| device.vendor_id == id)
}

/// The selected devices, in discover order, each once.
pub fn select<'a>(
    discovery: &'a Discovery,
    selectors: &[Selector],
) -> Result<Vec<&'a Device>, SelectError> {
    if selectors.is_empty() {
        return Err(SelectError::Nothing);
    }
    let mut chosen = vec![false; discovery.devices.len()];
    for selector in selectors {
        let mut any = false;
        for (i, device) in discovery.devices.iter().enumerate() {
            let hit = match selector {
                Selector::All => true,
                Selector::Index(n) => i == *n,
                Selector::Luid(text) => {
                    let luid = dxdp_core::luid::parse(text)
                        .ok_or_else(|| SelectError::Invalid(format!("--luid {text:?} is not a LUID: write it as discover shows it (0x00000000_0x006B8B86), or in decimal")))?;
                    device.luid == luid
                }
                Selector::LocationPath(p) => compare_key(&device.location_path) == compare_key(p),
                Selector::Vendor(v) => vendor_matches(device, v).ok_or_else(|| {
                    SelectError::Invalid(format!(
                        "--vendor {v:?} is not a vendor name (nvidia, amd, intel, microsoft, qualcomm, pci-XXXX) or PCI vendor ID (0x10DE)"
                    ))
                })?,
                Selector::Resource(r) => device.resource == Some(*r),
                Selector::Id(id) => device.resource.is_some_and(|r| {
                    allocation::resolve_any(discovery, r, id.trim())
                        .is_some_and(|d| d.id == device.id)
                }),
            };
            if hit {
                chosen[i] = true;
                any = true;
            }
        }
        if !any && *selector != Selector::All {
            let name = match selector {
                Selector::All => "--all".to_string(),
                Selector::Index(n) => format!(
                    "--index {n} (there are {} devices, 0 to {})",
                    discovery.devices.len(),
                    discovery.devices.len().saturating_sub(1)
                ),
                Selector::Luid(l) => format!("--luid {l}"),
                Selector::LocationPath(p) => format!("--location-path {p}"),
                Selector::Vendor(v) => format!("--vendor {v}"),
                Selector::Resource(r) => format!("--{r}"),
                Selector::Id(id) => format!("--id {}", dxdp_core::quote::quote(id)),
            };
            return Err(SelectError::NoMatch(name));
        }
    }
    Ok(discovery
        .devices
        .iter()
        .zip(chosen)
        .filter_map(|(d, c)| c.then_some(d))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dxdp_core::pipeline::{discover, PipelineConfig};

    fn sample() -> Discovery {
        discover(
            &dxdp_core::sample::sample_host().unwrap(),
            &PipelineConfig::default(),
        )
    }

    fn paths(devices: &[&Device]) -> Vec<String> {
        devices
            .iter()
            .map(|d| {
                d.location_path
                    .replace("PCIROOT(0)#PCI(", "")
                    .replace(")#PCI(0000)", "")
            })
            .collect()
    }

    #[test]
    fn selectors_and_unions() {
        let d = sample();
        let a100_luid = d.devices[2].luid.to_string();
        let table: Vec<(Vec<Selector>, Vec<&str>)> = vec![
            (vec![Selector::All], vec!["0100", "0200", "0300"]),
            (vec![Selector::Index(1)], vec!["0200"]),
            (
                vec![Selector::Index(2), Selector::Index(0)],
                vec!["0100", "0300"],
            ),
            (vec![Selector::Luid(a100_luid)], vec!["0300"]),
            // Kubelet device IDs, physical and replica, computed from the discovered IDs.
            (vec![Selector::Id(d.devices[1].id.clone())], vec!["0200"]),
            (
                vec![Selector::Id(format!("{}-r3", d.devices[0].id))],
                vec!["0100"],
            ),
            // A memory unit, whatever the configuration.
            (
                vec![Selector::Id(format!("{}-m17", d.devices[2].id))],
                vec!["0300"],
            ),
            (
                vec![Selector::Luid(format!("0x{:x}", d.devices[0].luid))],
                vec!["0100"],
            ),
            // As `discover` shows it.
            (
                vec![Selector::Luid(dxdp_core::luid::label(d.devices[1].luid))],
                vec!["0200"],
            ),
            (
                vec![Selector::LocationPath(
                    "pciroot(0)#pci(0200)#pci(0000)".into(),
                )],
                vec!["0200"],
            ),
            (
                vec![Selector::Vendor("nvidia".into())],
                vec!["0100", "0200", "0300"],
            ),
            (
                vec![Selector::Vendor("0x10DE".into())],
                vec!["0100", "0200", "0300"],
            ),
            (
                vec![Selector::Vendor("10de".into())],
                vec!["0100", "0200", "0300"],
            ),
            (
                vec![Selector::Resource(Resource::Display)],
                vec!["0100", "0200"],
            ),
            (vec![Selector::Resource(Resource::Compute)], vec!["0300"]),
            (
                vec![Selector::Resource(Resource::Compute), Selector::Index(0)],
                vec!["0100", "0300"],
            ),
            (vec![Selector::Index(0), Selector::Index(0)], vec!["0100"]),
        ];
        for (selectors, expected) in table {
            let got = select(&d, &selectors).unwrap();
            assert_eq!(paths(&got), expected, "{selectors:?}");
        }
    }

    #[test]
    fn selectors_that_match_nothing_are_named() {
        let d = sample();
        let table: Vec<(Vec<Selector>, &str)> = vec![
            (vec![], "select devices with"),
            (
                vec![Selector::Index(7)],
                "--index 7 (there are 3 devices, 0 to 2)",
            ),
            (vec![Selector::Luid("12".into())], "--luid 12"),
            (
                vec![Selector::Luid("zz".into())],
                "--luid \"zz\" is not a LUID: write it as discover shows it (0x00000000_0x006B8B86), or in decimal",
            ),
            (
                vec![Selector::LocationPath("PCIROOT(9)".into())],
                "--location-path PCIROOT(9)",
            ),
            (vec![Selector::Vendor("amd".into())], "--vendor amd"),
            (vec![Selector::Vendor("acme".into())], "not a vendor name"),
            (vec![Selector::Id("gpu-0".into())], "--id \"gpu-0\""),
            (vec![Selector::Id(format!("{}-r0", d.devices[0].id))], "-r0"),
            (vec![Selector::Id(format!("{}-m01", d.devices[0].id))], "-m01"),
            (
                vec![Selector::All, Selector::Vendor("intel".into())],
                "--vendor intel",
            ),
        ];
        for (selectors, fragment) in table {
            let err = select(&d, &selectors).unwrap_err().to_string();
            assert!(err.contains(fragment), "{selectors:?}: {err}");
        }
    }
}
