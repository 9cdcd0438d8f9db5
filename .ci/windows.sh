#!/usr/bin/env bash
# Builds, lints or tests dxdp for x86_64-pc-windows-gnu on Linux.
#
#   .ci/windows.sh clippy   clippy --all-targets -D warnings for the Windows target
#   .ci/windows.sh test     the library's unit tests and the daemon's tests, run under Wine
#   .ci/windows.sh release [DIR]
#                           the release dxdp.exe and dxdp.exe.sha256 in DIR (default dist/)
#   .ci/windows.sh release-check [DIR]
#                           DIR/dxdp.exe is a PE32+ x86-64 console executable, matches its
#                           SHA-256 file, and `dxdp.exe --version` runs under Wine
#   .ci/windows.sh sbom [DIR]
#                           DIR/dxdp.cdx.json: a CycloneDX SBOM of dxdp.exe's crates for the
#                           target (cargo-cyclonedx on PATH), checked by .ci/sbom-check.py
#
# rustup has no Windows std here, so std is built from Debian's rust-web-src 1.96 with
# Debian's rustc/cargo/clippy 1.96 (RUSTC_BOOTSTRAP for -Zbuild-std). /usr/bin comes first on
# PATH so that `cargo clippy` finds Debian's cargo-clippy, not rustup's. Needs the packages that
# .ci/run installs: rustc-web cargo-web rust-web-src rust-web-clippy gcc-mingw-w64-x86-64 wine64,
# and for `dxdp validate`'s D3D12 test libvkd3d1 mesa-vulkan-drivers xvfb xauth.
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
    # The dxcore.dll stand-in (Wine has none): validate's D3D12 probe finds a compute-only
    # adapter through it (src/backend/windows/probe.rs).
    x86_64-w64-mingw32-gcc -shared -O2 -Wl,--kill-at -o "$deps/dxcore-standin.dll" \
      tests/wine/dxcore-standin.c
    # A test that cannot run here says so on its own output ("skipped <test>: <why>"), which cargo
    # shows only with --nocapture: every test runs with it, and a skip fails this step unless the
    # test is on the named list below, with the reason Wine gives.
    # check_skips LOG [ALLOWED_TEST...]: fails on a skip line in LOG that names no test or a test
    # not in ALLOWED_TEST.
    check_skips() {
      local log=$1 name ok=1 started finished
      shift
      # A test executable that crashed (Wine aborts on an unimplemented function: "Unhandled
      # exception") may still leave cargo's exit code 0: each one that started must have ended
      # with its result line.
      started=$(grep -c "^ *Running " "$log" || true)
      finished=$(grep -o "test result: ok\. [0-9]* passed" "$log" | wc -l)
      if [ "$started" != "$finished" ] || grep -q "Unhandled exception" "$log"; then
        echo "$((started - finished)) of $started test executables ended without their result line (crashed?):" >&2
        grep -n "Running \|Unhandled exception\|unimplemented function" "$log" >&2
        ok=0
      fi
      if grep -q "skipped:" "$log"; then
        echo "a test skipped without naming itself (say \"skipped <test>: <why>\"):" >&2
        grep "skipped:" "$log" >&2
        ok=0
      fi
      while read -r name; do
        if [[ " $* " != *" $name "* ]]; then
          echo "skipped under Wine, and not on .ci/windows.sh's list:" >&2
          grep "skipped $name" "$log" >&2
          ok=0
        fi
      # A skip line's name follows "skipped " at a word's start ("…_is_skipped ... ok" is a test
      # name, not a skip).
      done < <(grep -oE "(^|[^A-Za-z0-9_])skipped [A-Za-z0-9_]+" "$log" | awk '{print $2}' | sort -u)
      [ "$ok" = 1 ]
    }
    # Unit tests that Wine cannot run, each for what Wine lacks; each runs natively in ci.yml's
    # Windows jobs, where these parts exist.
    lib_wine_skips=(
      the_containers_processes_are_listed_or_the_absence_of_hcs_is_said # no computecore.dll (HCS)
      the_gpu_counters_are_read_or_their_absence_is_explained # no GPU performance counters
      shared_memory_totals_are_read_or_their_absence_is_explained # no dxcore.dll
      unix_sockets_behave_as_the_loopback_transport_assumes # no AF_UNIX
      one_lock_per_directory_whatever_the_spelling # its symlink part: Wine's symlinks do not lead to their target
      a_directory_removed_and_recreated_is_watched_again_without_a_tick # a watched directory's name stays taken after its removal
      a_directory_whose_file_is_held_open_is_renamed_once_it_is_closed # Wine renames a directory whose file is held open; Windows refuses
      subscribing_and_querying_fail_soft # its bookmark part: Wine's EvtCreateBookmark is a stub that aborts
      a_protected_directory_reads_back_its_access_list # Wine keeps no access list set with SetNamedSecurityInfoW here
    )
    liblog="$CARGO_TARGET_DIR/lib-wine.log"
    /usr/bin/cargo test "${build_std[@]}" --lib "$@" -- --nocapture 2>&1 | tee "$liblog"
    check_skips "$liblog" "${lib_wine_skips[@]}"
    echo "unit tests under Wine: $(grep -o 'test result: ok\. [0-9]* passed' "$liblog" | awk '{ n += $4 } END { print n + 0 }') executed; skipped, each for what Wine lacks: ${lib_wine_skips[*]}"
    # The daemon's tests under Wine: Wine 8 has no AF_UNIX, so the daemon runs over the loopback
    # transport (src/transport.rs) with every other Windows path real (tokio on IOCP, the file
    # watch on ReadDirectoryChangesW, the lock, registration retries, server restarts), and the
    # PodResources and CRI clients talk to stand-ins on real named pipes. Every test must run:
    # one that skips fails this step.
    daemon_tests=(plugin faults soak observe telemetry sensors)
    # Tests that run dxdp.exe need the ProcessPrng stand-in beside it too.
    mkdir -p "$CARGO_TARGET_DIR/$target/debug"
    cp "$deps/bcryptprimitives.dll" "$CARGO_TARGET_DIR/$target/debug/"
    log="$CARGO_TARGET_DIR/daemon-wine.log"
    : >"$log"
    # Not run under Wine, each for a reason Wine has and a native Windows run must settle:
    # - Wine 8 sends no ReadDirectoryChangesW event for a file rewritten in place (truncated and
    #   written, not replaced);
    # - a directory deleted while the daemon watches it stays "delete pending" under Wine, so it
    #   cannot be created again while the daemon runs (ERROR_ALREADY_EXISTS for 10 s and more).
    wine_skips=(
      a_snapshot_rewritten_slowly_in_place_never_shows_a_partial_list
      the_kubelet_directory_deleted_and_recreated_is_watched_again
      the_snapshot_directory_deleted_and_recreated_is_watched_again
    )
    skip_args=()
    for s in "${wine_skips[@]}"; do
      echo "not run under Wine: $s (see .ci/windows.sh; it runs on Linux and in the native Windows jobs)"
      skip_args+=(--skip "$s")
    done
    # The daemon's tests are modules of one test executable (tests/daemon/main.rs) and soak its
    # own (it measures its process's descriptors and memory): one build, filtered runs.
    /usr/bin/cargo test "${build_std[@]}" --test daemon --test soak --no-run
    for t in "${daemon_tests[@]}"; do
      # observe checks that nothing listens on a stopped daemon's port: a test running beside it
      # could be given that port at once (seen under Wine), so its tests run one at a time.
      threads=2
      [ "$t" = observe ] && threads=1
      if [ "$t" = soak ]; then
        run=(--test soak --)
      else
        run=(--test daemon -- "$t::")
      fi
      /usr/bin/cargo test "${build_std[@]}" "${run[@]}" --test-threads "$threads" --nocapture "${skip_args[@]}" 2>&1 | tee -a "$log"
    done
    # No daemon test may skip.
    check_skips "$log"
    ran=$(grep -o 'test result: ok\. [0-9]* passed' "$log" | awk '{ n += $4 } END { print n + 0 }')
    echo "daemon tests under Wine: $ran executed (${daemon_tests[*]}), none skipped"

    # dxdp validate under Wine: the D3D12 round trip on Wine's D3D12 (vkd3d) over Mesa's
    # software Vulkan device, which needs a display (xvfb-run), and the vendor API probes
    # against stand-in DLLs (tests/wine/vendor-standin.c) that answer, fail and hang.
    x86_64-w64-mingw32-gcc -shared -O2 -Wl,--kill-at -o "$deps/vendor-standin.dll" \
      tests/wine/vendor-standin.c
    vlog="$CARGO_TARGET_DIR/validate-wine.log"
    /usr/bin/cargo test "${build_std[@]}" --test daemon --no-run
    started=$(date +%s)
    # opencl=n: Wine would load its own builtin OpenCL.dll for the stand-in of that name.
    WINEDLLOVERRIDES="$WINEDLLOVERRIDES;opencl=n" \
      xvfb-run -a /usr/bin/cargo test "${build_std[@]}" --test daemon -- validate:: --test-threads 1 --nocapture 2>&1 | tee "$vlog"
    check_skips "$vlog"
    grep -q "test result: ok\." "$vlog" || { echo "dxdp validate tests under Wine failed" >&2; exit 1; }
    echo "dxdp validate under Wine: D3D12 round trip and vendor stand-ins, none skipped, $(( $(date +%s) - started )) s"

    # The Windows binary under Wine must print exactly what the Linux binary prints for every
    # fixture host, and fail cleanly (no panic) where DXCore is missing.
    /usr/bin/cargo build "${build_std[@]}" --bin dxdp
    exe_dir="$CARGO_TARGET_DIR/$target/debug"
    cp "$deps/bcryptprimitives.dll" "$exe_dir/"
    # The Linux binary that `cargo test` or `cargo build` (rustup's toolchain) left: building it
    # here would use Debian's rustc and CARGO_TARGET_DIR, which are the Windows build's.
    linux_dxdp="${LINUX_DXDP:-target/debug/dxdp}"
    [ -x "$linux_dxdp" ] ||
      { echo "no Linux dxdp at $linux_dxdp: run cargo build first, or set LINUX_DXDP" >&2; exit 1; }
    for fixture in tests/fixtures/*.yaml; do
      # Each failure says which binary and fixture (an assignment that fails ends the script under
      # set -e without a word).
      want=$("$linux_dxdp" discover --json --host-snapshot "$fixture" 2>"$CARGO_TARGET_DIR/exe-linux.err") ||
        { echo "the Linux dxdp failed on $fixture (exit $?):" >&2; tail -20 "$CARGO_TARGET_DIR/exe-linux.err" >&2; exit 1; }
      got=$(/usr/lib/wine/wine64 "$exe_dir/dxdp.exe" discover --json --host-snapshot "Z:$(realpath "$fixture" | tr / '\\')" 2>"$CARGO_TARGET_DIR/exe-wine.err" | tr -d '\r') ||
        { echo "dxdp.exe under Wine failed on $fixture (exit $?):" >&2; tail -20 "$CARGO_TARGET_DIR/exe-wine.err" >&2; exit 1; }
      if [ -z "$want" ] || [ "$want" != "$got" ]; then
        echo "dxdp.exe under Wine differs from Linux for $fixture" >&2
        diff <(echo "$want") <(echo "$got") | head -20 >&2
        exit 1
      fi
    done
    set +e
    err=$(/usr/lib/wine/wine64 "$exe_dir/dxdp.exe" discover 2>&1 >/dev/null)
    rc=$?
    set -e
    if [ "$rc" -ne 1 ] || ! grep -q "cannot enumerate DirectX adapters" <<<"$err" || grep -q panicked <<<"$err"; then
      echo "dxdp.exe without DXCore should fail cleanly with exit 1, got $rc: $err" >&2
      exit 1
    fi
    echo "dxdp.exe under Wine: same discover output as Linux for $(ls tests/fixtures/*.yaml | wc -l) fixture hosts; clean error without DXCore"
    ;;
  release)
    out="${2:-dist}"
    /usr/bin/cargo build "${build_std[@]}" --release --locked --bin dxdp
    mkdir -p "$out"
    cp "$CARGO_TARGET_DIR/$target/release/dxdp.exe" "$out/dxdp.exe"
    (cd "$out" && sha256sum dxdp.exe >dxdp.exe.sha256)
    echo "$out/dxdp.exe: $(cut -d' ' -f1 "$out/dxdp.exe.sha256")"
    ;;
  release-check)
    out="${2:-dist}"
    kind=$(file -b "$out/dxdp.exe")
    case "$kind" in
      "PE32+ executable (console) x86-64"*) echo "dxdp.exe: $kind" ;;
      *) echo "dxdp.exe is not a PE32+ x86-64 console executable: $kind" >&2; exit 1 ;;
    esac
    (cd "$out" && sha256sum --check --quiet dxdp.exe.sha256)
    export WINEDEBUG=-all
    export WINEDLLOVERRIDES="bcryptprimitives=n,b;mscoree=;mshtml="
    WINEPREFIX="$(mktemp -d /tmp/dxdp-wine.XXXXXX)"
    export WINEPREFIX
    # The ProcessPrng stand-in goes next to a copy of the exe, never into the release directory.
    run_dir="$(mktemp -d /tmp/dxdp-release.XXXXXX)"
    trap '/usr/lib/wine/wineserver -k >/dev/null 2>&1 || true; rm -rf "$WINEPREFIX" "$run_dir"' EXIT
    cp "$out/dxdp.exe" "$run_dir/"
    x86_64-w64-mingw32-gcc -shared -O2 -Wl,--kill-at -o "$run_dir/bcryptprimitives.dll" \
      tests/wine/processprng.c -ladvapi32
    version=$(/usr/lib/wine/wine64 "$run_dir/dxdp.exe" --version | tr -d '\r')
    want="dxdp $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1) (commit "
    case "$version" in
      "$want"*", x86_64-pc-windows-gnu)") ok=1 ;;
      *) ok=0 ;;
    esac
    if [ "$ok" != 1 ]; then
      echo "dxdp.exe --version under Wine printed '$version', want '$want…, x86_64-pc-windows-gnu)'" >&2
      exit 1
    fi
    echo "dxdp.exe --version under Wine: $version"
    ;;
  sbom)
    out="${2:-dist}"
    if ! command -v cargo-cyclonedx >/dev/null; then
      echo "cargo-cyclonedx is not on PATH: cargo install --locked cargo-cyclonedx --version 0.5.9" >&2
      exit 1
    fi
    # The dxdp binary's crates as resolved for the target (cargo metadata), without build and
    # dev dependencies. std (built from rust-web-src) is not a crate of the lock file and is
    # not listed.
    mkdir -p "$out"
    rm -f dxdp_bin.cdx.json
    /usr/bin/cargo cyclonedx --manifest-path Cargo.toml --target "$target" --describe binaries \
      --no-build-deps --format json --spec-version 1.5
    mv dxdp_bin.cdx.json "$out/dxdp.cdx.json"
    python3 .ci/sbom-check.py "$out/dxdp.cdx.json" "$target"
    ;;
  *)
    echo "usage: $0 clippy|test [test args...]|release [DIR]|release-check [DIR]|sbom [DIR]" >&2
    exit 2
    ;;
esac
