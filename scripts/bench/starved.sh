#!/usr/bin/env bash
# A run on a starved host: N tasks at -j N inside a cgroup v1 CPU quota of QUOTA_US per
# 100 ms (1500 = 1.5 % of one core), the wmo-e2b binary given. Prints the wall time and the
# tally; a healthy run records no task as `error` of its own making, however slow.
#
# usage (as root, cgroup v1 cpu controller): scripts/bench/starved.sh [BIN] [N] [QUOTA_US]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "${1:-target/release/wmo-e2b}")
n=${2:-12}
quota=${3:-1500}
cpu=/sys/fs/cgroup/cpu
[[ -w $cpu/cgroup.procs ]] || { echo "starved.sh: needs root and the cgroup v1 cpu controller at $cpu" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/wmo-e2b-starved.XXXXXX")
group=$cpu/wmo-e2b-starved-$$
cleanup() {
  # The group and what the run made inside it, deepest first.
  [[ -d $group ]] && find "$group" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mkdir "$group"
echo 100000 > "$group/cpu.cfs_period_us"
echo "$quota" > "$group/cpu.cfs_quota_us"
python3 scripts/bench/gen_tasks.py "$n" "$work/tasks.jsonl" --delay-ms 0
start=$(date +%s.%N)
set +e
sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$group" \
  env WMO_E2B_HOME="$work/state" "$bin" eval --tasks "$work/tasks.jsonl" -j "$n" --out "$work/out" --isolation bwrap \
  > "$work/eval.log" 2>&1
rc=$?
set -e
end=$(date +%s.%N)
python3 - "$work/out/results.jsonl" "$rc" "$start" "$end" <<'PY'
import collections, json, sys
path, rc, start, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
tally, errors = collections.Counter(), collections.Counter()
for line in open(path):
    r = json.loads(line)
    tally[r["status"]] += 1
    if r["status"] == "error":
        errors[(r.get("error") or "")[:120]] += 1
print(f"exit {rc}, wall {end - start:.1f} s, " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
for why, count in errors.most_common():
    print(f"  {count} x {why}")
PY
if [[ $rc != 0 ]]; then tail -5 "$work/eval.log"; fi
