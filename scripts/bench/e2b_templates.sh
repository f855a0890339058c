#!/usr/bin/env bash
# Task environments on E2B, through the emulator: N tasks on one image at -j J, run twice
# with `eval --backend e2b`. The first run makes the image's template (this machine resolves
# the image and uploads the runner's Node.js; the emulator builds it with buildah), the
# second finds it by its record; the same tasks on `base` (no image) are the anchor. Prints
# each run's wall time and the ratios.
#
# usage (as root; docker-registry, buildah, busybox-static installed):
#   scripts/bench/e2b_templates.sh [BIN] [N] [J]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "${1:-target/release/wmo-e2b}")
n=${2:-16}
jobs=${3:-4}
work=$(mktemp -d "${TMPDIR:-/tmp}/wmo-e2b-templates.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
source scripts/lib/loopback-registry.sh
start_loopback_registry "$work"
pids+=("$REGISTRY_PID")

key="e2b_$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
WMO_E2B_HOME=$work/home "$bin" emulator --listen 127.0.0.1:0 --api-key "$key" --json \
  --state-dir "$work/emulator" >"$work/emulator.out" 2>"$work/emulator.err" &
pids+=($!)
for _ in $(seq 300); do [[ -s $work/emulator.out ]] && break; sleep 0.1; done
url=$(python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["url"])' <"$work/emulator.out")

tasks() { # IMAGE ('' for none) > tasks.jsonl
  python3 - "$1" "$n" <<'PY'
import json, sys
image, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    task = {"id": f"t{i:03}", "instruction": "x", "verify": "test -s out.txt",
            "model_script": [
                {"tool_calls": [{"name": "bash", "arguments": {"command": f"echo {i} > out.txt"}}]},
                {"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]}]}
    if image:
        task["image"] = image
    print(json.dumps(task))
PY
}
tasks "$REGISTRY/wmo/base:1" >"$work/image.jsonl"
tasks "" >"$work/base.jsonl"

run() { # NAME TASKS: prints the wall seconds
  local start end
  start=$(date +%s.%N)
  env WMO_E2B_HOME="$work/home" E2B_API_KEY="$key" E2B_API_URL="$url" E2B_SANDBOX_URL="$url" \
    "$bin" eval --backend e2b --tasks "$2" -j "$jobs" --out "$work/out-$1" >"$work/$1.log" 2>&1 \
    || { echo "e2b_templates.sh: the $1 run failed:" >&2; tail -5 "$work/$1.log" >&2; exit 1; }
  end=$(date +%s.%N)
  python3 -c "print(round($end - $start, 2))"
}
base=$(run base "$work/base.jsonl")
cold=$(run cold "$work/image.jsonl")
warm=$(run warm "$work/image.jsonl")
python3 - "$n" "$jobs" "$base" "$cold" "$warm" <<'PY'
import sys
n, j, base, cold, warm = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:])
print(f"{n} tasks at -j {j}: on base {base:.2f} s; on the image, first run (template made) "
      f"{cold:.2f} s, second run (template found) {warm:.2f} s")
print(f"second / first: {warm / cold:.2f}; second / base: {warm / base:.2f}; "
      f"template made in about {cold - warm:.1f} s")
PY
