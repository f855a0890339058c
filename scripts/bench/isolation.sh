#!/usr/bin/env bash
# What confinement costs, in one run (BENCHMARKS.md: "Eval throughput at `-j 16` and `-j 64`",
# "Reset sandbox against a cold one", "Runner spawn-to-hello"):
#   - runner spawn-to-hello under bwrap against unconfined, interleaved;
#   - a task's wall time on a reused (reset) sandbox against a cold one, under bwrap, and
#     what the reset costs per task;
#   - `eval -j 16` throughput against 16 x `-j 1`, under bwrap (`--isolation auto` here).
#
#   scripts/bench/isolation.sh            # ~3 min on 2 cores
#   QUICK=1 scripts/bench/isolation.sh    # smaller counts, to check the script itself
#
# Needs cargo, node >= 18, python3 and a working bwrap. Results: a JSON Lines file per
# measurement and summary.md in target/bench/isolation-<UTC stamp>/ (also printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/target/bench/isolation-$(date -u +%Y%m%dT%H%M%SZ)}
QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then
  HELLO_REPS=6; CYCLE_REPS=2; WARM=4; J1_TASKS=4; J16_TASKS=32; RUNS=1
else
  HELLO_REPS=30; CYCLE_REPS=10; WARM=10; J1_TASKS=20; J16_TASKS=320; RUNS=2
fi
mkdir -p "$OUT"
echo "results: $OUT"
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpus: $(nproc)"
  echo "kernel: $(uname -r)"
  echo "bwrap: $(bwrap --version 2>/dev/null || echo missing)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo '+dirty')"
  echo "loadavg_at_start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

cargo build --release --locked --bin wmo-e2b --example bench_episode > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log" >&2; exit 1; }
BIN=$ROOT/target/release/wmo-e2b
EX=$ROOT/target/release/examples

echo "spawn-to-hello, $HELLO_REPS reps" >&2
"$EX/bench_episode" hello-isolation --reps "$HELLO_REPS" >> "$OUT/hello.jsonl"
echo "cold vs warm task, $CYCLE_REPS pools x (1 cold + $WARM warm)" >&2
"$EX/bench_episode" cycle --reps "$CYCLE_REPS" --warm "$WARM" --isolation bwrap >> "$OUT/cycle.jsonl"
python3 scripts/bench/gen_tasks.py "$J1_TASKS" "$OUT/tasks_j1.jsonl" --delay-ms 200
python3 scripts/bench/gen_tasks.py "$J16_TASKS" "$OUT/tasks_j16.jsonl" --delay-ms 200
for r in $(seq 1 "$RUNS"); do
  for j in 1 16; do
    echo "eval -j $j, run $r" >&2
    python3 scripts/bench/eval_run.py "$BIN" "$OUT/tasks_j$j.jsonl" "$j" >> "$OUT/scaling.jsonl"
  done
done
echo "loadavg_at_end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, statistics, sys
out = sys.argv[1]
rows = lambda f: [json.loads(l) for l in open(f"{out}/{f}") if l.strip()]
hello = rows("hello.jsonl")[-1]
cycle = rows("cycle.jsonl")[-1]
scaling = rows("scaling.jsonl")
tput = {j: statistics.median(r["tasks_per_s"] for r in scaling if r["jobs"] == j) for j in (1, 16)}
steady = {j: statistics.median((r["steady_tasks_per_s"] or r["tasks_per_s"]) for r in scaling if r["jobs"] == j) for j in (1, 16)}
ok = all(r["passed"] == r["tasks"] for r in scaling)
def verdict(v, goal, le=True):
    return "**met**" if (v <= goal if le else v >= goal) else "**missed**"
w, c = cycle["warm"]["total_ms"], cycle["cold"]["total_ms"]
r_hello = hello["bwrap_over_none"]
r_scale = tput[16] / (16 * tput[1])
r_steady = steady[16] / (16 * steady[1])
print("| measure | ours | baseline (same run) | ratio | goal | verdict |")
print("|---|---|---|---|---|---|")
print(f"| runner spawn-to-hello, bwrap vs `--isolation none` (median of {hello['reps']}) | {hello['median_bwrap_ms']:.1f} ms | {hello['median_none_ms']:.1f} ms | **{r_hello:.2f}** | ≤ 1.2 | {verdict(r_hello, 1.2)} |")
print(f"| task wall time, reset sandbox vs cold, bwrap (medians, {cycle['warm']['n']} warm / {cycle['cold']['n']} cold) | {w:.1f} ms | {c:.1f} ms | **{w / c:.2f}** | ≤ 0.35 | {verdict(w / c, 0.35)} |")
print(f"| `eval -j 16` throughput vs 16 × `-j 1`, bwrap | {tput[16]:.2f} tasks/s | {16 * tput[1]:.2f} tasks/s | **{r_scale:.2f}** (steady state {r_steady:.2f}) | ≥ 0.9 | {verdict(r_scale, 0.9, le=False)} |")
print()
print(f"Reset, per task: {cycle['mean_reset_ms']:.2f} ms on average ({cycle['resets']} resets, {cycle['unclean']} unclean); "
      f"the warm task's phases (ms): acquire {cycle['warm']['acquire_ms']}, files {cycle['warm']['setup_ms']}, "
      f"episode {cycle['warm']['episode_ms']}, verify {cycle['warm']['verify_ms']} (of which stopping the agent {cycle['warm'].get('stop_ms')}), release (the reset) {cycle['warm']['release_ms']}; "
      f"the cold one's acquire (create + runner bootstrap) {cycle['cold']['acquire_ms']}.")
print(f"Every eval task passed: {ok}.")
PY
