#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 10) and prints, per target, the executions and
# whether anything was found. Exits non-zero on any crash, leak or timeout; the reproducer is kept
# in fuzz/artifacts/<target>/. Needs only cargo (RUSTC_BOOTSTRAP=1 on stable), not cargo-fuzz.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# The seed corpora in fuzz/corpus/<target>/ are read, never written: new inputs go to
# target/fuzz-corpus/<target>/ (kept between runs, never committed).
# Built with `--sanitizer none`, debug assertions and 16 codegen units: the fuzzed code is safe Rust
# (no unsafe), so AddressSanitizer would find nothing more there and only slow the build; debug
# assertions turn integer overflow into a finding; more codegen units roughly halve the build for a
# slightly slower fuzzing loop. The build log is target/fuzz/fuzz-build.log.
#
# The targets are built with plain `cargo build` and the flags `cargo fuzz build --sanitizer none
# --debug-assertions --codegen-units 16` passes (cargo-fuzz 0.13: SanitizerCoverage through
# `-Cpasses=sancov-module`, `--cfg fuzzing`, release profile with line tables, built for the host
# triple so that build scripts are not instrumented), and the fuzzers are run directly with the
# arguments `cargo fuzz run` adds. So CI does not build cargo-fuzz (minutes on a fresh machine);
# `cargo fuzz run` on the same crate still works for anyone who has it (FUZZING.md).
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-10}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(snapshot config runtime_files allocate winparse eventlog)
fi
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../target/fuzz}"
host=$(rustc -vV | sed -n 's/^host: //p')
sancov=(-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing
  -Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Cdebug-assertions -Ccodegen-units=16)
case "$host" in *-linux-*) sancov+=(-Cllvm-args=-sanitizer-coverage-stack-depth) ;; esac
mkdir -p "$CARGO_TARGET_DIR"
bin_args=()
for t in "${targets[@]}"; do bin_args+=(--bin "$t"); done
if ! RUSTFLAGS="${sancov[*]}" CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
    cargo build --manifest-path Cargo.toml --release --target "$host" "${bin_args[@]}" \
    >"$CARGO_TARGET_DIR/fuzz-build.log" 2>&1; then
  tail -n 40 "$CARGO_TARGET_DIR/fuzz-build.log"
  exit 1
fi
failed=0
summary=()
for t in "${targets[@]}"; do
  scratch="$CARGO_TARGET_DIR/../fuzz-corpus/$t"
  mkdir -p "$scratch" "artifacts/$t"
  log="$CARGO_TARGET_DIR/fuzz-$t.log"
  if "$CARGO_TARGET_DIR/$host/release/$t" -artifact_prefix="artifacts/$t/" \
      -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -max_len=65536 \
      -print_final_stats=1 "$scratch" "corpus/$t" >"$log" 2>&1; then
    result="no finding"
  else
    result="FOUND A CRASH (see $log and fuzz/artifacts/$t/)"
    failed=1
    tail -n 40 "$log"
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1)
  summary+=("$(printf '%-14s %12s executions in %ss: %s' "$t" "${runs:-?}" "$seconds" "$result")")
done
printf '%s\n' "${summary[@]}"
exit "$failed"
