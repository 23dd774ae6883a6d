#!/usr/bin/env bash
# Off-site copy end to end (issue 22, RFC 0003), against a real SeaweedFS on loopback:
#   1. `sliver serve --replicate-to s3://…` takes writes from qemu-io (patterns per MiB);
#   2. once the API reports nothing left to ship, the array is killed with SIGKILL;
#   3. `sliver restore` builds a new data directory from the bucket alone;
#   4. `sliver serve` on it, and `qemu-img compare` finds its LUN equal to a local image that
#      took the same writes (incompressible data, duplicates, patterns, overwrites, zeros).
# Usage: replication-e2e.sh WEED SLIVER. Ends only the processes it started, by PID.
set -euo pipefail
weed=$1
sliver=$2
work=$(mktemp -d /tmp/sliver-repl-e2e.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail_log() { echo "--- weed.log" >&2; tail -20 "$work/weed.log" >&2 || true; }
trap fail_log ERR

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
s3=$(port)
args=(mini "-dir=$work/weed" -ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false
  -admin.ui=false -webdav=false -s3.port.iceberg=0 -bucket=sliver-e2e "-s3.port=$s3")
for flag in master.port master.port.grpc volume.port volume.port.grpc filer.port filer.port.grpc \
  s3.port.grpc admin.port admin.port.grpc; do
  args+=("-$flag=$(port)")
done
mkdir -p "$work/weed"
AWS_ACCESS_KEY_ID=sliver AWS_SECRET_ACCESS_KEY=sliver-e2e "$weed" "${args[@]}" >"$work/weed.log" 2>&1 &
pids+=($!)
endpoint="http://127.0.0.1:$s3"
for _ in $(seq 1 240); do
  curl -s -o /dev/null "$endpoint" && break
  sleep 0.5
done
export AWS_ACCESS_KEY_ID=sliver AWS_SECRET_ACCESS_KEY=sliver-e2e AWS_REGION=us-east-1
url=s3://sliver-e2e/array1

# serve DIR [extra args]: starts sliver, sets $api and $lun from its first lines.
serve() {
  local dir=$1
  shift
  "$sliver" serve --data-dir "$dir" --capacity 2G --iscsi-listen 127.0.0.1:0 \
    --api-listen 127.0.0.1:0 "$@" >"$dir.out" 2>&1 &
  pids+=($!)
  server=$!
  # Up to 3 minutes: a store still starting answers errors the client retries for a while.
  for _ in $(seq 1 1800); do
    api=$(sed -n 's/^API: \(http[^ ]*\).*/\1/p' "$dir.out" | head -1)
    lun=$(grep -o 'iscsi://[^ ]*' "$dir.out" | head -1 || true)
    [ -n "$api" ] && [ -n "$lun" ] && return 0
    kill -0 "$server" 2>/dev/null || { cat "$dir.out"; echo "sliver serve exited" >&2; exit 1; }
    sleep 0.1
  done
  cat "$dir.out"
  echo "sliver serve did not start" >&2
  exit 1
}

# Wait for the object store to answer before the array probes it.
for _ in $(seq 1 240); do
  curl -s "$endpoint/sliver-e2e" >/dev/null && break
  sleep 0.5
done
serve "$work/a" --replicate-to "$url" --s3-endpoint "$endpoint"
echo "serving $lun, replicating to $url"
# The same writes go to a local image: the restored LUN must equal it byte for byte.
head -c $((32 << 20)) /dev/urandom >"$work/random"
truncate -s 10G "$work/expected.img"
cmds=(-c "write -s $work/random 0 32M" -c "write -s $work/random 32M 32M")
for i in $(seq 0 15); do
  cmds+=(-c "write -P $((i + 1)) $((64 + i))M 1M")
done
# Overwrites and a zeroed range: the restore must show the newest.
cmds+=(-c "write -P 251 3M 1M" -c "write -s $work/random 70M 4M" -c "write -z 40M 1M")
qemu-io -f raw "${cmds[@]}" "$lun" >/dev/null
qemu-io -f raw "${cmds[@]}" "$work/expected.img" >/dev/null
status() { curl -sf "$api/api/v1/replication"; }
for _ in $(seq 1 600); do
  s=$(status)
  if echo "$s" | python3 -c 'import json,sys; r=json.load(sys.stdin); sys.exit(0 if r["state"]=="streaming" and r["backlog_bytes"]==0 and r["shipped_objects"]>0 else 1)'; then
    break
  fi
  sleep 0.2
done
echo "replication: $(status)"
echo "$s" | python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["state"]=="streaming" and r["backlog_bytes"]==0, r'
curl -sf "$api/metrics" | grep -q '^sliver_replication_shipped_bytes_total' || { echo "no replication metrics" >&2; exit 1; }
kill -9 "$server"
wait "$server" 2>/dev/null || true

"$sliver" restore --from "$url" --s3-endpoint "$endpoint" --data-dir "$work/b"
serve "$work/b"
qemu-img compare -f raw -F raw "$work/expected.img" "$lun"
echo "restored array: equal to every write made before the kill"
# The restored array is a fork: it ships nowhere and the source's prefix is not its own.
! grep -q "replicating" "$work/b.out"
echo "replication end to end: passed"
