#!/usr/bin/env bash
# The main job on a fresh machine: the bundled example tasks on the local backend, with the
# scripted model (no account, no key). Extra arguments go to `eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/system-deps.sh
exec cargo run --release --locked -- eval --tasks examples/tasks.jsonl "$@"
