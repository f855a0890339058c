#!/usr/bin/env python3
"""Host CPU per model call: an agent's call through the runner's endpoint against a call of
the builtin loop, in one run of this script.

Both sides run TASKS tasks of CALLS scripted model calls each (`eval -j JOBS`, local backend):
- builtin: the runner's own loop; every answer but the last calls a tool the host refuses
  at once (no sandbox command), the last submits;
- endpoint: `--harness cmd:` with a small Python agent that makes CALLS chat-completions
  calls (non-streaming and streaming alternately) to the endpoint and exits.
The CPU time of the `wmo-e2b` process itself (user + system, read from /proc while it runs,
so sandbox processes are not counted) is divided by the model calls the run's summary
counts. Rounds alternate which side goes first.

    cargo build --release
    python3 scripts/bench/agent_endpoint.py [--bin target/release/wmo-e2b] [--rounds 3]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

AGENT = r"""
import json, os, urllib.request
base, key, n = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"], CALLS
for i in range(n):
    body = {"model": "m", "messages": [{"role": "user", "content": "call %d" % i}], "stream": i % 2 == 1}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + key, "content-type": "application/json"})
    urllib.request.urlopen(req, timeout=60).read()
"""


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def run(binary, tasks, out, extra, env):
    proc = subprocess.Popen([binary, "eval", "--tasks", tasks, "--out", out] + extra,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    last = 0.0
    while proc.poll() is None:
        try:
            last = cpu_seconds(proc.pid)
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.02)
    if proc.returncode != 0:
        sys.exit("eval failed (%d): %s" % (proc.returncode, proc.stderr.read().decode()[-2000:]))
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    if summary["passed"] != summary["tasks"]:
        sys.exit("not every task passed: see %s" % out)
    return last, summary["tokens"]["calls"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/wmo-e2b")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="wmo-endpoint-bench-")
    env = dict(os.environ, WMO_E2B_HOME=os.path.join(work, "state"))
    agent = AGENT.replace("CALLS", str(a.calls), 1).replace("CALLS", str(a.calls))
    refused = {"tool_calls": [{"name": "no_such_tool", "arguments": {}}]}
    submit = {"tool_calls": [{"name": "submit", "arguments": {"answer": "ok"}}]}
    builtin = os.path.join(work, "builtin.jsonl")
    endpoint = os.path.join(work, "endpoint.jsonl")
    with open(builtin, "w") as f, open(endpoint, "w") as g:
        for i in range(a.tasks):
            script = [refused] * (a.calls - 1) + [submit]
            f.write(json.dumps({"id": "b%d" % i, "instruction": "x", "verify": "true",
                                "max_turns": a.calls + 1, "model_script": script}) + "\n")
            g.write(json.dumps({"id": "e%d" % i, "instruction": "x", "verify": "true",
                                "max_turns": a.calls + 1, "files": {"agent.py": agent},
                                "model_script": [{"content": "ok"}] * a.calls}) + "\n")
    sides = {
        "builtin": (builtin, []),
        "endpoint": (endpoint, ["--harness", "cmd:python3 agent.py"]),
    }
    per_call = {"builtin": [], "endpoint": []}
    for r in range(a.rounds):
        order = ["builtin", "endpoint"] if r % 2 == 0 else ["endpoint", "builtin"]
        for side in order:
            tasks, extra = sides[side]
            out = os.path.join(work, "%s-%d" % (side, r))
            cpu, calls = run(a.bin, tasks, out, ["-j", str(a.jobs)] + extra, env)
            per_call[side].append(cpu / calls * 1000)
            print("round %d %-8s cpu %.3f s, %d calls, %.3f ms per call" % (r, side, cpu, calls, cpu / calls * 1000))
    med = {k: sorted(v)[len(v) // 2] for k, v in per_call.items()}
    print(json.dumps({"ms_per_call_median": med, "ratio_endpoint_to_builtin": med["endpoint"] / med["builtin"]}))


if __name__ == "__main__":
    main()
