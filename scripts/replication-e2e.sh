#!/usr/bin/env bash
# Off-site copy end to end (issue 22, RFC 0003), against a real SeaweedFS on loopback:
#   1. `sliver serve --replicate-to s3://…` takes writes from qemu-io (patterns per MiB);
#   2. once the API reports nothing left to ship, the array is killed with SIGKILL;
#   3. `sliver restore` builds a new data directory from the bucket alone;
#   4. `sliver serve` on it, and `qemu-img compare` finds its LUN equal to a local image that
#      took the same writes (incompressible data, duplicates, patterns, overwrites, zeros);
#   5. a named restore point restores its own state (by name and by time), scheduled points
#      are kept to their count and retention deletes the objects no point needs;
#   6. through scripts/fault-proxy.py: a slow store, a partition and resets leave hosts
#      unaffected, show lag, backlog and the error, and the copy drains and restores exactly;
#   7. a store hung at start and refused credentials: the array serves, the copy waits and
#      says why, and starts (with a base) once the store answers;
#   8. every restore is on demand: the array serves at once, `qemu-img compare` reads data not
#      yet fetched, hydration finishes in the background (and resumes after a SIGKILL);
#   9. (first) an endpoint without credentials: one sentence on how to give them, at once.
# Usage: replication-e2e.sh WEED SLIVER. Ends only the processes it started, by PID.
set -euo pipefail
# Reads a command's whole output before matching it: under pipefail, `cmd | grep -q` fails
# whenever grep stops reading at its match before `cmd` has written everything (EPIPE).
lists() { local pattern=$1; shift; local out; out=$("$@") && grep -q -- "$pattern" <<<"$out"; }
weed=$1
sliver=$2
work=$(mktemp -d /tmp/sliver-repl-e2e.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; done
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
weed_pid=$!
pids+=($weed_pid)
endpoint="http://127.0.0.1:$s3"
for _ in $(seq 1 240); do
  curl -s -o /dev/null "$endpoint" && break
  sleep 0.5
done
export AWS_ACCESS_KEY_ID=sliver AWS_SECRET_ACCESS_KEY=sliver-e2e AWS_REGION=us-east-1
url=s3://sliver-e2e/array1

# An endpoint and no credentials: `sliver restore` and `sliver serve --replicate-to` say so in
# one sentence, at once, before any request; never the cloud's instance metadata (were it
# tried, AWS_METADATA_ENDPOINT keeps it on a closed loopback port, and the sentence is missing).
nocreds() {
  env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY AWS_METADATA_ENDPOINT="http://127.0.0.1:$(port)" "$@"
}
said="no credentials are configured for $url at $endpoint: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
t0=$(date +%s%N)
if nocreds "$sliver" restore --from "$url" --s3-endpoint "$endpoint" --data-dir "$work/nc" 2>"$work/nc.err"; then
  echo "a restore without credentials succeeded" >&2
  exit 1
fi
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
grep -qF "$said" "$work/nc.err" || { cat "$work/nc.err" >&2; echo "no sentence on the missing credentials" >&2; exit 1; }
[ "$ms" -lt 3000 ] || { echo "a restore without credentials took $ms ms to fail" >&2; exit 1; }
[ ! -e "$work/nc" ] || { echo "a restore without credentials left $work/nc" >&2; exit 1; }
if nocreds timeout -s KILL 30 "$sliver" serve --data-dir "$work/nc" --capacity 1G --iscsi-listen 127.0.0.1:0 \
  --api-listen 127.0.0.1:0 --replicate-to "$url" --s3-endpoint "$endpoint" >"$work/nc.out" 2>&1; then
  echo "sliver serve --replicate-to without credentials exited 0" >&2
  exit 1
fi
grep -qF "$said" "$work/nc.out" || { cat "$work/nc.out" >&2; echo "serve: no sentence on the missing credentials" >&2; exit 1; }
echo "no credentials: $(grep -o 'no credentials are configured.*' "$work/nc.err")"

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
status() { curl -sf "$api/api/v1/replication"; }
field() { status | python3 -c "import json,sys; print(json.load(sys.stdin)[\"$1\"])"; }
# Wait until the copy holds every write (streaming, nothing left to ship).
drained() {
  for _ in $(seq 1 600); do
    if [ "$(field state)" = streaming ] && [ "$(field backlog_bytes)" = 0 ]; then return 0; fi
    sleep 0.2
  done
  echo "the copy did not drain: $(status)" >&2
  exit 1
}
# write CMDS...: the same writes to the LUN and to the expected image.
write() {
  qemu-io -f raw "$@" "$lun" >/dev/null
  qemu-io -f raw "$@" "$work/expected.img" >/dev/null
}
hstatus() { curl -sf "$api/api/v1/hydration"; }
hfield() { hstatus | python3 -c "import json,sys; print(json.load(sys.stdin)[\"$1\"])"; }
# Wait until a restored array holds every byte locally (its hydration state removed).
hydrated() {
  for _ in $(seq 1 1200); do
    [ "$(hfield done)" = True ] && [ ! -e "$1/engine/hydrate" ] && return 0
    sleep 0.1
  done
  echo "hydration did not finish: $(hstatus)" >&2
  exit 1
}
# restore_and_compare PREFIX DIR: the copy alone, served (on demand), equals the expected
# image, and hydration then finishes.
restore_and_compare() {
  "$sliver" restore --from "$1" --s3-endpoint "$endpoint" --data-dir "$2"
  serve "$2"
  qemu-img compare -f raw -F raw "$work/expected.img" "$lun"
  hydrated "$2"
  kill "$server"
  wait "$server" 2>/dev/null || true
}

write "${cmds[@]}"
drained
echo "replication: $(status)"
# A named restore point of this state; the writes after it must not be in it.
"$sliver" replication --api "$api" point before-hang
cp --sparse=always "$work/expected.img" "$work/point.img"
sleep 1.1
point_time=$(date -u +%Y-%m-%dT%H:%M:%SZ)
sleep 1.1
lists '^before-hang ' "$sliver" replication --api "$api" points || { echo "the point is not listed" >&2; exit 1; }
lists '^sliver_replication_newest_point_age_seconds' curl -sf "$api/metrics" || { echo "no restore point age metric" >&2; exit 1; }
lists '^newest restore point *before-hang at ' "$sliver" replication --api "$api" show || { echo "sliver replication show: no point" >&2; exit 1; }
lists '^sliver_replication_shipped_bytes_total' curl -sf "$api/metrics" || { echo "no replication metrics" >&2; exit 1; }

# The store hangs (SIGSTOP): hosts keep writing, the copy's backlog shows; then it drains.
head -c $((16 << 20)) /dev/urandom >"$work/random2"
kill -STOP "$weed_pid"
t0=$(date +%s%N)
write -c "write -s $work/random2 80M 16M" -c "write -P 77 96M 4M"
echo "20 MiB (16 MiB unique) written while the store hung, in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
backlog=$(field backlog_bytes)
[ "$backlog" -gt 0 ] || { echo "no backlog while the store hung: $(status)" >&2; exit 1; }
echo "while the store hung: $(status)"
kill -CONT "$weed_pid"
drained
echo "after it came back: $(status)"

# SIGKILL of the array; restore from the bucket alone.
kill -9 "$server"
wait "$server" 2>/dev/null || true
restore_and_compare "$url" "$work/b"
echo "restored array: equal to every write made before the kill"
# The point restores its own state, by name and by time.
"$sliver" restore --from "$url" --s3-endpoint "$endpoint" --list | tee "$work/list.txt"
grep -q '^before-hang ' "$work/list.txt"
"$sliver" restore --from "$url" --s3-endpoint "$endpoint" --point before-hang --data-dir "$work/p1"
serve "$work/p1"
qemu-img compare -f raw -F raw "$work/point.img" "$lun"
! qemu-img compare -q -f raw -F raw "$work/expected.img" "$lun" || { echo "the point holds later writes" >&2; exit 1; }
kill "$server"
wait "$server" 2>/dev/null || true
"$sliver" restore --from "$url" --s3-endpoint "$endpoint" --at "$point_time" --data-dir "$work/p2"
serve "$work/p2"
qemu-img compare -f raw -F raw "$work/point.img" "$lun"
kill "$server"
wait "$server" 2>/dev/null || true
if "$sliver" restore --from "$url" --s3-endpoint "$endpoint" --point nonesuch --data-dir "$work/p3" 2>"$work/p3.err"; then
  echo "a restore to a missing point succeeded" >&2
  exit 1
fi
grep -q 'no restore point named "nonesuch": it holds' "$work/p3.err" || { cat "$work/p3.err" >&2; exit 1; }
echo "restore points: by name and by time, each equal to its own state"
# The restored array is a fork: it ships nowhere until given a prefix of its own.
! grep -q "replicating" "$work/b.out"

# A backlog past its bound while the store hangs: the writes waiting are dropped (hosts
# unaffected) and the copy starts over online with a base while hosts keep writing.
cat >"$work/b.toml" <<TOML
[replication]
to = "s3://sliver-e2e/array2"
max_backlog = "32M"
interval = "1s"
points_every = "2s"
keep_points = 2
# The collector's relocations would take part of the small bound this test sets.
[gc]
priority = "off"
TOML
serve "$work/b" --config "$work/b.toml" --s3-endpoint "$endpoint"
drained
kill -STOP "$weed_pid"
head -c $((40 << 20)) /dev/urandom >"$work/random3"
write -c "write -s $work/random3 120M 40M"
[ "$(field state)" = base ] || { echo "no new base past the backlog bound: $(status)" >&2; exit 1; }
[ "$(field resyncs)" -ge 1 ] || { echo "no resync counted: $(status)" >&2; exit 1; }
echo "past the backlog bound: $(status)"
kill -CONT "$weed_pid"
write -c "write -P 99 170M 2M"
drained
# Scheduled points while writes go on; the copy that started over made the first base's
# objects unneeded once the two points kept build on the new one: retention deletes them.
for i in 1 2 3; do
  write -c "write -P $((100 + i)) $((180 + i))M 1M"
  sleep 2.5
done
drained
for _ in $(seq 1 100); do
  [ "$(field deleted_objects)" -gt 0 ] && break
  sleep 0.2
done
[ "$(field deleted_objects)" -gt 0 ] || { echo "retention deleted nothing: $(status)" >&2; exit 1; }
scheduled=$("$sliver" replication --api "$api" points | grep -c ' scheduled ' || true)
[ "$scheduled" -le 2 ] || { echo "$scheduled scheduled points kept, not 2" >&2; exit 1; }
echo "retention: $(field deleted_objects) objects deleted, $scheduled scheduled points kept"
kill -9 "$server"
wait "$server" 2>/dev/null || true
restore_and_compare s3://sliver-e2e/array2 "$work/c"
echo "copied again online after the backlog bound: restore equal"
# On demand, with the background fetches held to 1 MiB/s: hosts read data not yet fetched.
# (The array behind this copy was itself restored and opened, which checkpoints: what its
# recovery replays is small, so most data is still in the store when it serves.)
t0=$(date +%s%N)
"$sliver" restore --from s3://sliver-e2e/array2 --s3-endpoint "$endpoint" --data-dir "$work/od"
serve "$work/od" --hydrate-rate 1M/s
echo "restored on demand and serving in $(( ($(date +%s%N) - t0) / 1000000 )) ms: $(hstatus)"
left=$(hfield bytes_left)
[ "$left" -gt $((32 << 20)) ] || { echo "too little left in the store to test reads of it: $(hstatus)" >&2; exit 1; }
qemu-img compare -f raw -F raw "$work/expected.img" "$lun"
[ "$(hfield on_demand_fetches)" -gt 0 ] || { echo "no read waited for the store: $(hstatus)" >&2; exit 1; }
lists '^sliver_hydration_on_demand_fetches_total' curl -sf "$api/metrics" || { echo "no hydration metrics" >&2; exit 1; }
echo "read while $left bytes were in the store: equal; $(hstatus)"
# SIGKILL during hydration: the next start goes on from what the journal kept.
cp --sparse=always "$work/expected.img" "$work/od.img"
qemu-io -f raw -c "write -P 61 5M 1M" "$lun" >/dev/null
qemu-io -f raw -c "write -P 61 5M 1M" "$work/od.img" >/dev/null
kill -9 "$server"
wait "$server" 2>/dev/null || true
[ -e "$work/od/engine/hydrate/source" ] || { echo "hydration state gone before hydration finished" >&2; exit 1; }
serve "$work/od"
hydrated "$work/od"
qemu-img compare -f raw -F raw "$work/od.img" "$lun"
echo "after a SIGKILL while hydrating: finished, equal; $(hstatus)"
kill "$server"
wait "$server" 2>/dev/null || true
rm -f "$work/od.img"

# A faulty network between the array and the store (scripts/fault-proxy.py): a slow store, a
# partition, resets. Hosts are never held up; the API shows the backlog and the store's error;
# once the path heals the copy drains and the restore is exact.
proxy_port=$(port)
echo pass >"$work/fault"
python3 "$(dirname "$0")/fault-proxy.py" "$proxy_port" "127.0.0.1:$s3" "$work/fault" &
pids+=($!)
for _ in $(seq 1 50); do
  curl -s -o /dev/null "http://127.0.0.1:$proxy_port" && break
  sleep 0.1
done
# The array restored last holds every write the expected image took: it ships to a new prefix.
serve "$work/c" --replicate-to s3://sliver-e2e/array3 --s3-endpoint "http://127.0.0.1:$proxy_port"
drained
# timed_write CMDS...: the writes, printing how long the host waited.
timed_write() {
  local t0
  t0=$(date +%s%N)
  write "$@"
  echo "$(( ($(date +%s%N) - t0) / 1000000 ))"
}
head -c $((8 << 20)) /dev/urandom >"$work/random4"
echo "delay 300" >"$work/fault"
ms=$(timed_write -c "write -s $work/random4 200M 8M")
sleep 1
lag=$(field lag_seconds)
echo "store 300 ms away per chunk: 8 MiB written in $ms ms, lag $lag s"
python3 -c "import sys; sys.exit(0 if float('$lag') > 0 else 1)" || { echo "no lag behind a slow store: $(status)" >&2; exit 1; }
echo pass >"$work/fault"
drained
echo blackhole >"$work/fault"
ms=$(timed_write -c "write -P 55 210M 8M")
sleep 3
[ "$(field backlog_bytes)" -gt 0 ] || { echo "no backlog behind a partition: $(status)" >&2; exit 1; }
echo "partitioned from the store: 8 MiB written in $ms ms; $(status)"
echo pass >"$work/fault"
drained
echo reset >"$work/fault"
ms=$(timed_write -c "write -P 66 220M 8M")
for _ in $(seq 1 150); do
  [ "$(field error)" != None ] && break
  sleep 0.2
done
[ "$(field error)" != None ] || { echo "no store error shown while connections reset: $(status)" >&2; exit 1; }
echo "connections reset: 8 MiB written in $ms ms; error shown: $(field error)"
echo pass >"$work/fault"
drained
[ "$(field error)" = None ] || { echo "the error stayed after the store came back: $(status)" >&2; exit 1; }
kill -9 "$server"
wait "$server" 2>/dev/null || true
restore_and_compare s3://sliver-e2e/array3 "$work/f"
echo "a slow, partitioned and resetting store: the restore is equal"

# A store that hangs when the array starts does not keep the array from serving: the copy
# waits (state and reason in the API), starts once the store answers, and holds every write.
kill -STOP "$weed_pid"
t0=$(date +%s)
serve "$work/g" --replicate-to s3://sliver-e2e/array4 --s3-endpoint "$endpoint"
echo "served $(( $(date +%s) - t0 )) s after start with the store hung: $(status)"
[ "$(field state)" = waiting ] || { echo "not waiting for a hung store: $(status)" >&2; exit 1; }
[ "$(field error)" != None ] || { echo "no reason shown while waiting: $(status)" >&2; exit 1; }
qemu-io -f raw -c "write -P 92 0 4M" "$lun" >/dev/null
kill -CONT "$weed_pid"
drained
qemu-io -f raw -c "write -P 93 4M 4M" "$lun" >/dev/null
drained
kill -9 "$server"
wait "$server" 2>/dev/null || true
"$sliver" restore --from s3://sliver-e2e/array4 --s3-endpoint "$endpoint" --data-dir "$work/h"
serve "$work/h"
out=$(qemu-io -f raw -c "read -P 92 0 4M" -c "read -P 93 4M 4M" "$lun")
if grep -qi "fail" <<<"$out"; then echo "$out" >&2; exit 1; fi
kill "$server"
wait "$server" 2>/dev/null || true
echo "a store hung at start: the array served, the copy started later and holds every write"
# Credentials the store refuses: the array serves and the copy says why.
AWS_SECRET_ACCESS_KEY=wrong serve "$work/i" --replicate-to s3://sliver-e2e/array5 --s3-endpoint "$endpoint"
[ "$(field state)" = waiting ] || { echo "not waiting with refused credentials: $(status)" >&2; exit 1; }
echo "refused credentials: $(field error)"
kill "$server"
wait "$server" 2>/dev/null || true

# A second array on a prefix that holds another's copy is refused at start.
if "$sliver" serve --data-dir "$work/d" --capacity 1G --iscsi-listen 127.0.0.1:0 \
  --api-listen 127.0.0.1:0 --replicate-to "$url" --s3-endpoint "$endpoint" >"$work/d.out" 2>&1; then
  echo "a second array started on $url" >&2
  exit 1
fi
grep -q "already holds the copy of array" "$work/d.out" || { cat "$work/d.out" >&2; exit 1; }
echo "a second array on the same prefix: refused"
echo "replication end to end: passed"
