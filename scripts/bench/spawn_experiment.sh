#!/usr/bin/env bash
# Experiment behind BENCHMARKS.md, "Eval throughput at `-j 16` and `-j 64`" (before and after):
# the eval scaling run with the local backend as it is, and with one change in a scratch copy
# of the tree (never in this checkout): start sandbox processes as an absolute `bash` path,
# so Rust's std uses posix_spawn (CLONE_VM | CLONE_VFORK) instead of fork(). Builds the copy
# (~1.5 min on 2 cores), then runs -j 1/16/64 on both binaries, interleaved. Prints one JSON
# line per run and a small table.
#
#   scripts/bench/spawn_experiment.sh            # 20 / 320 / 1280 tasks
#   J64_TASKS=640 scripts/bench/spawn_experiment.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
J1_TASKS=${J1_TASKS:-20}; J16_TASKS=${J16_TASKS:-320}; J64_TASKS=${J64_TASKS:-1280}
WORK=$(mktemp -d /tmp/wmo-spawn-exp.XXXXXX)
trap 'rm -rf "$WORK/tree" "$WORK/target"' EXIT
echo "scratch: $WORK" >&2

cargo build --release --bin wmo-e2b 2>&1 | tail -1 >&2
mkdir -p "$WORK/tree"
git ls-files -z | tar --null -T - -cf - | (cd "$WORK/tree" && tar xf -)
cp -r src Cargo.toml Cargo.lock "$WORK/tree/"
python3 - "$WORK/tree/src/sandbox/local/process.rs" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
old = 'let mut c = Command::new("bash");'
if old not in s:
    sys.exit("spawn_experiment: the pattern to patch is gone from process.rs; update the experiment")
s = s.replace(old, 'let mut c = Command::new(bash_path());')
s += '''
/// Experiment: an absolute program path lets std use posix_spawn instead of fork.
fn bash_path() -> &'static str {
    static P: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_string());
        path.split(':')
            .map(|d| format!("{d}/bash"))
            .find(|p| std::path::Path::new(p).is_file())
            .unwrap_or_else(|| "bash".to_string())
    })
}
'''
open(p, "w").write(s)
EOF
(cd "$WORK/tree" && CARGO_TARGET_DIR="$WORK/target" cargo build --release --bin wmo-e2b 2>&1 | tail -1 >&2)
cp "$WORK/target/release/wmo-e2b" "$WORK/wmo-e2b-posix-spawn"

python3 scripts/bench/gen_tasks.py "$J1_TASKS" "$WORK/j1.jsonl"
python3 scripts/bench/gen_tasks.py "$J16_TASKS" "$WORK/j16.jsonl"
python3 scripts/bench/gen_tasks.py "$J64_TASKS" "$WORK/j64.jsonl"
: > "$WORK/results.jsonl"
for j in 1 16 64; do
  for variant in as-is posix-spawn; do
    bin=$ROOT/target/release/wmo-e2b
    [ "$variant" = posix-spawn ] && bin=$WORK/wmo-e2b-posix-spawn
    python3 scripts/bench/eval_run.py "$bin" "$WORK/j$j.jsonl" "$j" \
      | sed "s/^{/{\"variant\": \"$variant\", /" | tee -a "$WORK/results.jsonl"
  done
done
python3 - "$WORK/results.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = {r["variant"]: r["tasks_per_s"] for r in rows if r["jobs"] == 1}
print("\n| variant | -j | tasks | tasks/s | ratio vs j × (-j 1 of the same variant) | wmo-e2b CPU ms/task | CPU ms/task incl. sandbox processes | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    b = base[r["variant"]]
    print(f"| {r['variant']} | {r['jobs']} | {r['tasks']} | {r['tasks_per_s']:.2f} | {r['tasks_per_s'] / (r['jobs'] * b):.2f} | "
          f"{r['cpu_s_self'] / r['tasks'] * 1e3:.1f} | {r['cpu_s_with_children'] / r['tasks'] * 1e3:.1f} | {r['peak_rss_kb'] / 1024:.1f} |")
EOF
echo "results: $WORK/results.jsonl" >&2
