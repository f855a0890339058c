#!/usr/bin/env bash
# pi before and after a change, on this machine back to back: this checkout's
# examples/bench_pi.rs against the one of a base revision (built from `git archive BASE`).
#
#   scripts/bench/pi/ab.sh BASE [ROUNDS] [REPS]     # e.g. scripts/bench/pi/ab.sh main 3 10
#
# Measures, for each side: one cold `ensure_installed` into a fresh state dir (its time, and
# the size of what it leaves: the install directory), then ROUNDS rounds of `bench_pi hello
# --reps REPS`, the sides alternating and the order flipping each round: spawn-to-hello and
# the first episode of a fresh runner, builtin and pi (both sides unconfined, see below; ours
# once more under bwrap, as it ships). Needs cargo, node, npm (the registry,
# for the cold installs), python3. Writes JSON lines and summary.md under
# target/bench/pi-ab-<UTC stamp>/, and prints the summary.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$(pwd)
BASE=${1:?usage: ab.sh BASE [ROUNDS] [REPS]}
ROUNDS=${2:-3}
REPS=${3:-10}
OUT=${OUT:-$ROOT/target/bench/pi-ab-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT/base-src"
echo "results: $OUT"
{
  echo "base: $(git rev-parse --short "$BASE")"
  echo "ours: $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
  echo "node: $(node --version)"
  echo "loadavg_start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"

git archive "$BASE" | tar -x -C "$OUT/base-src"
# The base gets a target dir of its own (BASE_TARGET, to reuse one): cargo takes two
# checkouts of one package in one target dir for the same build.
BASE_TARGET=${BASE_TARGET:-$OUT/base-target}
(cd "$OUT/base-src" && CARGO_TARGET_DIR=$BASE_TARGET cargo build --release --example bench_pi) \
  > "$OUT/build.log" 2>&1
cp "$BASE_TARGET/release/examples/bench_pi" "$OUT/bench_pi_base"
cargo build --release --example bench_pi >> "$OUT/build.log" 2>&1
cp target/release/examples/bench_pi "$OUT/bench_pi_ours"

# The base revision's bench_pi gives a confined runner the host path of pi's node_modules,
# which bwrap does not show it. So both sides run unconfined, as `--isolation auto` does where
# bwrap is missing: on a PATH that finds everything of the system's bin directories but bwrap.
NOBWRAP=$OUT/path-without-bwrap
mkdir -p "$NOBWRAP"
for f in /usr/local/bin/* /usr/bin/* /usr/sbin/*; do
  b=$(basename "$f")
  [ "$b" = bwrap ] || [ -e "$NOBWRAP/$b" ] || ln -s "$f" "$NOBWRAP/$b"
done
bench() { PATH=$NOBWRAP "$OUT/bench_pi_$1" "${@:2}"; }

for side in base ours; do
  bench "$side" install --state "$OUT/state-$side" --reps 1 \
    | sed "s/^{/{\"side\": \"$side\", /" >> "$OUT/install.jsonl"
done
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="base ours"; else order="ours base"; fi
  for side in $order; do
    bench "$side" hello --state "$OUT/state-$side" --reps "$REPS" \
      | sed "s/^{/{\"side\": \"$side\", \"round\": $r, /" >> "$OUT/hello.jsonl"
  done
done
# Ours as it ships (bwrap), for the record.
"$OUT/bench_pi_ours" hello --state "$OUT/state-ours" --reps "$REPS" > "$OUT/hello_ours_bwrap.json"
echo "loadavg_end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"

python3 - "$OUT" <<'PY' | tee "$OUT/summary.md"
import json, os, statistics, sys
out = sys.argv[1]
lines = lambda f: [json.loads(l) for l in open(os.path.join(out, f)) if l.strip()]
inst = {r["side"]: r for r in lines("install.jsonl")}
hello = lines("hello.jsonl")
def all_of(side, key):
    return [x for r in hello if r["side"] == side for x in r[key]]
def med(side, key):
    return statistics.median(all_of(side, key))
print("```\n" + open(os.path.join(out, "machine.txt")).read().strip() + "\n```\n")
print("| measure | n | ours | base | ratio |")
print("|---|---|---|---|---|")
for key, what in [("pi_first_episode_ms", "first pi episode on a fresh runner, median, ms"),
                  ("pi_hello_ms", "spawn-to-hello, pi enabled, median, ms"),
                  ("builtin_first_episode_ms", "first builtin episode, median, ms (control)"),
                  ("builtin_hello_ms", "spawn-to-hello, builtin, median, ms (control)")]:
    o, b = med("ours", key), med("base", key)
    print(f"| {what} | {len(all_of('ours', key))} | {o:.1f} | {b:.1f} | {o / b:.3f} |")
def size(side):
    r = inst[side]
    return r.get("install_bytes") or r.get("node_modules_bytes"), r.get("install_files") or r.get("node_modules_files")
(ob, of), (bb, bf) = size("ours"), size("base")
print(f"| install directory, bytes (files) | 1 | {ob:,} ({of:,}) | {bb:,} ({bf:,}) | {ob / bb:.4f} |")
if inst["ours"].get("bundle_bytes"):
    print(f"| what a sandbox gets, bytes | 1 | {inst['ours']['bundle_bytes']:,} (one file) | {bb:,} ({bf:,} files) | {inst['ours']['bundle_bytes'] / bb:.4f} |")
bw = json.load(open(os.path.join(out, "hello_ours_bwrap.json")))
print(f"| ours under bwrap (as shipped): first pi episode, median, ms | {bw['reps']} | {bw['median_pi_first_episode_ms']:.1f} | – | – |")
co, cb = inst["ours"]["median_install_cold_ms"], inst["base"]["median_install_cold_ms"]
print(f"| cold `ensure_installed`, s | 1 | {co / 1000:.1f} | {cb / 1000:.1f} | {co / cb:.2f} |")
fo = inst["ours"]["rows"][0]["first_pi_episode_ms"]; fb = inst["base"]["rows"][0]["first_pi_episode_ms"]
print(f"| first pi episode right after the cold install, ms | 1 | {fo:.1f} | {fb:.1f} | {fo / fb:.3f} |")
PY
