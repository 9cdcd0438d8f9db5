#!/usr/bin/env python3
"""Compares what dxdp recorded in a field bundle with what Windows itself said.

Usage: python3 scripts/field-compare.py BUNDLE   (the dxdp-field-* folder or its .zip)

scripts/field-check.ps1 writes, next to dxdp's own outputs (snapshot.json, discover-json.txt),
the ground truth gathered with stock cmdlets and tools (ground-truth/pnp-devices.json from
Get-PnpDevice and Get-PnpDeviceProperty, ground-truth/driver-key-*.reg from reg export,
ground-truth/driver-packages.json from SetupGetInfDriverStoreLocationW, ground-truth/nvidia-smi.txt).
Beyond the device nodes it checks what the container mounts depend on: each device's driver store
directory, the data of every CopyToVm* registry value, and the assumption behind dxdp's match by
PCI location (the graphics kernel's adapter address is the device node's bus number and
address). This script checks each dxdp fact against it and prints one line per
check: "ok", "MISMATCH" (dxdp and Windows disagree: a dxdp bug, or a device that changed between
the two reads) or "note" (worth knowing, not wrong). Exit status: 0 without mismatches, 1 with,
2 when the bundle cannot be read. Standard library only; Python 3.8 or later.
"""

import io
import json
import re
import sys
import zipfile
from pathlib import Path

LUID_KEY = "{60B193CB-5276-4D0F-96FC-F173ABAD3EC6} 2"
# Get-PnpDeviceProperty's type names and their DEVPROPTYPE numbers (devpropdef.h).
DEVPROP_TYPES = {
    "Int32": 0x5,
    "UInt32": 0x7,
    "Int64": 0x8,
    "UInt64": 0x9,
    "Guid": 0xD,
    "Boolean": 0x11,
    "String": 0x12,
    "Binary": 0x1003,
    "StringList": 0x2012,
}
NVIDIA = 0x10DE


class Bundle:
    """The files of a bundle folder or .zip, by relative path."""

    def __init__(self, path):
        self.path = Path(path)
        self.files = {}
        if self.path.is_dir():
            for f in self.path.rglob("*"):
                if f.is_file():
                    rel = f.relative_to(self.path).as_posix()
                    self.files[rel.lower()] = f.read_bytes()
        else:
            with zipfile.ZipFile(self.path) as z:
                for name in z.namelist():
                    if not name.endswith("/"):
                        self.files[name.replace("\\", "/").lower()] = z.read(name)

    def text(self, rel):
        data = self.files.get(rel.lower())
        if data is None:
            return None
        if data.startswith(b"\xff\xfe") or data.startswith(b"\xfe\xff"):
            return data.decode("utf-16")
        return data.decode("utf-8-sig", errors="replace")

    def json(self, rel):
        text = self.text(rel)
        return None if text is None or not text.strip() else json.loads(text)

    def names(self, pattern):
        return sorted(n for n in self.files if re.fullmatch(pattern, n))


class Report:
    def __init__(self):
        self.lines = []
        self.mismatches = 0

    def ok(self, what):
        self.lines.append(f"ok        {what}")

    def mismatch(self, what):
        self.mismatches += 1
        self.lines.append(f"MISMATCH  {what}")

    def note(self, what):
        self.lines.append(f"note      {what}")

    def same(self, what, dxdp, windows):
        if dxdp == windows:
            self.ok(f"{what}: {dxdp!r}")
        else:
            self.mismatch(f"{what}: dxdp {dxdp!r}, Windows {windows!r}")


def prop(device, key):
    return (device.get("properties") or {}).get(key)


def luid_from_hex(data):
    raw = bytes.fromhex(data)
    return int.from_bytes(raw, "little") if len(raw) == 8 else None


def compare_luid(report, iid, node, truth):
    """The adapter LUID property: type and value, or absent on both sides."""
    recorded = node.get("adapterLuid")
    if truth is None and recorded is None:
        report.ok(f"{iid}: no adapter LUID property (dxdp matches it by PCI location)")
        return
    if truth is None or recorded is None:
        report.mismatch(
            f"{iid}: adapter LUID property: dxdp {recorded!r}, Windows {truth!r}"
        )
        return
    kind = DEVPROP_TYPES.get(truth.get("type"))
    report.same(f"{iid}: adapter LUID property type", recorded.get("type"), kind)
    if kind == 0x9 and recorded.get("type") == 0x9:
        report.same(
            f"{iid}: adapter LUID value",
            luid_from_hex(recorded.get("data", "")),
            truth.get("data"),
        )


def compare_nodes(report, snapshot, devices):
    nodes = list(snapshot.get("deviceNodes") or [])
    nodes += [a["pnp"] for a in snapshot.get("adapters") or [] if a.get("pnp")]
    by_id = {n["instanceId"].lower(): n for n in nodes}
    for device in devices:
        iid = device["instanceId"]
        node = by_id.pop(iid.lower(), None)
        if node is None:
            report.mismatch(f"{iid}: Windows lists this {device.get('class')} device, dxdp recorded no device node for it")
            continue
        paths = prop(device, "DEVPKEY_Device_LocationPaths")
        truth_paths = list((paths or {}).get("data") or [])
        if isinstance(truth_paths, str):
            truth_paths = [truth_paths]
        report.same(f"{iid}: location paths", node.get("locationPaths") or [], truth_paths)
        driver = (prop(device, "DEVPKEY_Device_Driver") or {}).get("data")
        report.same(
            f"{iid}: driver key",
            (node.get("driverKey") or "").lower(),
            (driver or "").lower(),
        )
        bus = (prop(device, "DEVPKEY_Device_BusNumber") or {}).get("data")
        address = (prop(device, "DEVPKEY_Device_Address") or {}).get("data")
        if iid.upper().startswith("PCI\\") and bus is not None and address is not None:
            # Address 0xFFFFFFFF (or -1 as an Int32) means "no address": no PCI location.
            report.same(f"{iid}: PCI location", node.get("pci"), pci_of(device))
        problem = (prop(device, "DEVPKEY_Device_ProblemCode") or {}).get("data") or 0
        report.same(f"{iid}: problem code", node.get("problemCode", 0), problem)
        status = (prop(device, "DEVPKEY_Device_DevNodeStatus") or {}).get("data")
        if status is not None and node.get("statusFlags") is not None:
            report.same(f"{iid}: DN_* status flags", node.get("statusFlags"), status)
        compare_luid(report, iid, node, prop(device, LUID_KEY))
    for node in by_id.values():
        report.mismatch(f"{node['instanceId']}: dxdp recorded this device node, Windows did not list it")


def compare_discovery(report, discovery, devices):
    truth = {d["instanceId"].lower(): d for d in devices}
    for device in discovery.get("devices") or []:
        iid = device.get("instanceId", "")
        windows = truth.get(iid.lower())
        if windows is None:
            report.mismatch(f"device {device.get('id')}: its device node {iid} is not among Windows' display and compute devices")
            continue
        paths = (prop(windows, "DEVPKEY_Device_LocationPaths") or {}).get("data") or []
        if isinstance(paths, str):
            paths = [paths]
        report.same(
            f"device {device.get('id')}: location path (the first of the device node's)",
            device.get("locationPath"),
            paths[0] if paths else None,
        )


def nvidia_smi_locations(text):
    """(bus, device, function) of each GPU in `nvidia-smi --query-gpu=...,pci.bus_id --format=csv`."""
    out = []
    for line in text.splitlines():
        m = re.search(r"\b(?:[0-9A-Fa-f]{4,8}:)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])\b", line)
        if m:
            out.append(tuple(int(g, 16) for g in m.groups()))
    return out


def compare_nvidia_smi(report, discovery, text):
    dxdp = {
        (d["pci"]["bus"], d["pci"]["device"], d["pci"]["function"]): d["id"]
        for d in discovery.get("devices") or []
        if d.get("vendorId") == NVIDIA and d.get("pci")
    }
    gpus = nvidia_smi_locations(text)
    for loc in gpus:
        where = "%02x:%02x.%x" % loc
        if loc in dxdp:
            report.ok(f"nvidia-smi GPU at {where} is dxdp device {dxdp[loc]}")
        else:
            report.note(f"nvidia-smi GPU at {where} is not a dxdp device (excluded? see discover.txt)")
    for loc, dev in dxdp.items():
        if loc not in gpus:
            report.mismatch("dxdp NVIDIA device %s at %02x:%02x.%x is not in nvidia-smi's list" % ((dev,) + loc))


REG_TYPES = {
    "0": "REG_NONE",
    "1": "REG_SZ",
    "2": "REG_EXPAND_SZ",
    "3": "REG_BINARY",
    "4": "REG_DWORD",
    "5": "REG_DWORD_BIG_ENDIAN",
    "6": "REG_LINK",
    "7": "REG_MULTI_SZ",
    "8": "REG_RESOURCE_LIST",
    "9": "REG_FULL_RESOURCE_DESCRIPTOR",
    "a": "REG_RESOURCE_REQUIREMENTS_LIST",
    "b": "REG_QWORD",
}


def utf16_strings(raw):
    """The strings of REG_MULTI_SZ bytes: up to the empty string that ends the list."""
    out = []
    for part in raw.decode("utf-16-le", errors="replace").split("\0"):
        if part == "":
            break
        out.append(part)
    return out


def reg_data(kind, raw):
    """(type name, data) of a value in the form dxdp's snapshot records it."""
    name = REG_TYPES.get(kind, "REG_BINARY")
    if name in ("REG_SZ", "REG_EXPAND_SZ", "REG_LINK"):
        return name, raw.decode("utf-16-le", errors="replace").split("\0")[0]
    if name == "REG_MULTI_SZ":
        return name, utf16_strings(raw)
    if name in ("REG_DWORD", "REG_DWORD_BIG_ENDIAN") and len(raw) == 4:
        return name, int.from_bytes(raw, "little" if name == "REG_DWORD" else "big")
    if name == "REG_QWORD" and len(raw) == 8:
        return name, int.from_bytes(raw, "little")
    return name, raw.hex()


def reg_string(text):
    """The text of a quoted .reg string (without its quotes): \\ and \" unescaped."""
    return re.sub(r'\\(.)', r"\1", text)


def reg_values(text):
    """{key (upper case, HKLM\\...): {value name: (type name, data)}} of a reg export."""
    keys = {}
    current = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        # A value's hex data continues on the next lines after a trailing backslash.
        while line.endswith("\\") and i < len(lines) and not line.startswith("["):
            line = line[:-1] + lines[i].strip()
            i += 1
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].replace("HKEY_LOCAL_MACHINE", "HKLM", 1).upper()
            keys.setdefault(current, {})
            continue
        if current is None:
            continue
        m = re.match(r'^(@|"((?:[^"\\]|\\.)*)")=(.*)$', line)
        if not m:
            continue
        name = "" if m.group(1) == "@" else reg_string(m.group(2))
        value = m.group(3)
        if value.startswith('"') and value.endswith('"'):
            keys[current][name] = ("REG_SZ", reg_string(value[1:-1]))
        elif value.startswith("dword:"):
            keys[current][name] = ("REG_DWORD", int(value[6:], 16))
        else:
            h = re.match(r"^hex(?:\(([0-9a-fA-F]+)\))?:(.*)$", value)
            if h:
                raw = bytes(int(b, 16) for b in h.group(2).replace(" ", "").split(",") if b)
                keys[current][name] = reg_data((h.group(1) or "3").lower(), raw)
    return keys


def driver_key_of(key):
    """The driver key (`{class}\\NNNN`, upper case) of a CopyToVm* key path, else None."""
    m = re.search(r"\\CLASS\\(\{[^}]+\}\\[^\\]+)\\COPYTOVM[^\\]*$", key.upper())
    return m.group(1) if m else None


def compare_registry(report, snapshot, discovery, exports):
    """The data of every CopyToVm* value under the driver keys dxdp read, against reg export."""
    recorded = {
        k["key"].upper(): {v.get("name", ""): (v.get("type"), v.get("data")) for v in k.get("values") or []}
        for k in snapshot.get("registry") or []
    }
    # dxdp reads the CopyToVm* keys of the device nodes it matched to an adapter only.
    used = {(d.get("driverKey") or "").upper() for d in (discovery or {}).get("devices") or []}
    used |= {driver_key_of(k) for k in recorded}
    used.discard("")
    used.discard(None)
    exported = {}
    for name, text in exports:
        for key, values in reg_values(text).items():
            if driver_key_of(key):
                exported[key] = (name, values)
    for key in sorted(exported):
        name, values = exported[key]
        if key not in recorded:
            if driver_key_of(key) in used:
                report.mismatch(f"{key}: in {name}, not in dxdp's snapshot")
            else:
                report.note(f"{key}: in {name}; dxdp did not read it (its device node serves no adapter)")
            continue
        mine = recorded[key]
        for value in sorted(set(mine) | set(values)):
            report.same(f"{key}: value {value!r} (type, data)", mine.get(value), values.get(value))
    exported_drivers = {driver_key_of(k) for k in exported} | {
        "\\".join(k.split("\\")[-2:]).upper() for n, t in exports for k in reg_values(t)
    }
    for key in sorted(set(recorded) - set(exported)):
        if driver_key_of(key) in exported_drivers:
            report.mismatch(f"{key}: in dxdp's snapshot, not in Windows' export of its driver key")
        else:
            report.note(f"{key}: in dxdp's snapshot; its driver key was not exported")


def norm_path(path):
    return (path or "").replace("/", "\\").rstrip("\\").lower()


def compare_driver_store(report, discovery, packages):
    """Each device's driver store directory against the folder of its driver package's INF in
    the driver store, as SetupGetInfDriverStoreLocationW reports it."""
    truth = {}
    for p in packages or []:
        truth[(p.get("instanceId") or "").lower()] = p
    for device in discovery.get("devices") or []:
        what = f"device {device.get('id')}: driver store directory"
        package = truth.get((device.get("instanceId") or "").lower())
        inf = (package or {}).get("driverStoreInf")
        if not inf:
            why = (package or {}).get("error") or "no driver package recorded for its device node"
            report.note(f"{what}: Windows' side unknown ({why})")
            continue
        windows = inf.replace("/", "\\").rsplit("\\", 1)[0]
        dxdp = device.get("driverStorePath")
        if norm_path(dxdp) == norm_path(windows):
            report.ok(f"{what}: {dxdp!r}")
        else:
            report.mismatch(f"{what}: dxdp {dxdp!r}, Windows {windows!r} (the folder of {package.get('infPath')})")


def luid_of(prop_value):
    """The LUID a device node's LUID property holds, as Windows reports it (any integer type)."""
    data = (prop_value or {}).get("data")
    return data if isinstance(data, int) else None


def pci_of(device):
    bus = (prop(device, "DEVPKEY_Device_BusNumber") or {}).get("data")
    address = (prop(device, "DEVPKEY_Device_Address") or {}).get("data")
    if not isinstance(bus, int) or not isinstance(address, int) or address in (-1, 0xFFFFFFFF):
        return None
    address &= 0xFFFFFFFF
    return {"bus": bus, "device": address >> 16, "function": address & 0xFFFF}


def show(loc):
    return "%02x:%02x.%x" % (loc["bus"], loc["device"], loc["function"])


def compare_pci_assumption(report, snapshot, devices):
    """dxdp matches an adapter without a LUID property to the device node at its PCI location,
    assuming the graphics kernel's adapter address (D3DKMT) is the device node's bus number and
    address. Where Windows ties an adapter to its device node by the LUID property, both must
    agree; elsewhere the match rests on the assumption alone."""
    pci_devices = [d for d in devices if d["instanceId"].upper().startswith("PCI\\")]
    by_luid = {}
    for d in pci_devices:
        luid = luid_of(prop(d, LUID_KEY))
        if luid is not None:
            by_luid[luid] = d
    for adapter in snapshot.get("adapters") or []:
        address = adapter.get("adapterAddress")
        if not address:
            continue
        what = f"adapter {adapter.get('luid')}: D3DKMT adapter address {show(address)}"
        node = by_luid.get(adapter.get("luid"))
        if node is not None:
            truth = pci_of(node)
            if truth == address:
                report.ok(f"{what} = bus number and address of {node['instanceId']} (its LUID property)")
            else:
                where = show(truth) if truth else "none"
                report.mismatch(
                    f"{what}, but {node['instanceId']} (its LUID property) is at {where}: "
                    "the match by PCI location would be wrong on this host"
                )
            continue
        at = [d for d in pci_devices if pci_of(d) == address]
        if len(at) == 1:
            report.note(f"{what}: {at[0]['instanceId']} is there; no LUID property confirms it is this adapter's")
        elif not at:
            report.note(f"{what}: Windows lists no display or compute device node there")
        else:
            names = ", ".join(d["instanceId"] for d in at)
            report.mismatch(f"{what}: {len(at)} device nodes are there ({names}); the match by PCI location is ambiguous")


def compare(bundle):
    report = Report()
    snapshot = bundle.json("snapshot.json")
    devices = bundle.json("ground-truth/pnp-devices.json")
    if snapshot is None or devices is None:
        raise ValueError("the bundle has no snapshot.json or ground-truth/pnp-devices.json (made by an older field-check.ps1?)")
    if isinstance(devices, dict):  # one device: PowerShell 5.1 may write a bare object
        devices = [devices]
    compare_nodes(report, snapshot, devices)
    discovery = bundle.json("discover-json.txt")
    if discovery is None:
        report.note("no discover-json.txt: devices not compared")
    else:
        compare_discovery(report, discovery, devices)
        smi = bundle.text("ground-truth/nvidia-smi.txt")
        if smi:
            compare_nvidia_smi(report, discovery, smi)
    compare_pci_assumption(report, snapshot, devices)
    packages = bundle.json("ground-truth/driver-packages.json")
    if isinstance(packages, dict):
        packages = [packages]
    if discovery is not None:
        if packages is None:
            report.note("no ground-truth/driver-packages.json: driver store directories not compared")
        else:
            compare_driver_store(report, discovery, packages)
    exports = [(n, bundle.text(n)) for n in bundle.names(r"ground-truth/driver-key-.*\.reg")]
    compare_registry(report, snapshot, discovery, exports)
    return report


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        report = compare(Bundle(argv[1]))
    except (OSError, ValueError, zipfile.BadZipFile, KeyError, TypeError) as e:
        print(f"error: cannot compare {argv[1]}: {e}", file=sys.stderr)
        return 2
    out = io.StringIO()
    for line in report.lines:
        print(line, file=out)
    print(f"{len(report.lines)} checks, {report.mismatches} mismatches", file=out)
    sys.stdout.write(out.getvalue())
    return 1 if report.mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
