#!/usr/bin/env python3
"""The `report --html` benchmark: writes a synthetic run of N results with transcripts, then
times `wmo-e2b report DIR --html FILE` on it and prints the time, peak memory and page size.

Each task: an episode_start (system prompt, instruction), M model answers each with a bash
tool call and its output (a few hundred bytes, every 50th task a 20 KiB output), a submit,
done; three statuses and four stop reasons; every 100th task retried (two attempts).

usage: report_html.py BIN [--tasks 10000] [--turns 4] [--dir target/bench/report-html]
"""
import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import time

ap = argparse.ArgumentParser()
ap.add_argument("bin", help="the wmo-e2b binary (a release build)")
ap.add_argument("--tasks", type=int, default=10000)
ap.add_argument("--turns", type=int, default=4)
ap.add_argument("--dir", default="target/bench/report-html")
a = ap.parse_args()

rng = random.Random(12)
run = os.path.join(a.dir, "run")
shutil.rmtree(a.dir, ignore_errors=True)
os.makedirs(os.path.join(run, "transcripts"))
SYSTEM = "You are an agent working in a sandbox. Use the tools, then call `submit`.\n" * 4


def line(fh, t, frm, frame):
    fh.write(json.dumps({"t": round(t, 3), "from": frm, "frame": frame}) + "\n")


def completion(i, turn, call):
    return {"model": "scripted", "choices": [{"finish_reason": "tool_calls", "message": {
        "content": f"Step {turn}: looking at the workspace.", "tool_calls": [call]}}],
        "usage": {"prompt_tokens": 400 + 300 * turn, "completion_tokens": 40}}


def episode(fh, i, attempt, t):
    line(fh, t, "host", {"type": "episode_start", "episode_id": f"e{i}-{attempt}",
                         "system": SYSTEM, "instruction": f"Fix bug {i} in src/app.py."})
    for turn in range(a.turns):
        cmd = f"grep -n 'def handler_{turn}' src/app.py && sed -n '{turn},+20p' src/app.py"
        call = {"id": f"c{turn}", "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": cmd})}}
        line(fh, t + turn, "host", {"type": "llm_response", "id": turn, "completion": completion(i, turn, call)})
        line(fh, t + turn + 0.1, "runner", {"type": "tool_request", "req_id": turn, "name": "bash",
                                            "arguments": {"command": cmd}})
        size = 20000 if i % 50 == 0 else 300
        out = "".join(rng.choice("abcdefgh \n") for _ in range(size))
        line(fh, t + turn + 0.2, "host", {"type": "tool_response", "req_id": turn, "content": out, "is_error": False})
    submit = {"id": "s", "type": "function", "function": {"name": "submit", "arguments": "{\"answer\": \"done\"}"}}
    line(fh, t + a.turns, "host", {"type": "llm_response", "id": a.turns, "completion": completion(i, a.turns, submit)})
    line(fh, t + a.turns + 0.1, "runner", {"type": "done", "reason": "submit", "answer": "done"})


with open(os.path.join(run, "results.jsonl"), "w") as res:
    for i in range(a.tasks):
        tid = f"task-{i:05d}"
        attempts = 2 if i % 100 == 0 else 1
        with open(os.path.join(run, "transcripts", tid + ".jsonl"), "w") as fh:
            for n in range(1, attempts + 1):
                fh.write(json.dumps({"t": 0, "from": "note", "message": f"attempt {n}"}) + "\n")
                episode(fh, i, n, 0.0)
        status = rng.choices(["passed", "failed", "error"], [70, 25, 5])[0]
        stop = rng.choice(["submit", "max_turns", "timeout", "no_tool_call"]) if status != "passed" else "submit"
        res.write(json.dumps({
            "id": tid, "status": status, "stop_reason": stop, "answer": "done",
            "verify": {"exit_code": 0 if status == "passed" else 1, "timed_out": False,
                       "output_tail": "ok\n" if status == "passed" else "FAILED test_x\nassert 1 == 2\n"},
            "turns": a.turns + 1, "tool_calls": a.turns + 1, "attempts": attempts,
            "tokens": {"input": 5000 + rng.randint(0, 20000), "output": 200 + rng.randint(0, 800), "calls": a.turns + 1},
            "sandbox": {"seconds": rng.uniform(5, 60)},
            "timings": {"acquire": rng.uniform(0.1, 2), "episode": rng.uniform(3, 50), "verify": rng.uniform(0.5, 5)},
        }) + "\n")

size_in = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(run) for f in fs)
page = os.path.join(a.dir, "report.html")
start = time.monotonic()
p = subprocess.run([a.bin, "report", run, "--html", page], stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, text=True)
took = time.monotonic() - start
if p.returncode != 0:
    raise SystemExit(f"report failed ({p.returncode}): {p.stderr}")
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"tasks": a.tasks, "turns": a.turns, "input_mib": round(size_in / 2**20, 1),
                  "seconds": round(took, 2), "peak_rss_mib": round(rss, 1),
                  "page_mib": round(os.path.getsize(page) / 2**20, 1), "page": page}))
