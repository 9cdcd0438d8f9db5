#!/usr/bin/env python3
"""Checks that a CycloneDX SBOM lists exactly the crates of the dxdp executable for a target.

Usage: .ci/sbom-check.py SBOM.json TARGET   (run from the repository root; needs cargo)

The dependency set is computed from cargo's own metadata, independently of the SBOM tool: the
packages reachable from `dxdp` through normal dependencies (no dev- or build-dependencies) in
`cargo metadata --filter-platform TARGET`. The SBOM must list exactly those (name and version),
and none of the crates only the Linux build uses (present for x86_64-unknown-linux-gnu, absent
for TARGET). Exit status 0 when it holds, 1 with the differences otherwise.
"""

import json
import subprocess
import sys

ROOT = "dxdp"
LINUX = "x86_64-unknown-linux-gnu"


def closure(target):
    """{(name, version)} of the packages `dxdp` links for `target`, itself excluded."""
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", target],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    packages = {p["id"]: (p["name"], p["version"]) for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    root = next(i for i, (name, _) in packages.items() if name == ROOT and i in meta["workspace_members"])
    seen, todo = set(), [root]
    while todo:
        for dep in nodes[todo.pop()]["deps"]:
            normal = any(k.get("kind") is None for k in dep["dep_kinds"])
            if normal and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    return {packages[i] for i in seen}


def sbom_components(path):
    with open(path, encoding="utf-8") as f:
        bom = json.load(f)
    out = set()
    todo = list(bom.get("components") or [])
    while todo:
        c = todo.pop()
        out.add((c["name"], c.get("version")))
        todo.extend(c.get("components") or [])
    return bom["metadata"]["component"]["name"], out


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    path, target = argv[1], argv[2]
    described, listed = sbom_components(path)
    want = closure(target)
    linux_only = closure(LINUX) - want
    problems = []
    if described != ROOT:
        problems.append(f"the SBOM describes {described!r}, not {ROOT!r}")
    for name, version in sorted(want - listed):
        problems.append(f"missing: {name} {version} (a dependency of {ROOT} for {target})")
    for name, version in sorted(listed - want):
        problems.append(f"extra: {name} {version} (not a dependency of {ROOT} for {target})")
    for name, version in sorted(linux_only & listed):
        problems.append(f"Linux only: {name} {version}")
    if not any(name == "windows" for name, _ in listed):
        problems.append("the windows crate is not listed")
    for p in problems:
        print(f"{path}: {p}", file=sys.stderr)
    if problems:
        return 1
    some = ", ".join(sorted(n for n, _ in linux_only)[:6])
    print(
        f"{path}: {len(listed)} components, exactly {ROOT}'s normal dependencies for {target} "
        f"(cargo metadata); none of the {len(linux_only)} Linux-only ones ({some}, ...)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
