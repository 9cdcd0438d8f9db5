#!/usr/bin/env bash
# Builds, lints or tests dxdp for x86_64-pc-windows-gnu on Linux.
#
#   .ci/windows.sh clippy   clippy --all-targets -D warnings for the Windows target
#   .ci/windows.sh test     the library's unit tests, run under Wine
#
# rustup has no Windows std here, so std is built from Debian's rust-web-src 1.96 with
# Debian's rustc/cargo/clippy 1.96 (RUSTC_BOOTSTRAP for -Zbuild-std). /usr/bin comes first on
# PATH so that `cargo clippy` finds Debian's cargo-clippy, not rustup's. Needs the packages that
# .ci/run installs: rustc-web cargo-web rust-web-src rust-web-clippy gcc-mingw-w64-x86-64 wine64.
set -euo pipefail
cd "$(dirname "$0")/.."

export PATH="/usr/bin:$PATH"
export RUSTC=/usr/bin/rustc
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR_WIN:-target/win}"
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
target=x86_64-pc-windows-gnu
build_std=(-Zbuild-std=std,panic_abort --target "$target")

case "${1:-}" in
  clippy)
    /usr/bin/cargo clippy "${build_std[@]}" --all-targets -- -D warnings
    ;;
  test)
    shift
    export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=/usr/lib/wine/wine64
    export WINEDEBUG=-all
    # Use our ProcessPrng stand-in, and skip Wine's Mono and Gecko installers.
    export WINEDLLOVERRIDES="bcryptprimitives=n,b;mscoree=;mshtml="
    WINEPREFIX="$(mktemp -d /tmp/dxdp-wine.XXXXXX)"
    export WINEPREFIX
    trap '/usr/lib/wine/wineserver -k >/dev/null 2>&1 || true; rm -rf "$WINEPREFIX"' EXIT
    /usr/bin/cargo test "${build_std[@]}" --lib --no-run
    deps="$CARGO_TARGET_DIR/$target/debug/deps"
    x86_64-w64-mingw32-gcc -shared -O2 -Wl,--kill-at -o "$deps/bcryptprimitives.dll" \
      tests/wine/processprng.c -ladvapi32
    /usr/bin/cargo test "${build_std[@]}" --lib "$@"
    ;;
  *)
    echo "usage: $0 clippy|test [test args...]" >&2
    exit 2
    ;;
esac
