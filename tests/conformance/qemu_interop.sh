#!/usr/bin/env bash
# QEMU's iSCSI block driver (qemu-img / qemu-io from qemu-utils; the driver itself comes from
# qemu-block-extra) against a live target: info, convert a local image in and back out, compare,
# pattern I/O including a sub-4KiB read-modify-write, discard and write-zeroes.
#
# Usage: qemu_interop.sh URL_A [URL_B]
#   URL_* are iscsi://HOST:PORT/IQN/LUN; URL_B may be the same LUN through another portal (then
#   every write through one portal is read back through the other). The LUN must be larger than
#   128 MiB and its data is overwritten. Each qemu command is bounded by QEMU_INTEROP_TIMEOUT
#   seconds (default 300). Exits non-zero with a message on the first mismatch.
#
# The discard and write-zeroes checks expect zeros back, i.e. a thin LUN reporting LBPRZ=1.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 iscsi://HOST:PORT/IQN/LUN [iscsi://HOST:PORT2/IQN/LUN]" >&2
  exit 2
fi
url_a=$1
url_b=${2:-$1}
limit=${QEMU_INTEROP_TIMEOUT:-300}
image_mib=64
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "qemu interop: FAILED: $*" >&2; exit 1; }
ok() { echo "qemu interop: ok: $*"; }
# Run a qemu tool with a time limit; its output goes to $work/out for the failure message.
bounded() { timeout -k 10 "$limit" "$@" >"$work/out" 2>&1; }
out() { tail -n 20 "$work/out"; }

# qemu's --image-opts form of iscsi://HOST:PORT/IQN/LUN, limited to the first $image_mib MiB
# of the LUN so that convert and compare see an image the size of the local one.
window_opts() {
  local rest=${1#iscsi://} portal target lun
  IFS=/ read -r portal target lun <<<"$rest"
  [ -n "$portal" ] && [ -n "$target" ] && [ -n "$lun" ] || fail "cannot parse URL '$1'"
  echo "driver=raw,offset=0,size=$((image_mib << 20)),file.driver=iscsi,file.transport=tcp,file.portal=$portal,file.target=$target,file.lun=$lun"
}

command -v qemu-img >/dev/null && command -v qemu-io >/dev/null \
  || fail "qemu-img/qemu-io not found (install qemu-utils and qemu-block-extra)"

# 1. The LUN is visible, raw, and the same size through both URLs.
size_of() {
  bounded qemu-img info --output=json "$1" || fail "qemu-img info $1: $(out)"
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["virtual-size"])' "$work/out" \
    || fail "qemu-img info $1: unreadable output: $(out)"
}
size_a=$(size_of "$url_a")
size_b=$(size_of "$url_b")
[ "$size_a" = "$size_b" ] || fail "size differs between portals: $size_a vs $size_b bytes"
[ "$size_a" -gt $((128 << 20)) ] || fail "LUN too small for these checks: $size_a bytes"
ok "qemu-img info: $size_a bytes through both URLs"

# 2. A local image of random data followed by zeros, into the LUN through URL_A and back out
#    through URL_B. The zero tail exercises qemu's zero detection (WRITE SAME / UNMAP).
head -c $(((image_mib - 16) << 20)) /dev/urandom >"$work/src.img"
head -c $((16 << 20)) /dev/zero >>"$work/src.img"
bounded qemu-img convert -n -f raw -O raw "$work/src.img" "$url_a" \
  || fail "qemu-img convert into $url_a: $(out)"
ok "qemu-img convert of a ${image_mib} MiB image into $url_a"
bounded qemu-img convert --image-opts "$(window_opts "$url_b")" -O raw "$work/back.img" \
  || fail "qemu-img convert out of $url_b: $(out)"
cmp -s "$work/src.img" "$work/back.img" \
  || fail "data read back through $url_b differs from data written: $(cmp "$work/src.img" "$work/back.img" 2>&1 | head -n 1)"
ok "qemu-img convert back out of $url_b: byte-identical"
bounded qemu-img compare --image-opts "driver=raw,file.filename=$work/src.img" "$(window_opts "$url_a")" \
  || fail "qemu-img compare: $(out)"
grep -q "Images are identical" "$work/out" || fail "qemu-img compare: $(out)"
ok "qemu-img compare: Images are identical"

# 3. Pattern I/O beyond the converted region, read back through the other URL.
off=$((100 << 20))
bounded qemu-io -f raw -c "write -P 0xab $off 1M" -c "read -P 0xab $off 1M" "$url_a" \
  || fail "qemu-io write/read 0xab at $off: $(out)"
bounded qemu-io -f raw -c "read -P 0xab $off 1M" "$url_b" \
  || fail "pattern 0xab not visible through $url_b: $(out)"
ok "qemu-io 1 MiB pattern write, read back through both URLs"
# 512-byte-aligned but not 4 KiB-aligned: the target must merge it into its larger blocks.
bounded qemu-io -f raw -c "write -P 0x5a $((off + 512)) 3584" "$url_a" \
  || fail "qemu-io sub-4KiB write: $(out)"
bounded qemu-io -f raw -c "read -P 0xab $off 512" -c "read -P 0x5a $((off + 512)) 3584" \
  -c "read -P 0xab $((off + 4096)) 4096" "$url_b" \
  || fail "sub-4KiB write damaged its neighbours or was lost: $(out)"
ok "qemu-io sub-4KiB write leaves its neighbours intact"

# 4. Discard and write-zeroes (with unmap) read back as zeros.
bounded qemu-io -f raw -c "discard $off 1M" -c "read -P 0 $off 1M" "$url_a" \
  || fail "discard, then read zeros: $(out)"
ok "qemu-io discard reads back zeros"
bounded qemu-io -f raw -c "write -P 0xcd $off 1M" -c "write -z -u $off 1M" "$url_a" \
  || fail "write -z -u: $(out)"
bounded qemu-io -f raw -c "read -P 0 $off 1M" "$url_b" \
  || fail "write-zeroes with unmap, read zeros through $url_b: $(out)"
ok "qemu-io write-zeroes with unmap reads back zeros"
echo "qemu interop: all checks passed"
