#!/usr/bin/env python3
"""What a large tasks file costs before the first task starts: time to the first
`task_started` event and the peak RSS of `wmo-e2b eval` by then, for a whole file and for a
shard of it. Writes one JSON line per measurement.

usage: tasks_file.py WMO_E2B TASKS.jsonl [--shards N] [--label NAME]
"""
import argparse, json, os, signal, subprocess, sys, tempfile, time

ap = argparse.ArgumentParser()
ap.add_argument("binary")
ap.add_argument("tasks")
ap.add_argument("--shards", type=int, default=13334)
ap.add_argument("--label", default="")
a = ap.parse_args()


def peak_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def to_first_task(extra):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, WMO_E2B_HOME=os.path.join(d, "state"))
        cmd = [a.binary, "eval", "--tasks", a.tasks, "--out", os.path.join(d, "out"), "--json", "-j", "1", *extra]
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        first = None
        peak = 0
        for line in p.stdout:
            peak = max(peak, peak_kb(p.pid))
            if json.loads(line).get("type") == "task_started":
                first = time.monotonic() - t0
                peak = max(peak, peak_kb(p.pid))
                break
        # Two Ctrl-Cs: stop at once, killing the sandbox.
        for _ in range(2):
            p.send_signal(signal.SIGINT)
            time.sleep(0.2)
        p.wait(timeout=60)
        return first, peak


for name, extra in [("whole file", []), (f"shard 0/{a.shards}", ["--shard", f"0/{a.shards}"])]:
    first, peak = to_first_task(extra)
    print(json.dumps({"label": a.label, "run": name, "seconds_to_first_task": first, "peak_rss_mib": round(peak / 1024, 1)}))
    sys.stdout.flush()
