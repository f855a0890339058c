#!/usr/bin/env python3
"""Runs `wmo-e2b eval --json` once and measures it from outside. Prints one JSON line.

- throughput: tasks / wall of the whole process (start to exit: cold pool start, every task,
  pool close), and a steady-state rate from the `task_finished` event times (between the
  10th and 90th percentile finish);
- peak RSS of the wmo-e2b process itself: VmHWM from /proc/<pid>/status, polled every 50 ms
  until it exits (the last reading is the high-water mark; a wait4/`time -v` figure would
  include the node runners it reaps, which are children);
- its CPU time (utime + stime from wait4, which includes reaped children: reported too).

usage: eval_run.py BIN TASKS.jsonl JOBS [--home DIR] [--out DIR] [--eval-arg=ARG ...]
"""
import argparse
import json
import os
import subprocess
import tempfile
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("bin")
ap.add_argument("tasks")
ap.add_argument("jobs", type=int)
ap.add_argument("--home")
ap.add_argument("--out")
ap.add_argument("--isolation", help="passed to `eval --isolation` when given")
ap.add_argument("--eval-arg", action="append", default=[],
                help="one more argument for `eval` (repeatable), e.g. --eval-arg=--backend")
a = ap.parse_args()

tmp = tempfile.mkdtemp(prefix="wmo-bench-eval-")
home = a.home or os.path.join(tmp, "state")
out = a.out or os.path.join(tmp, "out")
env = dict(os.environ, WMO_E2B_HOME=home)
n_tasks = sum(1 for line in open(a.tasks) if line.strip())

status_samples = []
stat_last = {}


def read_status(pid):
    vals = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS", "Threads"):
                    vals[k] = int(v.split()[0])
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    return vals


def proc_cpu(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            rest = fh.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


t0 = time.perf_counter()
p = subprocess.Popen(
    [a.bin, "eval", "--tasks", a.tasks, "-j", str(a.jobs), "--out", out, "--json"]
    + (["--isolation", a.isolation] if a.isolation else [])
    + a.eval_arg,
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True,
)
stop = threading.Event()


def poll():
    while not stop.is_set():
        s = read_status(p.pid)
        c = proc_cpu(p.pid)
        if s and s.get("VmHWM"):
            s["cpu_s"] = c
            s["t"] = time.perf_counter() - t0
            status_samples.append(s)
        stop.wait(0.05)


poller = threading.Thread(target=poll, daemon=True)
poller.start()
finished = []
summary = None
for line in p.stdout:
    try:
        ev = json.loads(line)
    except ValueError:
        continue
    if ev.get("type") == "task_finished":
        finished.append((time.perf_counter() - t0, ev["record"]["status"]))
    elif ev.get("type") == "summary":
        summary = ev["summary"]
_, rc_status, ru = os.wait4(p.pid, 0)
wall = time.perf_counter() - t0
stop.set()
poller.join()

times = sorted(t for t, _ in finished)
steady = None
if len(times) >= 20:
    lo, hi = times[len(times) // 10], times[(len(times) * 9) // 10]
    k = (len(times) * 9) // 10 - len(times) // 10
    steady = k / (hi - lo) if hi > lo else None
passed = sum(1 for _, s in finished if s == "passed")
res = {
    "impl": "wmo-e2b",
    "jobs": a.jobs,
    "isolation": a.isolation or "auto",
    "eval_args": a.eval_arg,
    "tasks": n_tasks,
    "finished": len(finished),
    "passed": passed,
    "exit_code": os.waitstatus_to_exitcode(rc_status),
    "wall_s": wall,
    "tasks_per_s": len(finished) / wall,
    "steady_tasks_per_s": steady,
    "first_finish_s": times[0] if times else None,
    "summary_wall_s": summary.get("wall_seconds") if summary else None,
    "sandboxes": summary.get("sandboxes") if summary else None,
    "peak_rss_kb": max((s["VmHWM"] for s in status_samples), default=None),
    "max_threads": max((s.get("Threads", 0) for s in status_samples), default=None),
    "rss_samples": len(status_samples),
    "cpu_s_self": max((s["cpu_s"] for s in status_samples if s.get("cpu_s") is not None), default=None),
    "cpu_s_with_children": ru.ru_utime + ru.ru_stime,
    "wait4_maxrss_kb": ru.ru_maxrss,
}
print(json.dumps(res))
subprocess.run(["rm", "-rf", tmp])
