#!/usr/bin/env bash
# The console in a real browser (RFC 0002): Debian's chromium driven by playwright-core,
# against a real `sliver serve` with I/O from qemu-io. Screenshots of every screen land in
# target/console-screenshots/. Needs chromium, node and qemu-io (.ci/run installs them).
set -euo pipefail
cd "$(dirname "$0")/.."

chromium=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$chromium" ]; then
  echo "console tests: no chromium at $chromium (apt-get install chromium fonts-liberation, or set CHROMIUM)" >&2
  exit 1
fi
command -v node >/dev/null || { echo "console tests: node is missing (apt-get install nodejs npm)" >&2; exit 1; }
command -v openssl >/dev/null || { echo "console tests: openssl is missing (apt-get install openssl)" >&2; exit 1; }
command -v qemu-io >/dev/null || { echo "console tests: qemu-io is missing (apt-get install qemu-utils qemu-block-extra)" >&2; exit 1; }

cargo build --quiet --bin sliver
sliver="$(realpath -m "${CARGO_TARGET_DIR:-target}")/debug/sliver"
# The copy screen's test ships to a real object store.
weed=$(scripts/seaweedfs.sh)
cd tests/console
# The locked versions from the machine's configured npm source; playwright-core's install
# script would download a browser: skipped, Debian's is used.
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
# Node 20 holds the whole file to --test-timeout as well as each test, and the suite takes
# about three minutes on a busy two-core machine: the bound is the file's, not a test's.
SLIVER_BIN="$sliver" CHROMIUM="$chromium" SLIVER_WEED="$weed" \
  node --test --test-concurrency=1 --test-timeout=900000 console.test.mjs
