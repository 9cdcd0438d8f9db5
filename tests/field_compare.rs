//! `scripts/field-compare.py` on a recorded field bundle (`tests/field-bundle/`: dxdp's snapshot
//! and discovery of the `adapter-match` fixture host, and the ground truth Windows would give for
//! it, with one location path deliberately different). The expected lines are written from the
//! bundle by hand.

use std::process::Command;

/// The Python interpreter, if there is one (`python3` on Linux, often `python` on Windows).
fn python() -> Option<&'static str> {
    ["python3", "python"].into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn the_comparison_finds_the_one_different_location_path_and_nothing_else() {
    let Some(python) = python() else {
        eprintln!("skipped: no Python interpreter (python3 or python) on PATH");
        return;
    };
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(python)
        .arg(format!("{root}/scripts/field-compare.py"))
        .arg(format!("{root}/tests/field-bundle"))
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "mismatches exit 1:\n{text}");
    let mismatches: Vec<&str> = text.lines().filter(|l| l.starts_with("MISMATCH")).collect();
    assert_eq!(
        mismatches,
        [
            r"MISMATCH  PCI\VEN_10DE&DEV_20B5&SUBSYS_153310DE&REV_A1\4&3A21D0B9&0&0010: location paths: dxdp ['PCIROOT(2)#PCI(0100)#PCI(0000)'], Windows ['PCIROOT(2)#PCI(0200)#PCI(0000)']",
            "MISMATCH  device pciroot-2-pci-0100-pci-0000-36e6d35d1e65de85: location path (the first of the device node's): dxdp 'PCIROOT(2)#PCI(0100)#PCI(0000)', Windows 'PCIROOT(2)#PCI(0200)#PCI(0000)'",
        ],
        "{text}"
    );
    for line in [
        r"ok        PCI\VEN_10DE&DEV_2236&SUBSYS_148210DE&REV_A1\4&2B8AAE0E&0&0010: adapter LUID value: 3001",
        r"ok        PCI\VEN_10DE&DEV_20B5&SUBSYS_153310DE&REV_A1\4&3A21D0B9&0&0010: adapter LUID property type: 8",
        r"ok        PCI\VEN_10DE&DEV_2236&SUBSYS_148210DE&REV_A1\4&9E1D44C1&0&0010: problem code: 22",
        "note      nvidia-smi GPU at af:00.0 is not a dxdp device (excluded? see discover.txt)",
        "32 checks, 2 mismatches",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
}
