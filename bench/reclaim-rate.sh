#!/usr/bin/env bash
# Achieved against requested reclaim rate of `sliver reclaim` on an ext4 loop device.
#
# For each rate: write a file, delete it, then time one windowed FITRIM pass over the dead
# space. Prints a table; asserts nothing (rates depend on the machine). Needs root, mkfs.ext4,
# losetup, fsfreeze and python3. Bounded: the dead space per run is DEAD_MIB (default 512), so
# the slowest default rate (50 MB/s) takes about 11 s; the whole run stays near a minute.
#
#   sudo bench/reclaim-rate.sh
#   sudo RATES="25MB/s 100MB/s" DEAD_MIB=256 SLIVER=target/release/sliver bench/reclaim-rate.sh
set -euo pipefail

RATES=${RATES:-"50MB/s 200MB/s 1GB/s unlimited"}
DEAD_MIB=${DEAD_MIB:-512}
WINDOW=${WINDOW:-}

if [ "$(id -u)" != 0 ]; then
    echo "reclaim-rate: needs root (loop devices, mount, FITRIM)" >&2
    exit 1
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${SLIVER:-}" ]; then
    reclaim=("$SLIVER" reclaim)
else
    # Until `sliver reclaim` is wired into the binary, the crate's example is the same code.
    (cd "$repo" && cargo build --quiet --release -p sliver-reclaim --example reclaim)
    target_dir=${CARGO_TARGET_DIR:-$repo/target}
    reclaim=("$target_dir/release/examples/reclaim")
fi

work=$(mktemp -d)
dev=""
cleanup() {
    if mountpoint -q "$work/mnt" 2>/dev/null; then umount "$work/mnt" || umount -l "$work/mnt"; fi
    if [ -n "$dev" ]; then losetup -d "$dev" || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

truncate -s $((DEAD_MIB * 2 + 256))M "$work/fs.img"
dev=$(losetup --find --show "$work/fs.img")
mkfs.ext4 -q -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$dev"
mkdir "$work/mnt"
mount "$dev" "$work/mnt"
# Trim the never-used space once, so each run below sees only its own dead space.
"${reclaim[@]}" "$work/mnt" --once --rate unlimited --json >/dev/null

extra=()
[ -n "$WINDOW" ] && extra=(--window "$WINDOW")

printf '%-12s %12s %12s %10s %9s %8s\n' requested achieved discarded elapsed windows ratio
for rate in $RATES; do
    dd if=/dev/zero of="$work/mnt/dead" bs=1M count="$DEAD_MIB" conv=fsync status=none
    rm "$work/mnt/dead"
    fsfreeze --freeze "$work/mnt"
    fsfreeze --unfreeze "$work/mnt"
    json=$("${reclaim[@]}" "$work/mnt" --once --rate "$rate" --json "${extra[@]}")
    RATE="$rate" python3 -c '
import json, os, sys
p = json.load(sys.stdin)["passes"][0]
limit = p["limit"]["rate"]
got = p["achieved_bytes_per_second"] or float("inf")
req = "%.0f MB/s" % (limit / 1e6) if limit else "unlimited"
ratio = "%.3f" % (got / limit) if limit else "-"
print("%-12s %9.1f MB/s %8.1f MiB %8.2f s %9d %8s" % (
    req, got / 1e6, p["bytes_trimmed"] / 2**20, p["elapsed_seconds"], p["windows_total"], ratio))
' <<<"$json"
done
