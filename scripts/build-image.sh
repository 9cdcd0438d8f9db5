#!/bin/sh
# Builds and pushes dxdp's HostProcess image in one command, from Linux or anywhere BuildKit runs
# (the Dockerfile has no RUN step, so no Windows builder is needed; a Windows image must be pushed,
# it cannot be loaded into a Linux Docker):
#
#   scripts/build-image.sh myregistry.example.com/dxdp:0.1.0 [path/to/dxdp.exe]
#
# It builds deploy/image/Dockerfile once per entry of BUILDS below, pushes each as <image>-<name>,
# and then pushes <image> itself: one manifest list naming each of them by `os.version`, so that
# containerd on a node picks the one for the node's Windows build (docs/install.md#the-image).
# .github/workflows/release.yml runs this script on a tag: the release and a build of your own
# are the same images, built with the same flags.
#
# Every base is built FROM by digest: a base written below by tag is resolved once, at the start
# (`docker buildx imagetools inspect`), and the build uses TAG@DIGEST, so the images cannot mix
# two versions of a base that moved during the build and the digest is on record. A base written
# as TAG@sha256:... is used as written. With DXDP_IMAGE_RECORD=FILE the script writes what it
# pushed there, tab-separated, one line each (the release puts it in its notes):
#   entry <name> <os.version> <image>-<name>@<digest> <base>@<digest>
#   index <image>@<digest>            (the manifest list nodes pull)
#
# The exe defaults to the release build for Windows: target/x86_64-pc-windows-gnu/release/dxdp.exe
# (cargo build --release --target x86_64-pc-windows-gnu), else target/release/dxdp.exe (a native
# build on Windows). See docs/install.md#the-image.
set -eu

# One line per image: name (the tag suffix), os.version of the manifest list entry ("-" for the
# entry without one, which containerd picks on a build that no other entry matches), base image.
# - ltsc2025: Microsoft's base rebuilt with valid registry hives, which build 26100 needs
#   (deploy/image/Dockerfile says why).
# - ltsc2022: the base Windows Server 2022 nodes have run HostProcess images from since 2022.
# - any: the rebuilt base again, for every other build.
BUILDS='ltsc2025 10.0.26100 mcr.microsoft.com/oss/v2/kubernetes/windows-host-process-containers-base-image:2.0.0
ltsc2022 10.0.20348 mcr.microsoft.com/oss/kubernetes/windows-host-process-containers-base-image:v1.0.0
any - mcr.microsoft.com/oss/v2/kubernetes/windows-host-process-containers-base-image:2.0.0'

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 REGISTRY/dxdp:TAG [path/to/dxdp.exe]" >&2
  exit 2
fi
image=$1
case $image in
  *@*) echo "error: $image is a digest: give REGISTRY/dxdp:TAG" >&2; exit 2 ;;
esac
case ${image##*/} in
  *:?*) ;;
  *) echo "error: $image has no tag: give REGISTRY/dxdp:TAG (each Windows build's image is pushed as TAG-<name>)" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
exe=${2:-}
if [ -z "$exe" ]; then
  for candidate in "$root/target/x86_64-pc-windows-gnu/release/dxdp.exe" "$root/target/release/dxdp.exe"; do
    if [ -f "$candidate" ]; then exe=$candidate; break; fi
  done
fi
if [ -z "$exe" ] || [ ! -f "$exe" ]; then
  echo "error: no dxdp.exe: build it first (docs/install.md#build-dxdpexe) or pass its path" >&2
  exit 1
fi
record=${DXDP_IMAGE_RECORD:-}
if [ -n "$record" ]; then : > "$record"; fi
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT

# The digest `docker buildx imagetools inspect` reports for a reference (for a multi-platform base,
# the digest of its index: BuildKit picks windows/amd64 inside it).
digest_of() {
  d=$(docker buildx imagetools inspect "$1" </dev/null | sed -n 's/^Digest: *\(sha256:[0-9a-f]\{64\}\) *$/\1/p' | head -n 1)
  if [ -z "$d" ]; then
    echo "error: docker buildx imagetools inspect $1 gave no digest (is the registry reachable?)" >&2
    exit 1
  fi
  echo "$d"
}
# Each base by tag resolved once, before any build: "<base> <digest>" a line.
pins=''
while read -r name osversion base; do
  case $base in *@sha256:*) continue ;; esac
  if [ -z "$(printf '%s' "$pins" | awk -v b="$base" '$1 == b')" ]; then
    pins="$pins$base $(digest_of "$base")
"
  fi
done <<BUILDS_END
$BUILDS
BUILDS_END
mkdir "$context/image"
cp "$exe" "$context/image/dxdp.exe"
(cd "$context/image" && sha256sum dxdp.exe > dxdp.exe.sha256)

# The descriptors of the pushed images (digest and platform), for the manifest list.
set --
while read -r name osversion base; do
  label=$osversion
  [ "$osversion" != "-" ] || label=any
  case $base in
    *@sha256:*) pinned=$base ;;
    *) pinned=$(printf '%s' "$pins" | awk -v b="$base" '$1 == b { print $1 "@" $2; exit }') ;;
  esac
  echo "building $image-$name (os.version $label, from $pinned) with $exe"
  # No attestation manifests (--provenance=false --sbom=false): each pushed image is exactly the
  # Dockerfile's, a plain image manifest (with them BuildKit pushes a manifest list of its own,
  # from which HostProcess images have failed to pull on older containerd patch releases).
  docker buildx build --platform windows/amd64 --provenance=false --sbom=false \
    --build-arg "BASE_IMAGE=$pinned" --build-arg "WINDOWS_BUILD=$label" \
    -f "$root/deploy/image/Dockerfile" -t "$image-$name" \
    --metadata-file "$context/$name.json" --push "$context/image" </dev/null
  digest=$(sed -n 's/.*"containerimage.digest": *"\(sha256:[0-9a-f]*\)".*/\1/p' "$context/$name.json" | head -n 1)
  if [ -z "$digest" ]; then
    echo "error: buildx wrote no containerimage.digest for $image-$name into its metadata file" >&2
    exit 1
  fi
  if [ -n "$record" ]; then
    printf 'entry\t%s\t%s\t%s\t%s\n' "$name" "$label" "$image-$name@$digest" "$pinned" >> "$record"
  fi
  if [ "$osversion" = "-" ]; then
    set -- "$@" "{\"digest\":\"$digest\",\"platform\":{\"architecture\":\"amd64\",\"os\":\"windows\"}}"
  else
    set -- "$@" "{\"digest\":\"$digest\",\"platform\":{\"architecture\":\"amd64\",\"os\":\"windows\",\"os.version\":\"$osversion\"}}"
  fi
done <<BUILDS_END
$BUILDS
BUILDS_END
echo "pushing $image: one manifest list of the $# images above, by os.version"
# Each source is the descriptor of an image pushed above to the same repository; imagetools
# takes its media type and size from the registry and the platform (os.version) from here.
docker buildx imagetools create -t "$image" "$@"
index=$(digest_of "$image")
echo "pushed $image@$index"
if [ -n "$record" ]; then
  printf 'index\t%s\n' "$image@$index" >> "$record"
fi
