#!/usr/bin/env python3
"""Packages the Helm chart so that its README's links work outside the repository.

In the repository, deploy/helm/dxdp/README.md links the docs relatively (`../../../docs/x.md`),
which a packaged chart (`helm pull`, Artifact Hub) cannot follow. This copies the chart, turns
every link that leaves the chart into an absolute link to the same file at the released tag,
records the repository in Chart.yaml (`home`, `sources`), and runs `helm package`:

    deploy/package_chart.py --repository OWNER/NAME --ref v1.2.3 --version 1.2.3 -d dist

The release workflow (.github/workflows/release.yml) runs it; deploy/check.py checks the rewrite.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, "deploy", "helm", "dxdp")
LINK = re.compile(r"\]\(((?:\.\./)+[^)#\s]*)(#[^)\s]*)?\)")


def rewrite(text, base, chart_dir=CHART):
    """`text` with every relative link that leaves `chart_dir` made absolute under `base`
    (e.g. https://github.com/OWNER/NAME/blob/v1.2.3). Returns (text, [(link, repository path)])."""
    links = []

    def absolute(m):
        target = os.path.normpath(os.path.join(chart_dir, m.group(1)))
        rel = os.path.relpath(target, ROOT).replace(os.sep, "/")
        if rel.startswith("../"):
            raise ValueError(f"link {m.group(1)} leaves the repository")
        links.append((m.group(1), rel))
        return f"]({base}/{rel}{m.group(2) or ''})"

    return LINK.sub(absolute, text), links


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repository", required=True, help="OWNER/NAME on GitHub")
    p.add_argument("--ref", required=True, help="the tag the links point at, e.g. v1.2.3")
    p.add_argument("--version", required=True, help="chart version and appVersion")
    p.add_argument("-d", "--destination", default="dist")
    p.add_argument("--helm", default=os.environ.get("HELM", "helm"))
    a = p.parse_args()
    url = f"https://github.com/{a.repository}"
    with tempfile.TemporaryDirectory() as tmp:
        chart = os.path.join(tmp, "dxdp")
        shutil.copytree(CHART, chart)
        readme = os.path.join(chart, "README.md")
        text, links = rewrite(open(readme, encoding="utf-8").read(), f"{url}/blob/{a.ref}")
        open(readme, "w", encoding="utf-8").write(text)
        chart_yaml = os.path.join(chart, "Chart.yaml")
        meta = open(chart_yaml, encoding="utf-8").read()
        meta = re.sub(r"^sources: \[\]$", f"home: {url}\nsources: [{url}]", meta, flags=re.M)
        open(chart_yaml, "w", encoding="utf-8").write(meta)
        print(f"README: {len(links)} links made absolute under {url}/blob/{a.ref}")
        os.makedirs(a.destination, exist_ok=True)
        return subprocess.call([a.helm, "package", chart, "--version", a.version,
                                "--app-version", a.version, "-d", a.destination])


if __name__ == "__main__":
    sys.exit(main())
