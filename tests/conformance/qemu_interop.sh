#!/usr/bin/env bash
# QEMU's iSCSI block driver (qemu-img / qemu-io, packages qemu-utils and qemu-block-extra)
# against a live target: info, convert in and out, compare, pattern I/O, discard and
# write-zeroes. Usage: qemu_interop.sh URL_A [URL_B]; URL_B may be the same LUN through
# another portal. Exits non-zero with a message on the first mismatch.
set -euo pipefail
url_a=$1
url_b=${2:-$1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "qemu interop: FAILED: $*" >&2; exit 1; }
ok() { echo "qemu interop: ok: $*"; }
# iscsi://HOST:PORT/IQN/LUN as the iscsi block driver's options.
iscsi_opts() {
  local rest=${1#iscsi://}
  IFS=/ read -r portal target lun <<<"$rest"
  echo "file.driver=iscsi,file.transport=tcp,file.portal=$portal,file.target=$target,file.lun=$lun"
}

qemu-img info "$url_a" >"$work/info" || fail "qemu-img info"
grep -q "file format: raw" "$work/info" || fail "qemu-img info: not raw: $(cat "$work/info")"
size=$(sed -n 's/.*virtual size: .*(\([0-9]*\) bytes).*/\1/p' "$work/info")
[ -n "$size" ] && [ "$size" -gt $((64 << 20)) ] || fail "qemu-img info: size '$size'"
ok "qemu-img info ($size bytes)"

# 48 MiB random data, 16 MiB of zeros: exercises data and zero detection on convert.
head -c $((48 << 20)) /dev/urandom >"$work/src.img"
head -c $((16 << 20)) /dev/zero >>"$work/src.img"
qemu-img convert -n -f raw -O raw "$work/src.img" "$url_a" || fail "convert into the LUN"
ok "qemu-img convert into $url_a"
qemu-img dd -f raw -O raw bs=1M count=64 if="$url_b" of="$work/back.img" \
  || fail "qemu-img dd out of the LUN"
cmp "$work/src.img" "$work/back.img" || fail "data read back differs from data written"
ok "qemu-img dd out of $url_b: identical"
# The first 64 MiB of the LUN as an image of its own, compared by QEMU itself.
qemu-img compare --image-opts "driver=raw,file.filename=$work/src.img" \
  "driver=raw,offset=0,size=$((64 << 20)),$(iscsi_opts "$url_a")" >/dev/null \
  || fail "qemu-img compare"
ok "qemu-img compare: identical"

off=$((100 << 20))
qemu-io -f raw -c "write -P 0xab $off 1M" -c "read -P 0xab $off 1M" "$url_a" >"$work/io" 2>&1 \
  || fail "qemu-io pattern write/read: $(cat "$work/io")"
qemu-io -f raw -c "read -P 0xab $off 1M" "$url_b" >"$work/io" 2>&1 \
  || fail "pattern not visible through the second URL: $(cat "$work/io")"
ok "qemu-io pattern write, read back through both URLs"
qemu-io -f raw -c "discard $off 1M" -c "read -P 0 $off 1M" "$url_a" >"$work/io" 2>&1 \
  || fail "discard then read zeros: $(cat "$work/io")"
ok "qemu-io discard reads back zeros"
qemu-io -f raw -c "write -P 0xcd $off 1M" -c "write -z -u $off 1M" -c "read -P 0 $off 1M" \
  "$url_a" >"$work/io" 2>&1 || fail "write -z -u: $(cat "$work/io")"
ok "qemu-io write-zeroes with unmap reads back zeros"
echo "qemu interop: all checks passed"
