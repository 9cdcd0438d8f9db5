#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 10) and prints, per target, the executions and
# whether anything was found. Exits non-zero on any crash, leak or timeout; the reproducer is kept
# in fuzz/artifacts/<target>/. Needs cargo-fuzz; on stable it runs with RUSTC_BOOTSTRAP=1.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# The seed corpora in fuzz/corpus/<target>/ are read, never written: new inputs go to
# target/fuzz-corpus/<target>/ (kept between runs, never committed).
# Built with `--sanitizer none`, debug assertions and 16 codegen units: the fuzzed code is safe Rust
# (no unsafe), so AddressSanitizer would find nothing more there and only slow the build; debug
# assertions turn integer overflow into a finding; more codegen units roughly halve the build for a
# slightly slower fuzzing loop. `cargo fuzz build` output goes to the build log.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-10}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(snapshot config runtime_files allocate winparse)
fi
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../target/fuzz}"
flags=(--sanitizer none --debug-assertions --codegen-units 16)
mkdir -p "$CARGO_TARGET_DIR"
if ! cargo fuzz build "${flags[@]}" >"$CARGO_TARGET_DIR/fuzz-build.log" 2>&1; then
  tail -n 40 "$CARGO_TARGET_DIR/fuzz-build.log"
  exit 1
fi
failed=0
summary=()
for t in "${targets[@]}"; do
  scratch="$CARGO_TARGET_DIR/../fuzz-corpus/$t"
  mkdir -p "$scratch" "artifacts/$t"
  log="$CARGO_TARGET_DIR/fuzz-$t.log"
  if cargo fuzz run "${flags[@]}" "$t" "$scratch" "corpus/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -max_len=65536 \
      -print_final_stats=1 >"$log" 2>&1; then
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
