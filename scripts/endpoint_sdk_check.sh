#!/usr/bin/env bash
# The model endpoint agents are served in a sandbox, judged by the official OpenAI and
# Anthropic Python SDKs (pinned in scripts/sdk-requirements.txt): a task whose agent is
# scripts/endpoint_sdk_check.py runs under `eval --harness cmd:`, with a scripted model.
#
# Needs python3 with the venv module and PyPI on the first run; the venv lives in
# target/sdk-venv and is reused while the pins and the Python version match. The agent
# runs unconfined (--isolation none) so it can use that venv where it is.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/sdk-venv
source scripts/lib/venv.sh
pinned_venv "$venv" scripts/sdk-requirements.txt endpoint_sdk_check.sh

cargo build --locked --quiet --bin wmo-e2b
bin="$PWD/${CARGO_TARGET_DIR:-target}/debug/wmo-e2b"
work=$(mktemp -d "${TMPDIR:-/tmp}/wmo-e2b-sdk-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Six answers, each a tool call beside a text; the seventh call is past max_turns.
python3 - "$work/tasks.jsonl" <<'PY'
import json, sys
step = {"content": "looking", "tool_calls": [{"name": "run", "arguments": {"command": "ls -l"}}]}
task = {"id": "sdk", "instruction": "check the endpoint", "verify": "true", "max_turns": 6,
        "model_script": [step] * 6}
open(sys.argv[1], "w").write(json.dumps(task) + "\n")
PY

WMO_E2B_HOME="$work/state" "$bin" eval --tasks "$work/tasks.jsonl" --out "$work/out" \
  --isolation none --harness "cmd:$PWD/$venv/bin/python $PWD/scripts/endpoint_sdk_check.py" >/dev/null
python3 - "$work/out" <<'PY'
import json, sys
out = sys.argv[1]
record = json.loads(open(out + "/results.jsonl").readline())
notes = [json.loads(l).get("message", "") for l in open(out + "/transcripts/sdk.jsonl")]
said = next((n for n in notes if "SDK-CHECK" in n), None)
if said is None:
    said = next((n for n in notes if "the agent" in n), "the agent left no note")
    print(said[-3000:])
else:
    print(said[said.find("SDK-CHECK"):].split("\n--- stderr")[0].strip())
ok = record["stop_reason"] == "max_turns" and "failed 0" in said and "exited with code 0" in said
sys.exit(0 if ok else 1)
PY
