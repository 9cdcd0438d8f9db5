#!/usr/bin/env python3
"""Packages the Helm chart so that its README's links work outside the repository.

In the repository, deploy/helm/dxdp/README.md links the docs relatively (`../../../docs/x.md`),
which a packaged chart (`helm pull`, Artifact Hub) cannot follow. This copies the chart, turns
every link that leaves the chart into an absolute link to the same file at the released tag,
records the repository in Chart.yaml (`home`, `sources`), and runs `helm package`:

    deploy/package_chart.py --repository OWNER/NAME --ref v1.2.3 --version 1.2.3 -d dist

With --image-repository and --image-digest it also writes the image the release pushed into the
packaged values.yaml (`image.repository`, `image.digest`), so that the chart installs exactly the
image built and signed with it (a user's --set still overrides them).

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


DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def pin_image(values, repository, digest):
    """`values` (the chart's values.yaml) with the `image:` block's `repository` and `digest` set.
    Refuses a digest that is not sha256:<64 hex> and a values file whose image block has no
    empty `repository: ""` and `digest: ""` lines to fill."""
    if not DIGEST.match(digest):
        raise ValueError(f"--image-digest {digest!r} is not sha256:<64 hex digits>")
    if not re.fullmatch(r"[a-z0-9][a-z0-9._/:-]*", repository):
        raise ValueError(f"--image-repository {repository!r} is not a lower-case image repository")
    block = re.search(r"^image:\n((?:[ #].*\n|\n)*)", values, flags=re.M)
    if not block:
        raise ValueError("values.yaml has no top-level image: block")
    body = block.group(1)
    new, n_repo = re.subn(r'^  repository: ""$', f'  repository: "{repository}"', body, count=1, flags=re.M)
    new, n_digest = re.subn(r'^  digest: ""$', f'  digest: "{digest}"', new, count=1, flags=re.M)
    if n_repo != 1 or n_digest != 1:
        raise ValueError('values.yaml\'s image block has no empty repository: "" and digest: "" to fill')
    return values[:block.start(1)] + new + values[block.end(1):]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repository", required=True, help="OWNER/NAME on GitHub")
    p.add_argument("--ref", required=True, help="the tag the links point at, e.g. v1.2.3")
    p.add_argument("--version", required=True, help="chart version and appVersion")
    p.add_argument("-d", "--destination", default="dist")
    p.add_argument("--helm", default=os.environ.get("HELM", "helm"))
    p.add_argument("--image-repository", help="the image repository to write into values.yaml")
    p.add_argument("--image-digest", help="the image's digest (sha256:...) to write into values.yaml")
    a = p.parse_args()
    if bool(a.image_repository) != bool(a.image_digest):
        p.error("--image-repository and --image-digest go together")
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
        if a.image_digest:
            values_yaml = os.path.join(chart, "values.yaml")
            try:
                values = pin_image(open(values_yaml, encoding="utf-8").read(), a.image_repository, a.image_digest)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            open(values_yaml, "w", encoding="utf-8").write(values)
            print(f"values.yaml: image {a.image_repository}@{a.image_digest}")
        print(f"README: {len(links)} links made absolute under {url}/blob/{a.ref}")
        os.makedirs(a.destination, exist_ok=True)
        return subprocess.call([a.helm, "package", chart, "--version", a.version,
                                "--app-version", a.version, "-d", a.destination])


if __name__ == "__main__":
    sys.exit(main())
