#!/bin/sh
# Builds and pushes dxdp's HostProcess image in one command, from Linux or anywhere BuildKit runs
# (the Dockerfile has no RUN step, so no Windows builder is needed; a Windows image must be pushed,
# it cannot be loaded into a Linux Docker):
#
#   scripts/build-image.sh myregistry.example.com/dxdp:0.1.0 [path/to/dxdp.exe]
#
# The exe defaults to the release build for Windows: target/x86_64-pc-windows-gnu/release/dxdp.exe
# (cargo build --release --target x86_64-pc-windows-gnu), else target/release/dxdp.exe (a native
# build on Windows). See docs/install.md#the-image.
set -eu
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 REGISTRY/dxdp:TAG [path/to/dxdp.exe]" >&2
  exit 2
fi
image=$1
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
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$exe" "$context/dxdp.exe"
(cd "$context" && sha256sum dxdp.exe > dxdp.exe.sha256)
echo "building $image from $exe"
docker buildx build --platform windows/amd64 -f "$root/deploy/image/Dockerfile" -t "$image" --push "$context"
