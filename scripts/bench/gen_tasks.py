#!/usr/bin/env python3
"""Writes N scripted eval tasks (JSON Lines) for the scaling benchmark.

Each task: one small input file, 2 bash steps and a submit, every model step waiting
DELAY_MS (the scripted model's `delay_ms`), and a verify command, so a task costs about
3 x DELAY_MS of model wait plus the real sandbox work (workspace, 2 bash tool calls, verify,
release).

usage: gen_tasks.py N OUT.jsonl [--delay-ms 200]
"""
import argparse
import json

ap = argparse.ArgumentParser()
ap.add_argument("n", type=int)
ap.add_argument("out")
ap.add_argument("--delay-ms", type=int, default=200)
a = ap.parse_args()

with open(a.out, "w") as fh:
    for i in range(a.n):
        d = a.delay_ms
        task = {
            "id": f"t{i:05d}",
            "instruction": "Copy in.txt to out.txt, show it, then submit.",
            "files": {"in.txt": f"hello {i}\n"},
            "verify": f"grep -qx 'hello {i}' out.txt",
            "model_script": [
                {"delay_ms": d, "tool_calls": [{"name": "bash", "arguments": {"command": "cp in.txt out.txt"}}]},
                {"delay_ms": d, "tool_calls": [{"name": "bash", "arguments": {"command": "cat out.txt"}}]},
                {"delay_ms": d, "content": "done", "tool_calls": [{"name": "submit", "arguments": {"answer": "copied"}}]},
            ],
        }
        fh.write(json.dumps(task) + "\n")
