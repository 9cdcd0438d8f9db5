//! `scripts/field-compare.py` on a recorded field bundle (`tests/field-bundle/`: dxdp's snapshot
//! and discovery of the `adapter-match` fixture host with driver keys, driver store paths and
//! `CopyToVm*` values added, and the ground truth Windows would give for it, in the encodings
//! Windows writes: UTF-16 `reg export`s, BOMs, CRLF). One fact per comparison is deliberately
//! different: a location path, a driver store folder (`driver-packages.json`), the data of one
//! `CopyToVm*` value, and the graphics kernel's address of adapter 3001 (bus 0x18, its device
//! node 0x17). The expected lines are written from the bundle by hand.

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
fn the_comparison_finds_each_deliberate_difference_and_nothing_else() {
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
            r"MISMATCH  adapter 3001: D3DKMT adapter address 18:00.0, but PCI\VEN_10DE&DEV_2236&SUBSYS_148210DE&REV_A1\4&2B8AAE0E&0&0010 (its LUID property) is at 17:00.0: the match by PCI location would be wrong on this host",
            r"MISMATCH  device pciroot-1-pci-0100-pci-0000-7e09f5206759ac36: driver store directory: dxdp 'C:\\Windows\\System32\\DriverStore\\FileRepository\\nvgridsw_azure.inf_amd64_0c5d2b3a4f6e7d81', Windows 'C:\\Windows\\System32\\DriverStore\\FileRepository\\nvgridsw_azure.inf_amd64_5e1f9a0c7b3d2e64' (the folder of oem12.inf)",
            r"MISMATCH  HKLM\SYSTEM\CURRENTCONTROLSET\CONTROL\CLASS\{4D36E968-E325-11CE-BFC1-08002BE10318}\0003\COPYTOVMOVERWRITE: value 'nvml' (type, data): dxdp ('REG_MULTI_SZ', ['nvml_loader.dll', 'nvml64.dll']), Windows ('REG_MULTI_SZ', ['nvml_loader.dll', 'nvml.dll'])",
        ],
        "{text}"
    );
    for line in [
        r"ok        PCI\VEN_10DE&DEV_2236&SUBSYS_148210DE&REV_A1\4&2B8AAE0E&0&0010: adapter LUID value: 3001",
        r"ok        PCI\VEN_10DE&DEV_20B5&SUBSYS_153310DE&REV_A1\4&3A21D0B9&0&0010: adapter LUID property type: 8",
        r"ok        PCI\VEN_10DE&DEV_2236&SUBSYS_148210DE&REV_A1\4&9E1D44C1&0&0010: problem code: 22",
        "note      nvidia-smi GPU at af:00.0 is not a dxdp device (excluded? see discover.txt)",
        // The PCI-location assumption where a LUID property ties the adapter to its node, and
        // where nothing does.
        r"ok        adapter 3003: D3DKMT adapter address 5e:00.0 = bus number and address of PCI\VEN_10DE&DEV_20B5&SUBSYS_153310DE&REV_A1\4&3A21D0B9&0&0010 (its LUID property)",
        r"note      adapter 3002: D3DKMT adapter address 3b:00.0: PCI\VEN_10DE&DEV_2236&SUBSYS_148210DE&REV_A1\4&1F0C3A58&0&0010 is there; no LUID property confirms it is this adapter's",
        "note      adapter 3004: D3DKMT adapter address af:00.0: Windows lists no display or compute device node there",
        // The driver store folder, from SetupGetInfDriverStoreLocationW's INF path.
        r"ok        device pciroot-0-pci-0300-pci-0000-4a1450fd9e47b7a5: driver store directory: 'C:\\Windows\\System32\\DriverStore\\FileRepository\\nvgridsw_azure.inf_amd64_0c5d2b3a4f6e7d81'",
        // CopyToVm* data from a UTF-16 reg export: a hex(7) multi-string over three lines, and a
        // REG_SZ with an escaped backslash.
        r"ok        HKLM\SYSTEM\CURRENTCONTROLSET\CONTROL\CLASS\{4D36E968-E325-11CE-BFC1-08002BE10318}\0001\COPYTOVMOVERWRITE: value 'nvcuda' (type, data): ('REG_MULTI_SZ', ['nvcuda_loader64.dll', 'nvcuda.dll'])",
        r"ok        HKLM\SYSTEM\CURRENTCONTROLSET\CONTROL\CLASS\{4D36E968-E325-11CE-BFC1-08002BE10318}\0002\COPYTOVMWHENNEWER: value 'vulkan' (type, data): ('REG_SZ', 'vulkan\\nv-vk64.json')",
        // The disabled card's keys: dxdp reads only the driver keys of matched device nodes.
        r"note      HKLM\SYSTEM\CURRENTCONTROLSET\CONTROL\CLASS\{4D36E968-E325-11CE-BFC1-08002BE10318}\0004\COPYTOVMOVERWRITE: in ground-truth/driver-key--4d36e968-e325-11ce-bfc1-08002be10318-0004.reg; dxdp did not read it (its device node serves no adapter)",
        "54 checks, 5 mismatches",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
}
