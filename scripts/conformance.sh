#!/usr/bin/env bash
# Start a fresh sliver on two loopback portals and judge it with independent initiators:
# libiscsi's iscsi-test-cu (all suites, MultipathIO through both portals) and QEMU.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT_A=${SLIVER_TEST_PORT_A:-13260}
PORT_B=${SLIVER_TEST_PORT_B:-13261}
SUITE=${SLIVER_CONFORMANCE_TEST:-ALL}
OUT=${SLIVER_CONFORMANCE_OUT:-target/conformance}
mkdir -p "$OUT"

cargo build --quiet --bin sliver
data=$(mktemp -d)
cleanup() {
  if [ -n "${pid:-}" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$data"
}
trap cleanup EXIT

target/debug/sliver serve --data-dir "$data" \
  --iscsi-listen "127.0.0.1:$PORT_A" --iscsi-listen "127.0.0.1:$PORT_B" \
  >"$OUT/sliver.stdout" 2>"$OUT/sliver.log" &
pid=$!
for _ in $(seq 1 100); do
  if grep -q "iscsi://" "$OUT/sliver.stdout" 2>/dev/null; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then cat "$OUT/sliver.log"; echo "sliver did not start"; exit 1; fi
  sleep 0.1
done
iqn=$(sed -n 's|.*iscsi://[^/]*/\([^/]*\)/.*|\1|p' "$OUT/sliver.stdout" | head -n 1)
url_a="iscsi://127.0.0.1:$PORT_A/$iqn/0"
url_b="iscsi://127.0.0.1:$PORT_B/$iqn/0"

python3 tests/conformance/libiscsi.py --url "$url_a" --url2 "$url_b" --test "$SUITE" \
  --expect-skips tests/conformance/expected-skips.txt \
  --expect-failures tests/conformance/expected-failures.txt \
  --log "$OUT/iscsi-test-cu.log" --json "$OUT/iscsi-test-cu.json" --timeout 1800

tests/conformance/qemu_interop.sh "$url_a" "$url_b"

if ! kill -0 "$pid" 2>/dev/null; then echo "sliver exited during the conformance run"; exit 1; fi
if grep -qE "panicked" "$OUT/sliver.log"; then grep -B2 -A5 panicked "$OUT/sliver.log"; exit 1; fi
