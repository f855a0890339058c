#!/usr/bin/env bash
# E2B client, reap and snapshot benchmarks: ours against the official E2B Python SDK (pinned in
# scripts/e2b-requirements.txt), every ratio measured in this one run against ONE
# `wmo-e2b emulator` instance.
#
#   scripts/bench/e2b/run.sh              # everything (2.5-4 min on 2 cores, plus the build)
#   ROUNDS=1 scripts/bench/e2b/run.sh     # one round of each, for checking the script
#
# Measures (see scripts/bench/e2b/RESULTS.md for the method and the last results):
#   1a  50 x (create -> run `true` -> kill), in sequence           bench_e2b_client seq
#   1b  stdout throughput of one 50 MB command                      bench_e2b_client stream
#   1c  100 x (create -> run `true` -> kill) on 100 threads         bench_e2b_client concurrent
#   2   `wmo-e2b reap --backend e2b` of 500 leaked sandboxes vs a sequential kill loop
#   3   `project snapshot` of a 1,000-file, 8,000,000-byte tree vs SDK files.list + files.read
# Client rounds alternate which side goes first; tables report medians over rounds.
# Also: diagnostics (per-operation latency and new TCP connections on one warm sandbox, the
# defaults' rate gate, a snapshot breakdown, reap phases with the ledger on disk and tmpfs),
# and 1a-1c, reap and snapshot again through scripts/bench/e2b/delay_proxy.py, which adds
# DELAY_MS (default 20) to every client-to-server read (DELAY_ROUNDS client rounds).
#
# Needs cargo, node >= 18 (the snapshot walker), python3 with venv (the SDK venv is
# target/e2b-venv, shared with scripts/conformance.sh and created the same way if missing),
# and ss (iproute2) for the connection counts (they read 0 without it).
# Output: $OUT (default target/bench/e2b/<UTC stamp>): results.jsonl (every measurement),
# machine.txt, summary.md (the tables, also printed). Stops the emulator and the latency proxy
# it starts, and fails if any sandbox outlived the run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$(pwd)
. scripts/bench/e2b/procs.sh

ROUNDS=${ROUNDS:-7}          # client and snapshot rounds
REAP_ROUNDS=${REAP_ROUNDS:-5}
DELAY_MS=${DELAY_MS:-20}     # the latency proxy's delay (the latency rows)
DELAY_ROUNDS=${DELAY_ROUNDS:-3}  # client rounds through the latency proxy
OUT=${OUT:-$ROOT/target/bench/e2b/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
RES=$OUT/results.jsonl
: > "$RES"

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "run.sh: $1 is not installed: $2" >&2; exit 2; }; }
need python3 "install Python 3.9 or newer with the venv module"
need cargo "install Rust with rustup (https://rustup.rs)"
need node "install Node.js 18 or newer (the snapshot walker runs in the sandbox)"

# --- the SDK venv, the one scripts/conformance.sh makes ---------------------------------
venv=target/e2b-venv
source scripts/lib/venv.sh
pinned_venv "$venv" scripts/e2b-requirements.txt run.sh
PY=$ROOT/$venv/bin/python
SDK="$PY $ROOT/scripts/bench/e2b/sdk_bench.py"

log "building (release)"
cargo build --release --locked --quiet --bin wmo-e2b \
  --example bench_e2b_client --example bench_e2b_reap --example bench_e2b_snapshot
T=${CARGO_TARGET_DIR:-$ROOT/target}/release
BIN=$T/wmo-e2b
CLIENT=$T/examples/bench_e2b_client
REAP=$T/examples/bench_e2b_reap
SNAP=$T/examples/bench_e2b_snapshot

{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpus: $(nproc)"
  echo "cpu_model: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "mem_total: $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
  echo "kernel: $(uname -r)"
  echo "rustc: $(rustc --version)"
  echo "python: $("$PY" --version 2>&1), e2b $("$PY" -c 'import importlib.metadata as m; print(m.version("e2b"))')"
  echo "node: $(node --version)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD -- src 2>/dev/null || echo ' (src/ has uncommitted changes)')"
  echo "delay_ms: $DELAY_MS"
  echo "loadavg_at_start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

# --- one emulator for everything --------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/wmo-e2b-bench.XXXXXX")
key="e2b_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
emu_pid=
proxy_pid=
project=
cleanup() {
  if [[ -n "$project" ]]; then
    WMO_E2B_HOME=$work/home-proj "$BIN" project close "$project" --backend e2b >/dev/null 2>&1 || true
  fi
  stop_pid "$proxy_pid"; proxy_pid=
  stop_pid "$emu_pid"; emu_pid=
  rm -rf "$work" /dev/shm/wmo-e2b-bench-$$
}
trap cleanup EXIT

"$BIN" emulator --listen 127.0.0.1:0 --api-key "$key" --json --state-dir "$work/emu" \
  --max-sandboxes 2000 >"$work/emu.out" 2>"$work/emu.err" &
emu_pid=$!
url=$(url_of "$work/emu.out" "$emu_pid" 300) || true
[[ -n "$url" ]] || { echo "run.sh: the emulator did not start:" >&2; cat "$work/emu.err" >&2; exit 1; }
log "emulator $url (pid $emu_pid, --max-sandboxes 2000)"

unset E2B_DEBUG E2B_DOMAIN E2B_ACCESS_TOKEN
export E2B_API_KEY=$key E2B_API_URL=$url E2B_SANDBOX_URL=$url WMO_BENCH_EMULATOR_PID=$emu_pid
export WMO_E2B_HOME=$work/home

# Appends every JSON line of a command's stdout to results.jsonl, tagged with round and label.
rec() {
  local round=$1 label=$2
  shift 2
  "$@" | sed -u "s/^{/{\"round\":$round,\"label\":\"$label\",/" | tee -a "$RES" >/dev/null
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.6f", b - a }'; }

# --- diagnostics first, on a port no earlier connection has touched ----------------------------
# Per-operation latency on one warm sandbox, and how many new TCP connections each kind of
# operation opened (TIME-WAIT sockets on the emulator's port; only this script talks to it).
port=${url##*:}
tw() { ss -tan state time-wait 2>/dev/null | grep -c ":$port\b" || true; }
ops_rec() { # LABEL CMD...: one JSON line, plus the new-connection count
  local label=$1 before line
  shift
  before=$(tw)
  line=$("$@")
  echo "{\"round\":0,\"label\":\"$label\",\"new_connections\":$(( $(tw) - before )),${line#\{}" >> "$RES"
}
log "diagnostics: per-operation latency and connection reuse"
for op in run spawn read write; do ops_rec ops "$CLIENT" ops --op "$op" --k 40; done
ops_rec ops $SDK ops --k 40
# CreateSpec::default() has internet off: the emulator then starts every process in a new
# network namespace. The comparisons use internet on, the SDK's default.
WMO_BENCH_INTERNET=0 ops_rec ops-no-internet "$CLIENT" ops --op run --k 40
"$CLIENT" captured --bytes 50000000 --chunk 65536 --max 1048576 \
  | sed 's/^{/{"round":0,"label":"captured",/' >> "$RES"

# --- 1. client: ours vs the SDK -------------------------------------------------------------
OURS_OPTS=(--create-rate 10000 --max-sandboxes 200)  # the gate and the cap out of the way
# client_rounds ROUNDS SUFFIX: 1a-1c, both sides, alternating which goes first; each label
# gets SUFFIX. The E2B_* variables in force say where both sides connect.
client_rounds() {
  local rounds=$1 suffix=$2 r side sides
  for r in $(seq "$rounds"); do
    log "client round $r/$rounds${suffix:+ ($suffix)}"
    sides=(ours sdk)
    (( r % 2 == 0 )) && sides=(sdk ours)
    for side in "${sides[@]}"; do
      if [[ $side == ours ]]; then
        rec "$r" "seq$suffix" "$CLIENT" seq --n 50 "${OURS_OPTS[@]}"
        rec "$r" "stream$suffix" "$CLIENT" stream --bytes 50000000 --via run
        rec "$r" "stream-spawn$suffix" "$CLIENT" stream --bytes 50000000 --via spawn
        rec "$r" "concurrent$suffix" "$CLIENT" concurrent --n 100 "${OURS_OPTS[@]}"
      else
        rec "$r" "seq$suffix" $SDK seq --n 50
        rec "$r" "stream$suffix" $SDK stream --bytes 50000000
        rec "$r" "concurrent$suffix" $SDK concurrent --n 100 --threads 100
      fi
    done
  done
}
client_rounds "$ROUNDS" ""

# The same sequence under E2bOptions::default(): the create-rate gate (4/s) then sets the pace.
log "client: seq with default options (rate gate 4/s)"
rec 0 seq-default-options "$CLIENT" seq --n 50 --create-rate 4 --max-sandboxes 20

# --- 2. reap vs a sequential kill loop ----------------------------------------------------
# Each measurement gets its own leak: 500 sandboxes created through LeasedBackend over
# E2bBackend by a process that then exits without killing them (its leases name a dead pid).
leak() { # HOME ROUND: leaks 500 into HOME, records the leak, prints the run tag
  local line
  line=$(WMO_E2B_HOME=$1 "$REAP" leak --n 500 --threads 16)
  echo "{\"round\":$2,\"label\":\"leak\",${line#\{}" >> "$RES"
  python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["run"])' <<<"$line"
}
reap_cli() { # HOME ROUND LABEL [API_URL]: times `wmo-e2b reap --backend e2b` on HOME
  local t rc=0 secs
  t=$(now)
  WMO_E2B_HOME=$1 E2B_API_URL=${4:-$url} "$BIN" reap --backend e2b --json >"$work/reap.json" || rc=$?
  secs=$(since "$t")
  python3 - "$work/reap.json" "$2" "$3" "$secs" "$rc" >> "$RES" <<'EOF'
import collections, json, sys
path, rnd, label, secs, rc = sys.argv[1:]
d = json.load(open(path))
c = collections.Counter(x["result"] for x in d["candidates"])
print(json.dumps({"round": int(rnd), "label": label, "client": "ours", "bench": "reap-cli",
                  "seconds": float(secs), "exit": int(rc), "candidates": len(d["candidates"]),
                  "results": c, "failed": d["failed"]}))
EOF
  [[ $rc == 0 ]] || { echo "run.sh: reap exited $rc" >&2; return 1; }
}
kill_loop() { # HOME ROUND LABEL RUN [API_URL]
  WMO_E2B_HOME=$1 E2B_API_URL=${5:-$url} "$REAP" kill-loop --run "$4" \
    | sed "s/^{/{\"round\":$2,\"label\":\"$3\",/" >> "$RES"
  # Retire the leases the loop left (untimed), so the emulator and the ledger agree.
  WMO_E2B_HOME=$1 "$BIN" reap --backend e2b --json >/dev/null
}
for r in $(seq "$REAP_ROUNDS"); do
  log "reap round $r/$REAP_ROUNDS"
  sides=(reap loop)
  (( r % 2 == 0 )) && sides=(loop reap)
  for side in "${sides[@]}"; do
    home=$work/reap-$r-$side
    run=$(leak "$home" "$r")
    if [[ $side == reap ]]; then
      reap_cli "$home" "$r" reap
    else
      kill_loop "$home" "$r" kill-loop "$run"
    fi
  done
done
log "reap diagnostics: phases in process, ledger on disk and on tmpfs"
leak "$work/reap-lib-disk" 0 >/dev/null
WMO_E2B_HOME=$work/reap-lib-disk "$REAP" reap-lib \
  | sed 's/^{/{"round":0,"label":"reap-lib-disk",/' >> "$RES"
if [[ -d /dev/shm && -w /dev/shm ]]; then
  shm=/dev/shm/wmo-e2b-bench-$$
  leak "$shm" 0 >/dev/null
  WMO_E2B_HOME=$shm "$REAP" reap-lib | sed 's/^{/{"round":0,"label":"reap-lib-tmpfs",/' >> "$RES"
  rm -rf "$shm"
fi

# --- 3. project snapshot vs the SDK's list + read --------------------------------------------
log "snapshot: creating and filling the project"
export WMO_E2B_HOME=$work/home-proj
project=bench-snap
"$BIN" project create "$project" --backend e2b --timeout 1h >/dev/null
pop=$("$SNAP" populate --name "$project" --dir tree --files 1000 --bytes 8000000)
echo "{\"round\":0,\"label\":\"populate\",${pop#\{}" >> "$RES"
read -r sbx path < <(python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["sandbox_id"], d["path"])' <<<"$pop")
for r in $(seq "$ROUNDS"); do
  log "snapshot round $r/$ROUNDS"
  sides=(ours sdk)
  (( r % 2 == 0 )) && sides=(sdk ours)
  for side in "${sides[@]}"; do
    if [[ $side == ours ]]; then
      rec "$r" snapshot "$SNAP" snapshot --name "$project" --dir tree --reps 1
      # End to end: the CLI process, its project open (connect), the harvest, JSON out.
      t=$(now)
      "$BIN" project snapshot "$project" tree --backend e2b --json >"$work/snap.json"
      echo "{\"round\":$r,\"label\":\"snapshot-e2e\",\"client\":\"ours\",\"seconds\":$(since "$t")}" >> "$RES"
    else
      rec "$r" snapshot $SDK harvest --sandbox "$sbx" --dir "$path" --depth 3 --reps 1
      # End to end: interpreter start, SDK import, connect, the harvest.
      t=$(now)
      $SDK harvest --sandbox "$sbx" --dir "$path" --depth 3 --reps 1 >/dev/null
      echo "{\"round\":$r,\"label\":\"snapshot-e2e\",\"client\":\"sdk\",\"seconds\":$(since "$t")}" >> "$RES"
    fi
  done
done
rec 0 snapshot-breakdown "$SNAP" snapshot --name "$project" --dir tree --reps 1 --breakdown

# --- secondary: the same through a proxy adding DELAY_MS per client-to-server read -----------
log "latency proxy (${DELAY_MS} ms): client, snapshot, reap, kill loop"
python3 scripts/bench/e2b/delay_proxy.py --upstream "${url#http://}" --delay-ms "$DELAY_MS" \
  >"$work/proxy.out" 2>"$work/proxy.err" &
proxy_pid=$!
purl=$(url_of "$work/proxy.out" "$proxy_pid" 100) || true
[[ -n "$purl" ]] || { echo "run.sh: the latency proxy did not start" >&2; cat "$work/proxy.err" >&2; exit 1; }
# The client comparisons (1a-1c) again at that latency, both sides through the proxy.
E2B_API_URL=$purl E2B_SANDBOX_URL=$purl client_rounds "$DELAY_ROUNDS" -delay
E2B_API_URL=$purl E2B_SANDBOX_URL=$purl rec 0 snapshot-delay \
  "$SNAP" snapshot --name "$project" --dir tree --reps 1
E2B_API_URL=$purl E2B_SANDBOX_URL=$purl rec 0 snapshot-delay \
  $SDK harvest --sandbox "$sbx" --dir "$path" --depth 3 --reps 1
leak "$work/reap-delay-reap" 0 >/dev/null
reap_cli "$work/reap-delay-reap" 0 reap-delay "$purl"
run=$(leak "$work/reap-delay-loop" 0)
kill_loop "$work/reap-delay-loop" 0 kill-loop-delay "$run" "$purl"
stop_pid "$proxy_pid"; proxy_pid=

# --- the end: nothing may be left ----------------------------------------------------------
"$BIN" project close "$project" --backend e2b >/dev/null
project=
left=$("$REAP" count)
echo "loadavg_at_end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
stop_pid "$emu_pid"; emu_pid=
status=0
if [[ "$left" != 0 ]]; then
  echo "run.sh: $left sandbox(es) were still listed before the emulator stopped" >&2
  status=1
fi
on_disk=$(find "$work/emu/sandboxes" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
if [[ "$on_disk" != 0 ]] || ! grep -q '"type":"stopped"' "$work/emu.out"; then
  echo "run.sh: the emulator did not stop cleanly ($on_disk sandbox dir(s) left)" >&2
  tail -n 20 "$work/emu.err" >&2
  status=1
fi
python3 scripts/bench/e2b/summarize.py "$OUT" | tee "$OUT/summary.md"
log "results: $OUT"
exit $status
