#!/usr/bin/env bash
# Bounded fuzz runs of every parser target, seeded with the checked-in corpus.
# cargo-fuzz needs nightly-only flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${FUZZ_SECONDS:-30}
if ! command -v cargo-fuzz >/dev/null; then
  cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
targets=$(cd fuzz && cargo fuzz list)
cd fuzz
cargo fuzz build -O 2>&1 | tail -n 3
for t in $targets; do
  work=$(mktemp -d)
  mkdir -p "corpus/$t"
  echo "fuzz $t for ${SECONDS_PER_TARGET}s"
  # New inputs go to the scratch directory; the checked-in corpus stays read-only.
  log="$work.log"
  rc=0
  cargo fuzz run -O "$t" "$work" "corpus/$t" -- \
    -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 >"$log" 2>&1 || rc=$?
  grep -E "^stat::(number_of_executed_units|peak_rss_mb)|ERROR|panicked|SUMMARY" "$log" || true
  if [ "$rc" -ne 0 ]; then tail -n 40 "$log"; fi
  rm -f "$log"
  rm -rf "$work"
  if [ "$rc" -ne 0 ]; then
    echo "fuzz target $t failed (exit $rc); reproduce with: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run $t"
    exit 1
  fi
done
echo "fuzz smoke: all targets ran clean"
