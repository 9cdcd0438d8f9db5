//! The one vendor table: PCI vendor IDs, the names dxdp uses for them, the manufacturer names
//! Windows reports, and how a vendor given by a person is read (everywhere: configuration keys,
//! `--vendor`, the reference plugin's keys).

/// The PCI vendor ID of NVIDIA.
pub const NVIDIA: u32 = 0x10DE;
/// The PCI vendor ID of AMD.
pub const AMD: u32 = 0x1002;
/// The PCI vendor ID of Intel.
pub const INTEL: u32 = 0x8086;
/// The PCI vendor ID of Microsoft (the Basic Render Driver, virtual adapters).
pub const MICROSOFT: u32 = 0x1414;
/// The PCI vendor ID of Qualcomm.
pub const QUALCOMM: u32 = 0x5143;

/// dxdp's vendor names and their PCI vendor IDs.
pub const NAMES: [(&str, u32); 5] = [
    ("nvidia", NVIDIA),
    ("amd", AMD),
    ("intel", INTEL),
    ("microsoft", MICROSOFT),
    ("qualcomm", QUALCOMM),
];

/// Device-node `Manufacturer` strings as Windows reports them for display adapters (the
/// reference plugin's vendor keys, lowercased there), with their PCI vendor IDs.
pub const MANUFACTURERS: [(&str, u32); 8] = [
    ("NVIDIA", NVIDIA),
    ("NVIDIA Corporation", NVIDIA),
    ("Advanced Micro Devices, Inc.", AMD),
    ("ATI Technologies Inc.", AMD),
    ("Intel Corporation", INTEL),
    ("Intel", INTEL),
    ("Microsoft", MICROSOFT),
    ("Qualcomm Technologies, Inc.", QUALCOMM),
];

/// dxdp's name for a PCI vendor ID: `nvidia`, …, else `pci-xxxx` (four lower-case hex digits).
pub fn name(vendor_id: u32) -> String {
    NAMES
        .iter()
        .find(|(_, id)| *id == vendor_id)
        .map(|(n, _)| n.to_string())
        .unwrap_or_else(|| format!("pci-{vendor_id:04x}"))
}

/// Reads a vendor as a person writes it, case-insensitively: a dxdp name (`nvidia`), a
/// manufacturer as Windows reports it (`Advanced Micro Devices, Inc.`), `pci-XXXX`, or a hex PCI
/// vendor ID with or without `0x` (`0x10DE`, `10de`). `None` for anything else.
pub fn parse(text: &str) -> Option<u32> {
    let t = text.trim();
    if let Some(&(_, id)) = NAMES
        .iter()
        .chain(MANUFACTURERS.iter())
        .find(|(n, _)| n.eq_ignore_ascii_case(t))
    {
        return Some(id);
    }
    let lower = t.to_ascii_lowercase();
    let hex = lower
        .strip_prefix("pci-")
        .or_else(|| lower.strip_prefix("0x"))
        .unwrap_or(&lower);
    if hex.is_empty() || hex.len() > 4 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_vendor_reads_the_same() {
        let table = [
            ("nvidia", Some(0x10DE)),
            ("NVIDIA", Some(0x10DE)),
            ("NVIDIA Corporation", Some(0x10DE)),
            ("advanced micro devices, inc.", Some(0x1002)),
            ("0x10DE", Some(0x10DE)),
            ("10de", Some(0x10DE)),
            ("pci-10de", Some(0x10DE)),
            ("PCI-1AB8", Some(0x1AB8)),
            ("  intel ", Some(0x8086)),
            ("0x", None),
            ("0x10DE0", None),
            ("nvidia-ish", None),
            ("", None),
        ];
        for (text, want) in table {
            assert_eq!(parse(text), want, "{text:?}");
        }
    }

    #[test]
    fn names_of_vendor_ids() {
        assert_eq!(name(0x10DE), "nvidia");
        assert_eq!(name(0x5143), "qualcomm");
        assert_eq!(name(0x1AB8), "pci-1ab8");
    }
}
