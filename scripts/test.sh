#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and integration tests, conformance against
# independent initiators (libiscsi, QEMU), fuzz smoke runs. The README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "unit and integration tests"
cargo test --workspace

step "conformance: libiscsi iscsi-test-cu and QEMU against a live sliver"
scripts/conformance.sh

if [ "${SLIVER_SKIP_FUZZ:-0}" != 1 ]; then
  step "fuzz smoke runs"
  scripts/fuzz-smoke.sh
fi
step "all tests passed"
