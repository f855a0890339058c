#!/usr/bin/env bash
# `eval --backend e2b` at a realistic latency against `eval` on the local backend: the host
# CPU of the wmo-e2b process per task, each side at JOBS concurrent sandboxes, in one run.
# The e2b side talks to a `wmo-e2b emulator` on loopback through scripts/bench/e2b/delay_proxy.py
# (DELAY_MS added to every client-to-server read); the emulator's own CPU is the cloud's and
# is not counted.
#
#   scripts/bench/e2b/eval_latency.sh            # JOBS=200 TASKS=400 ROUNDS=2 DELAY_MS=20
#
# Prints one JSON line per run (scripts/bench/eval_run.py's) and a summary line at the end.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$(pwd)
. scripts/bench/e2b/procs.sh
JOBS=${JOBS:-200}
TASKS=${TASKS:-400}
ROUNDS=${ROUNDS:-2}
DELAY_MS=${DELAY_MS:-20}

cargo build --release --locked --quiet --bin wmo-e2b
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/wmo-e2b
work=$(mktemp -d "${TMPDIR:-/tmp}/wmo-e2b-evallat.XXXXXX")
emu_pid=
proxy_pid=
cleanup() { stop_pid "$proxy_pid"; stop_pid "$emu_pid"; rm -rf "$work"; }
trap cleanup EXIT

key="e2b_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
"$BIN" emulator --listen 127.0.0.1:0 --api-key "$key" --json --state-dir "$work/emu" \
  --max-sandboxes 2000 >"$work/emu.out" 2>"$work/emu.err" &
emu_pid=$!
url=$(url_of "$work/emu.out" "$emu_pid" 300) || { echo "eval_latency.sh: the emulator did not start:" >&2; cat "$work/emu.err" >&2; exit 1; }
python3 scripts/bench/e2b/delay_proxy.py --upstream "${url#http://}" --delay-ms "$DELAY_MS" \
  >"$work/proxy.out" 2>"$work/proxy.err" &
proxy_pid=$!
purl=$(url_of "$work/proxy.out" "$proxy_pid" 100) || { echo "eval_latency.sh: the latency proxy did not start:" >&2; cat "$work/proxy.err" >&2; exit 1; }

python3 scripts/bench/gen_tasks.py "$TASKS" "$work/tasks.jsonl" --delay-ms 200
unset E2B_DEBUG E2B_DOMAIN E2B_ACCESS_TOKEN
results=$work/results.jsonl
for r in $(seq "$ROUNDS"); do
  for side in local e2b; do
    if [[ $side == e2b ]]; then
      E2B_API_KEY=$key E2B_API_URL=$purl E2B_SANDBOX_URL=$purl \
        python3 scripts/bench/eval_run.py "$BIN" "$work/tasks.jsonl" "$JOBS" \
        --eval-arg=--backend --eval-arg=e2b --eval-arg=--create-rate --eval-arg=1000 \
        --eval-arg=--max-sandboxes --eval-arg="$JOBS"
    else
      python3 scripts/bench/eval_run.py "$BIN" "$work/tasks.jsonl" "$JOBS"
    fi | sed "s/^{/{\"round\":$r,\"side\":\"$side\",\"delay_ms\":$DELAY_MS,/" | tee -a "$results"
  done
done
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
per = lambda side: [1000 * r["cpu_s_self"] / r["finished"] for r in rows if r["side"] == side]
loc, e2b = statistics.median(per("local")), statistics.median(per("e2b"))
print(json.dumps({"summary": "host CPU per task, ms (median over rounds)", "local": round(loc, 2),
                  "e2b_through_proxy": round(e2b, 2), "ratio_e2b_to_local": round(e2b / loc, 2),
                  "goal": "<= 1.5", "passed": {s: [r["passed"] for r in rows if r["side"] == s]
                                               for s in ("local", "e2b")}}))
PY
