#!/usr/bin/env python3
"""The first episode of a real agent against a warm one, install excluded.

For each agent (`claude-code`, `codex`, `mini-swe-agent`), installed first (untimed), then,
as root, the page cache dropped so its program is read from disk again: one run of one
scripted task (the first episode), then one run of WARM tasks (`-j 1`, so each episode follows another on a
warm machine). Reports each record's `timings.episode` (the agent's start, its three model
calls through the endpoint, its two shell commands, its exit).

    cargo build --release
    sudo python3 scripts/bench/agent_episodes.py [--bin target/release/wmo-e2b] [--warm 8]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

STEPS = {
    "claude-code": lambda c: {"tool_calls": [{"name": "Bash", "arguments": {"command": c, "description": "step"}}]},
    "codex": lambda c: {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": c}}]},
    "mini-swe-agent": lambda c: {"tool_calls": [{"name": "bash", "arguments": {"command": c}}]},
}
# What each says last: mini-swe-agent ends at its own command, the others at a text answer.
LAST = {
    "claude-code": {"content": "Done."},
    "codex": {"content": "Done."},
    "mini-swe-agent": {"tool_calls": [{"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}]},
}


def tasks(path, agent, n):
    step = STEPS[agent]
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({
                "id": "%s-%d" % (agent, i), "instruction": "Write the sum of in.txt to out.txt.",
                "files": {"in.txt": "3 4"}, "verify": "test \"$(cat out.txt)\" = 7",
                "model_script": [step("cat in.txt"), step("echo $((3 + 4)) > out.txt"), LAST[agent]],
            }) + "\n")


def episodes(binary, env, tasks_file, out, agent):
    subprocess.run([binary, "eval", "--tasks", tasks_file, "--out", out, "-j", "1", "--harness", "agent:" + agent],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = [json.loads(l) for l in open(os.path.join(out, "results.jsonl"))]
    if any(r["status"] != "passed" for r in records):
        sys.exit("a task did not pass: see %s" % out)
    return [r["timings"]["episode"] for r in records]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/wmo-e2b")
    ap.add_argument("--warm", type=int, default=8)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="wmo-agent-episodes-")
    env = dict(os.environ, WMO_E2B_HOME=os.path.join(work, "state"))
    for agent in STEPS:
        one, many = os.path.join(work, agent + "-1.jsonl"), os.path.join(work, agent + "-n.jsonl")
        tasks(one, agent, 1)
        tasks(many, agent, a.warm)
        episodes(a.bin, env, one, os.path.join(work, agent + "-install"), agent)
        dropped = False
        if os.geteuid() == 0:
            subprocess.run(["sync"], check=True)
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            dropped = True
        first = episodes(a.bin, env, one, os.path.join(work, agent + "-first"), agent)[0]
        warm = sorted(episodes(a.bin, env, many, os.path.join(work, agent + "-warm"), agent))
        median = warm[len(warm) // 2]
        print(json.dumps({"agent": agent, "page_cache_dropped": dropped, "first_episode_s": round(first, 3),
                          "warm_median_s": round(median, 3), "warm_min_s": round(warm[0], 3),
                          "warm_max_s": round(warm[-1], 3), "first_over_warm": round(first / median, 2)}))


if __name__ == "__main__":
    main()
