//! Which PnP device node belongs to which DXCore adapter.
//!
//! Two rules, in order, for every adapter that may be hardware (`IsHardware`, or `IsHardware`
//! unsupported) and has no device node recorded yet:
//!
//! 1. **LUID**: the device node whose adapter LUID property
//!    (`{60B193CB-5276-4D0F-96FC-F173ABAD3EC6},2`) is a `DEVPROP_TYPE_UINT64` equal to the
//!    adapter's DXCore LUID. The property is undocumented; a driver may lack it or store it with
//!    another type.
//! 2. **PCI location**: else the one device node not taken by rule 1 whose PCI bus number and
//!    address (`DEVPKEY_Device_BusNumber`, `DEVPKEY_Device_Address`) equal the adapter's address
//!    from the graphics kernel (`D3DKMTQueryAdapterInfo(KMTQAITYPE_ADAPTERADDRESS)`). Two such
//!    nodes (Windows reports no PCI segment) match nothing.
//!
//! An adapter neither rule matches has no device node; the pipeline warns (`adapter-unmatched`)
//! and skips it, and every other adapter keeps its device. Pure: the Windows backend uses the
//! same function to know which driver keys to read.

use std::borrow::Cow;
use std::fmt;

use crate::facts::{AdapterFacts, AdapterProperty, HostFacts, PnpFacts, DEVPROP_TYPE_UINT64};

/// How an adapter's device node was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchedBy {
    /// The facts already held the adapter's device node (`adapters[].pnp`, older snapshots).
    Recorded,
    /// The device node reports the adapter's LUID.
    Luid,
    /// The device node sits at the adapter's PCI bus, device and function.
    PciLocation,
}

impl fmt::Display for MatchedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MatchedBy::Recorded => "recorded",
            MatchedBy::Luid => "LUID",
            MatchedBy::PciLocation => "PCI location",
        })
    }
}

/// The outcome for one adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterMatch {
    /// The adapter's LUID.
    pub luid: i64,
    /// How its device node was found; `None` when none was (or the adapter is software).
    pub matched_by: Option<MatchedBy>,
    /// The device node's instance ID, when one matched.
    pub instance_id: Option<String>,
    /// One sentence for logs and warnings: what matched, or what was tried.
    pub detail: String,
}

impl AdapterMatch {
    /// Whether this adapter was looked for at all and nothing matched.
    pub fn unmatched(&self) -> bool {
        self.matched_by.is_none()
    }
}

/// The LUID a device node reports, or why it reports none usable.
pub fn node_luid(node: &PnpFacts) -> Result<i64, String> {
    let Some(prop) = &node.adapter_luid else {
        return Err("has no adapter LUID property".into());
    };
    if prop.kind != DEVPROP_TYPE_UINT64 {
        return Err(format!(
            "has the adapter LUID property with type 0x{:X}, not DEVPROP_TYPE_UINT64",
            prop.kind
        ));
    }
    let bytes = decode_hex(&prop.data)
        .ok_or_else(|| "has an adapter LUID property that is not hex digit pairs".to_string())?;
    let array: [u8; 8] = bytes.as_slice().try_into().map_err(|_| {
        format!(
            "has an adapter LUID property of {} bytes, not 8",
            bytes.len()
        )
    })?;
    Ok(i64::from_le_bytes(array))
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Whether the pipeline looks for a device node for this adapter.
fn wants_node(adapter: &AdapterFacts) -> bool {
    adapter.is_hardware || adapter.unsupported(AdapterProperty::IsHardware)
}

/// Matches the device nodes in `facts.os.device_nodes` to the adapters. Returns the facts with
/// each matched adapter's `pnp` set (and the node's read errors added to the adapter's), and
/// one [`AdapterMatch`] per adapter in the same order. Borrows when there is nothing to match.
pub fn attach(facts: &HostFacts) -> (Cow<'_, HostFacts>, Vec<AdapterMatch>) {
    let nodes: &[PnpFacts] = facts
        .os
        .as_ref()
        .map(|os| os.device_nodes.as_slice())
        .unwrap_or_default();
    let mut taken = vec![false; nodes.len()];
    let mut found: Vec<Option<(usize, MatchedBy)>> = vec![None; facts.adapters.len()];
    let luids: Vec<Result<i64, String>> = nodes.iter().map(node_luid).collect();

    for (a, adapter) in facts.adapters.iter().enumerate() {
        if adapter.pnp.is_some() || !wants_node(adapter) {
            continue;
        }
        let hit = (0..nodes.len()).find(|&n| !taken[n] && luids[n] == Ok(adapter.luid));
        if let Some(n) = hit {
            taken[n] = true;
            found[a] = Some((n, MatchedBy::Luid));
        }
    }
    let mut ambiguous: Vec<Option<Vec<usize>>> = vec![None; facts.adapters.len()];
    for (a, adapter) in facts.adapters.iter().enumerate() {
        if adapter.pnp.is_some() || !wants_node(adapter) || found[a].is_some() {
            continue;
        }
        let Some(address) = adapter.adapter_address else {
            continue;
        };
        let at: Vec<usize> = (0..nodes.len())
            .filter(|&n| !taken[n] && nodes[n].pci == Some(address))
            .collect();
        match at.as_slice() {
            [n] => {
                taken[*n] = true;
                found[a] = Some((*n, MatchedBy::PciLocation));
            }
            [] => {}
            _ => ambiguous[a] = Some(at),
        }
    }

    let matches = facts
        .adapters
        .iter()
        .enumerate()
        .map(|(a, adapter)| {
            let why = Why {
                nodes,
                luids: &luids,
                taken: &taken,
            };
            describe(adapter, found[a], ambiguous[a].as_deref(), &why)
        })
        .collect();
    if found.iter().all(Option::is_none) {
        return (Cow::Borrowed(facts), matches);
    }
    let mut attached = facts.clone();
    for (adapter, hit) in attached.adapters.iter_mut().zip(&found) {
        if let Some((n, _)) = hit {
            let node = nodes[*n].clone();
            adapter.read_errors.extend(node.read_errors.iter().cloned());
            adapter.pnp = Some(node);
        }
    }
    (Cow::Owned(attached), matches)
}

/// The device nodes, their LUIDs (or why none) and which ones an adapter took.
struct Why<'a> {
    nodes: &'a [PnpFacts],
    luids: &'a [Result<i64, String>],
    taken: &'a [bool],
}

fn describe(
    adapter: &AdapterFacts,
    hit: Option<(usize, MatchedBy)>,
    ambiguous: Option<&[usize]>,
    why: &Why<'_>,
) -> AdapterMatch {
    let nodes = why.nodes;
    let luid = adapter.luid;
    let done = |by: MatchedBy, node: &PnpFacts, detail: String| AdapterMatch {
        luid,
        matched_by: Some(by),
        instance_id: Some(node.instance_id.clone()),
        detail,
    };
    if let Some(pnp) = &adapter.pnp {
        return done(
            MatchedBy::Recorded,
            pnp,
            format!("device node {} as recorded", pnp.instance_id),
        );
    }
    if !wants_node(adapter) {
        return AdapterMatch {
            luid,
            matched_by: None,
            instance_id: None,
            detail: "software adapter: no device node looked for".into(),
        };
    }
    let no_luid = format!("no device node reports LUID {}", crate::luid::label(luid));
    match hit {
        Some((n, MatchedBy::Luid)) => {
            let node = &nodes[n];
            done(
                MatchedBy::Luid,
                node,
                format!(
                    "device node {} by its adapter LUID property",
                    node.instance_id
                ),
            )
        }
        Some((n, by)) => {
            let node = &nodes[n];
            let at = node.pci.map(|p| p.to_string()).unwrap_or_default();
            let its = match &why.luids[n] {
                Err(reason) => reason.clone(),
                Ok(other) => format!("reports LUID {}", crate::luid::label(*other)),
            };
            done(
                by,
                node,
                format!(
                    "device node {} by PCI location {at}, because {no_luid} (this one {its})",
                    node.instance_id
                ),
            )
        }
        None => {
            let pci = match (adapter.adapter_address, ambiguous) {
                (None, _) => "the graphics kernel reported no PCI location for it".to_string(),
                (Some(at), Some(several)) => format!(
                    "device nodes {} are all at its PCI location {at}",
                    several
                        .iter()
                        .map(|&n| nodes[n].instance_id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                (Some(at), None) => format!("no free device node is at its PCI location {at}"),
            };
            // The device nodes no adapter took, and why none of them reports this LUID.
            let free: Vec<String> = (0..nodes.len())
                .filter(|&n| !why.taken[n])
                .map(|n| match &why.luids[n] {
                    Err(reason) => format!("{} {reason}", nodes[n].instance_id),
                    Ok(other) => format!(
                        "{} reports LUID {}",
                        nodes[n].instance_id,
                        crate::luid::label(*other)
                    ),
                })
                .collect();
            let free = if free.is_empty() {
                "no device node is left unmatched".to_string()
            } else {
                format!(
                    "device nodes no adapter took: {}",
                    crate::quote::bounded_prefix(&free.join("; "), 600)
                )
            };
            AdapterMatch {
                luid,
                matched_by: None,
                instance_id: None,
                detail: format!("no device node matches: {no_luid}, {pci} ({free})"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::{OsFacts, PciLocation, RawDeviceProperty};

    fn node(id: &str, luid: Option<(u32, &str)>, pci: Option<(u32, u32)>) -> PnpFacts {
        PnpFacts {
            instance_id: id.into(),
            adapter_luid: luid.map(|(kind, data)| RawDeviceProperty {
                kind,
                data: data.into(),
            }),
            pci: pci.map(|(bus, address)| PciLocation::from_bus_and_address(bus, address)),
            ..PnpFacts::default()
        }
    }

    fn adapter(luid: i64, address: Option<(u32, u32, u32)>) -> AdapterFacts {
        AdapterFacts {
            adapter_address: address.map(|(bus, device, function)| PciLocation {
                bus,
                device,
                function,
            }),
            ..AdapterFacts::minimal(luid, vec![])
        }
    }

    fn host(adapters: Vec<AdapterFacts>, nodes: Vec<PnpFacts>) -> HostFacts {
        HostFacts {
            os: Some(OsFacts {
                device_nodes: nodes,
                ..OsFacts::default()
            }),
            adapters,
            ..HostFacts::default()
        }
    }

    #[test]
    fn the_luid_property_is_a_little_endian_uint64() {
        // (property, LUID or part of the reason)
        type Case = (Option<(u32, &'static str)>, Result<i64, &'static str>);
        let table: [Case; 6] = [
            (Some((9, "f3d6000000000000")), Ok(55027)),
            (Some((9, "0500000001000000")), Ok(0x1_0000_0005)),
            (None, Err("has no adapter LUID property")),
            (
                Some((7, "f3d60000")),
                Err("type 0x7, not DEVPROP_TYPE_UINT64"),
            ),
            (Some((9, "f3d600")), Err("3 bytes, not 8")),
            (Some((9, "zz")), Err("not hex digit pairs")),
        ];
        for (prop, want) in table {
            let got = node_luid(&node("n", prop, None));
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want),
                (Err(why), Err(text)) => assert!(why.contains(text), "{why}"),
                (got, want) => panic!("{prop:?}: got {got:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn each_adapter_gets_its_node_by_luid_then_by_pci_location() {
        let facts = host(
            vec![
                adapter(55027, Some((1, 0, 0))),    // LUID property present
                adapter(70000, Some((0x3b, 0, 0))), // property absent: by PCI
                adapter(80000, Some((0x5e, 0, 1))), // property of another type: by PCI
                adapter(90000, None),               // nothing to match by
                AdapterFacts {
                    is_hardware: false,
                    ..adapter(100, None)
                },
            ],
            vec![
                node(r"PCI\C", Some((7, "80380100")), Some((0x5e, 1))),
                node(r"PCI\B", None, Some((0x3b, 0))),
                node(r"PCI\A", Some((9, "f3d6000000000000")), Some((1, 0))),
            ],
        );
        let (attached, matches) = attach(&facts);
        let ids: Vec<Option<&str>> = attached
            .adapters
            .iter()
            .map(|a| a.pnp.as_ref().map(|p| p.instance_id.as_str()))
            .collect();
        assert_eq!(
            ids,
            [Some(r"PCI\A"), Some(r"PCI\B"), Some(r"PCI\C"), None, None]
        );
        let by: Vec<Option<MatchedBy>> = matches.iter().map(|m| m.matched_by).collect();
        assert_eq!(
            by,
            [
                Some(MatchedBy::Luid),
                Some(MatchedBy::PciLocation),
                Some(MatchedBy::PciLocation),
                None,
                None
            ]
        );
        assert_eq!(
            matches[2].detail,
            r"device node PCI\C by PCI location 5e:00.1, because no device node reports LUID 0x00000000_0x00013880 (this one has the adapter LUID property with type 0x7, not DEVPROP_TYPE_UINT64)"
        );
        assert_eq!(
            matches[3].detail,
            "no device node matches: no device node reports LUID 0x00000000_0x00015F90, the graphics kernel reported no PCI location for it (no device node is left unmatched)"
        );
        assert_eq!(
            matches[4].detail,
            "software adapter: no device node looked for"
        );
    }

    #[test]
    fn a_node_taken_by_luid_is_not_matched_again_by_pci_and_two_nodes_at_one_location_match_nothing(
    ) {
        let facts = host(
            vec![
                adapter(2, Some((1, 0, 0))), // its node is taken by adapter 1 (by LUID)
                adapter(1, Some((9, 0, 0))),
                adapter(3, Some((4, 0, 0))), // two nodes at 04:00.0
            ],
            vec![
                node(r"PCI\ONE", Some((9, "0100000000000000")), Some((1, 0))),
                node(r"PCI\X", None, Some((4, 0))),
                node(r"PCI\Y", None, Some((4, 0))),
            ],
        );
        let (attached, matches) = attach(&facts);
        assert!(attached.adapters[0].pnp.is_none());
        assert_eq!(
            attached.adapters[1]
                .pnp
                .as_ref()
                .map(|p| p.instance_id.as_str()),
            Some(r"PCI\ONE")
        );
        assert!(attached.adapters[2].pnp.is_none());
        assert!(
            matches[0]
                .detail
                .contains("no free device node is at its PCI location 01:00.0"),
            "{}",
            matches[0].detail
        );
        assert!(
            matches[2]
                .detail
                .contains(r"device nodes PCI\X, PCI\Y are all at its PCI location 04:00.0"),
            "{}",
            matches[2].detail
        );
    }

    #[test]
    fn recorded_nodes_are_kept_and_node_read_errors_move_to_the_adapter() {
        let recorded = AdapterFacts {
            pnp: Some(node(r"PCI\OLD", None, None)),
            ..adapter(5, None)
        };
        let mut with_error = node(r"PCI\E", Some((9, "0600000000000000")), None);
        with_error.read_errors = vec!["CM_Get_DevNode_PropertyW(x): CR_FAILURE".into()];
        let facts = host(vec![recorded, adapter(6, None)], vec![with_error]);
        let (attached, matches) = attach(&facts);
        assert_eq!(matches[0].matched_by, Some(MatchedBy::Recorded));
        assert_eq!(
            attached.adapters[0]
                .pnp
                .as_ref()
                .map(|p| p.instance_id.as_str()),
            Some(r"PCI\OLD")
        );
        assert_eq!(
            attached.adapters[1].read_errors,
            ["CM_Get_DevNode_PropertyW(x): CR_FAILURE"]
        );
    }

    #[test]
    fn nothing_to_match_borrows() {
        let facts = host(vec![adapter(1, None)], vec![]);
        assert!(matches!(attach(&facts).0, Cow::Borrowed(_)));
    }
}
