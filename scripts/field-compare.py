#!/usr/bin/env python3
"""Compares what dxdp recorded in a field bundle with what Windows itself said.

Usage: python3 scripts/field-compare.py BUNDLE   (the dxdp-field-* folder or its .zip)

scripts/field-check.ps1 writes, next to dxdp's own outputs (snapshot.json, discover-json.txt),
the ground truth gathered with stock cmdlets and tools (ground-truth/pnp-devices.json from
Get-PnpDevice and Get-PnpDeviceProperty, ground-truth/driver-key-*.reg from reg export,
ground-truth/nvidia-smi.txt). This script checks each dxdp fact against it and prints one line per
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
            truth_pci = {"bus": bus, "device": address >> 16, "function": address & 0xFFFF}
            report.same(f"{iid}: PCI location", node.get("pci"), truth_pci)
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


def reg_values(text):
    """{key (upper case, HKLM\\...): set of value names} of a .reg export."""
    keys = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].replace("HKEY_LOCAL_MACHINE", "HKLM", 1).upper()
            keys.setdefault(current, set())
        elif current and line.startswith('"'):
            m = re.match(r'"((?:[^"\\]|\\.)*)"=', line)
            if m:
                keys[current].add(m.group(1).replace('\\"', '"').replace("\\\\", "\\"))
        elif current and line.startswith("@="):
            keys[current].add("")
    return keys


def compare_registry(report, snapshot, exports):
    recorded = {
        k["key"].upper(): {v.get("name", "") for v in k.get("values") or []}
        for k in snapshot.get("registry") or []
    }
    for name, text in exports:
        for key, names in reg_values(text).items():
            if "\\COPYTOVM" not in key:
                continue
            if key not in recorded:
                report.mismatch(f"{key}: in {name}, not in dxdp's snapshot")
                continue
            report.same(f"{key}: value names", sorted(recorded[key]), sorted(names))


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
    exports = [(n, bundle.text(n)) for n in bundle.names(r"ground-truth/driver-key-.*\.reg")]
    compare_registry(report, snapshot, exports)
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
