//! GPU families (architectures) by PCI vendor and device ID: the built-in table behind the
//! `family` labels, which `nodeLabels.families` extends or overrides.
//!
//! Every entry names its public source: the PCI ID Repository's page for the ID
//! (<https://pci-ids.ucw.cz>, the database `lspci` and Windows tools read), which gives the chip
//! (e.g. `TU104GL`); the chip's architecture is the vendor's: NVIDIA's architecture names
//! (Maxwell GMxxx, Pascal GPxxx, Volta GVxxx, Turing TUxxx, Ampere GAxxx, Ada Lovelace ADxxx,
//! Hopper GHxxx: <https://www.nvidia.com/en-us/technologies/>), AMD's (RDNA Navi 1x, RDNA 2
//! Navi 2x, RDNA 3 Navi 3x, CDNA Arcturus, CDNA 2 Aldebaran, CDNA 3 Aqua Vanjaram:
//! <https://www.amd.com/en/technologies/rdna.html>, <https://www.amd.com/en/technologies/cdna.html>)
//! and Intel's (Xe-HPG DG2 / Arctic Sound-M, Xe-HPC Ponte Vecchio:
//! <https://www.intel.com/content/www/us/en/products/docs/discrete-gpus/arc/technology/xe-hpg.html>).
//! The values follow GPU Feature Discovery's `gpu.family` where it has one (`turing`,
//! `ampere`, `hopper`, ...), in lower case.

use std::collections::BTreeMap;

/// A PCI vendor and device ID.
pub type ModelId = (u32, u32);

/// The built-in table: (vendor ID, device ID, family). The comment after each entry is its
/// source: the PCI ID Repository's name for it.
pub const BUILTIN: &[(u32, u32, &str)] = &[
    // NVIDIA (vendor 10de, https://pci-ids.ucw.cz/read/PC/10de).
    (0x10de, 0x13f2, "maxwell"),      // 13f2: GM204GL [Tesla M60]
    (0x10de, 0x15f8, "pascal"),       // 15f8: GP100GL [Tesla P100 PCIe 16GB]
    (0x10de, 0x1b38, "pascal"),       // 1b38: GP102GL [Tesla P40]
    (0x10de, 0x1bb3, "pascal"),       // 1bb3: GP104GL [Tesla P4]
    (0x10de, 0x1db1, "volta"),        // 1db1: GV100GL [Tesla V100 SXM2 16GB]
    (0x10de, 0x1db4, "volta"),        // 1db4: GV100GL [Tesla V100 PCIe 16GB]
    (0x10de, 0x1db6, "volta"),        // 1db6: GV100GL [Tesla V100 PCIe 32GB]
    (0x10de, 0x1eb8, "turing"),       // 1eb8: TU104GL [Tesla T4]
    (0x10de, 0x1e30, "turing"),       // 1e30: TU102GL [Quadro RTX 6000/8000]
    (0x10de, 0x20b0, "ampere"),       // 20b0: GA100 [A100 SXM4 40GB]
    (0x10de, 0x20b2, "ampere"),       // 20b2: GA100 [A100 SXM4 80GB]
    (0x10de, 0x20b5, "ampere"),       // 20b5: GA100 [A100 PCIe 80GB]
    (0x10de, 0x20f1, "ampere"),       // 20f1: GA100 [A100 PCIe 40GB]
    (0x10de, 0x2204, "ampere"),       // 2204: GA102 [GeForce RTX 3090]
    (0x10de, 0x2230, "ampere"),       // 2230: GA102GL [RTX A6000]
    (0x10de, 0x2231, "ampere"),       // 2231: GA102GL [RTX A5000]
    (0x10de, 0x2235, "ampere"),       // 2235: GA102GL [A40]
    (0x10de, 0x2236, "ampere"),       // 2236: GA102GL [A10]
    (0x10de, 0x25b6, "ampere"),       // 25b6: GA107GL [A2 / A16]
    (0x10de, 0x2330, "hopper"),       // 2330: GH100 [H100 SXM5 80GB]
    (0x10de, 0x2331, "hopper"),       // 2331: GH100 [H100 PCIe]
    (0x10de, 0x2684, "ada-lovelace"), // 2684: AD102 [GeForce RTX 4090]
    (0x10de, 0x26b1, "ada-lovelace"), // 26b1: AD102GL [RTX 6000 Ada Generation]
    (0x10de, 0x26b5, "ada-lovelace"), // 26b5: AD102GL [L40]
    (0x10de, 0x26b9, "ada-lovelace"), // 26b9: AD102GL [L40S]
    (0x10de, 0x27b8, "ada-lovelace"), // 27b8: AD104GL [L4]
    // AMD (vendor 1002, https://pci-ids.ucw.cz/read/PC/1002).
    (0x1002, 0x7362, "rdna"),  // 7362: Navi 12 [Radeon Pro V520/V540]
    (0x1002, 0x73a1, "rdna2"), // 73a1: Navi 21 [Radeon Pro V620]
    (0x1002, 0x73bf, "rdna2"), // 73bf: Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]
    (0x1002, 0x7448, "rdna3"), // 7448: Navi 31 [Radeon Pro W7900]
    (0x1002, 0x744c, "rdna3"), // 744c: Navi 31 [Radeon RX 7900 XT/7900 XTX]
    (0x1002, 0x738c, "cdna"),  // 738c: Arcturus GL-XL [Instinct MI100]
    (0x1002, 0x740c, "cdna2"), // 740c: Aldebaran/MI200 [Instinct MI250X/MI250]
    (0x1002, 0x740f, "cdna2"), // 740f: Aldebaran/MI200 [Instinct MI210]
    (0x1002, 0x74a1, "cdna3"), // 74a1: Aqua Vanjaram [Instinct MI300X]
    // Intel (vendor 8086, https://pci-ids.ucw.cz/read/PC/8086).
    (0x8086, 0x56a0, "xe-hpg"), // 56a0: DG2 [Arc A770]
    (0x8086, 0x56a5, "xe-hpg"), // 56a5: DG2 [Arc A380]
    (0x8086, 0x56c0, "xe-hpg"), // 56c0: ATS-M [Data Center GPU Flex 170]
    (0x8086, 0x56c1, "xe-hpg"), // 56c1: ATS-M [Data Center GPU Flex 140]
    (0x8086, 0x0bd5, "xe-hpc"), // 0bd5: Ponte Vecchio XT [Data Center GPU Max 1550]
    (0x8086, 0x0bda, "xe-hpc"), // 0bda: Ponte Vecchio XT [Data Center GPU Max 1100]
];

/// The family of `model`: the user's table first (`nodeLabels.families`), then the built-in
/// one; `None` when neither knows it (the `family` labels are then absent).
pub fn family(user: &BTreeMap<ModelId, String>, model: ModelId) -> Option<&str> {
    if let Some(f) = user.get(&model) {
        return Some(f.as_str());
    }
    BUILTIN
        .iter()
        .find(|(v, d, _)| (*v, *d) == model)
        .map(|(_, _, f)| *f)
}

/// Parses a model ID as the configuration writes it: `<vendor>:<device>` in hexadecimal
/// (`10de:2236`, an optional `0x` on each), as `lspci -n` prints them.
pub fn parse_model_id(text: &str) -> Result<ModelId, String> {
    let hex = |s: &str| {
        let s = s.trim();
        let digits = s
            .strip_prefix("0x")
            .or_else(|| s.strip_prefix("0X"))
            .unwrap_or(s);
        (!digits.is_empty() && digits.len() <= 4)
            .then(|| u32::from_str_radix(digits, 16).ok())
            .flatten()
    };
    let parsed = text
        .split_once(':')
        .and_then(|(v, d)| Some((hex(v)?, hex(d)?)));
    parsed.ok_or_else(|| {
        format!("{text:?} is not a PCI model ID: write <vendor>:<device> in hexadecimal, e.g. 10de:2236 (lspci -n shows them; Windows: the VEN_ and DEV_ of the device's hardware ID)")
    })
}

/// `model` as it appears in label keys: `<vendor>-<device>`, four lower-case hex digits each
/// (`10de-2236`).
pub fn model_key(model: ModelId) -> String {
    format!("{:04x}-{:04x}", model.0 & 0xffff, model.1 & 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_table_comes_first_and_unknown_models_have_no_family() {
        let user: BTreeMap<ModelId, String> = [((0x10de, 0x1eb8), "my-turing".to_string())]
            .into_iter()
            .collect();
        assert_eq!(family(&user, (0x10de, 0x1eb8)), Some("my-turing"));
        assert_eq!(family(&user, (0x10de, 0x2236)), Some("ampere"));
        assert_eq!(family(&user, (0x1002, 0x74a1)), Some("cdna3"));
        assert_eq!(family(&user, (0x8086, 0x56a5)), Some("xe-hpg"));
        assert_eq!(family(&user, (0x1414, 0x008c)), None);
    }

    #[test]
    fn the_built_in_table_has_each_model_once_with_a_valid_label_value() {
        let mut seen = std::collections::BTreeSet::new();
        for (v, d, f) in BUILTIN {
            assert!(seen.insert((*v, *d)), "{v:04x}:{d:04x} twice");
            assert!(crate::labels::is_label_value(f) && !f.is_empty(), "{f}");
        }
    }

    #[test]
    fn model_ids_parse_as_lspci_writes_them() {
        assert_eq!(parse_model_id("10de:2236"), Ok((0x10de, 0x2236)));
        assert_eq!(parse_model_id("0x1002:0x74A1"), Ok((0x1002, 0x74a1)));
        for bad in [
            "",
            "10de",
            "10de:",
            ":2236",
            "10de:22366",
            "xyz:1",
            "10de-2236",
        ] {
            assert!(parse_model_id(bad).is_err(), "{bad}");
        }
        assert_eq!(model_key((0x10de, 0x2236)), "10de-2236");
        assert_eq!(model_key((0x8086, 0xbd5)), "8086-0bd5");
    }
}
