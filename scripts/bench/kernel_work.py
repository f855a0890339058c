#!/usr/bin/env python3
"""Kernel work and host CPU per task of a local eval, in steady state.

Two runs of `gen_tasks.py` tasks (2 bash steps and a submit, no model delay), SMALL and LARGE
tasks: the difference divided by LARGE - SMALL is what one more task costs, start-up and
close left out.
- kernel work: each run under `strace -f -c` (every process the run starts, namespace
  holders included, however they detached): execs, forks (clone, clone3, fork, vfork),
  mount, umount2, pivot_root, unshare, setns calls;
- host CPU: each run in a cgroup v1 cpuacct group of its own (as root), whose usage counts
  every process in it and in the sandboxes' cgroups nested under it.
- kernel tasks per idle sandbox: every thread on the machine while one `-j 1` task waits on
  its model, less those before the run and the `wmo-e2b` process's own, and by program.
Needs root, strace and cgroup v1's cpuacct (the CPU part is skipped without them).

    cargo build --release
    sudo python3 scripts/bench/kernel_work.py [--bin target/release/wmo-e2b] [--jobs 16]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CALLS = {
    "execs": ["execve", "execveat"],
    "forks": ["clone", "clone3", "fork", "vfork"],
    "mount": ["mount"],
    "umount2": ["umount2"],
    "pivot_root": ["pivot_root"],
    "unshare": ["unshare"],
    "setns": ["setns"],
}
# cpuacct mounted with cpu, or on its own.
CPUACCT = next((p for p in ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpuacct"] if os.path.isdir(p)), None)


def tasks(work, n):
    path = os.path.join(work, "tasks-%d.jsonl" % n)
    subprocess.run([sys.executable, os.path.join(HERE, "gen_tasks.py"), str(n), path, "--delay-ms", "0"], check=True)
    return path


def eval_args(binary, tasks_file, out, jobs):
    return [binary, "eval", "--tasks", tasks_file, "--out", out, "-j", str(jobs), "--isolation", "bwrap"]


def counted(binary, tasks_file, out, jobs, env):
    """Calls per syscall name over the whole run."""
    report = out + ".strace"
    names = sorted({n for group in CALLS.values() for n in group})
    cmd = ["strace", "-f", "-qq", "-c", "-o", report, "-e", "trace=" + ",".join(names)] + eval_args(binary, tasks_file, out, jobs)
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    calls = {}
    for line in open(report):
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in names:
            calls[fields[-1]] = int(fields[3])
    return {k: sum(calls.get(n, 0) for n in group) for k, group in CALLS.items()}


def cpu_seconds(binary, tasks_file, out, jobs, env):
    """CPU of everything the run started, from a cgroup of its own; None without one."""
    if os.geteuid() != 0 or CPUACCT is None:
        return None
    group = os.path.join(CPUACCT, "wmo-e2b-bench-%d" % os.getpid())
    os.mkdir(group)
    try:
        script = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
        subprocess.run(["sh", "-c", script, group] + eval_args(binary, tasks_file, out, jobs), env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(group, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9
    finally:
        os.rmdir(group)


def machine_threads():
    """Threads of every process on the machine, by pid."""
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out[int(pid)] = len(os.listdir("/proc/%s/task" % pid))
            except OSError:
                pass
    return out


def command_name(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "?"


def idle_sandbox_tasks(binary, work, env):
    """Kernel tasks one sandbox holds while its task waits on the model (4 s): the threads of
    every process that was not there before the run, but the `wmo-e2b` process's own; and
    how many of them each program holds (`node` is the runner: between tasks it is gone)."""
    path = tasks(work, 1)
    line = json.loads(open(path).readline())
    line["model_script"][0]["delay_ms"] = 4000
    with open(path, "w") as f:
        f.write(json.dumps(line) + "\n")
    before = machine_threads()
    run = subprocess.Popen(eval_args(binary, path, os.path.join(work, "idle"), 1), env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2.5)
    during = machine_threads()
    held = {pid: n for pid, n in during.items() if pid not in before and pid != run.pid}
    by_program = {}
    for pid, n in held.items():
        name = command_name(pid)
        by_program[name] = by_program.get(name, 0) + n
    run.wait()
    return sum(held.values()), dict(sorted(by_program.items()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/wmo-e2b")
    ap.add_argument("--small", type=int, default=16)
    ap.add_argument("--large", type=int, default=80)
    ap.add_argument("--jobs", type=int, default=16)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="wmo-kernel-work-")
    env = dict(os.environ, WMO_E2B_HOME=os.path.join(work, "state"))
    small, large = tasks(work, a.small), tasks(work, a.large)
    more = a.large - a.small
    c_small = counted(a.bin, small, os.path.join(work, "s-strace"), a.jobs, env)
    c_large = counted(a.bin, large, os.path.join(work, "l-strace"), a.jobs, env)
    per_task = {k: round((c_large[k] - c_small[k]) / more, 2) for k in CALLS}
    print(json.dumps({"kernel_work_per_task": per_task, "small": c_small, "large": c_large,
                      "tasks": [a.small, a.large], "jobs": a.jobs}))
    s = cpu_seconds(a.bin, small, os.path.join(work, "s-cpu"), a.jobs, env)
    l = cpu_seconds(a.bin, large, os.path.join(work, "l-cpu"), a.jobs, env)
    if s is not None and l is not None:
        print(json.dumps({"host_cpu_ms_per_task": round((l - s) / more * 1000, 1),
                          "cpu_s": [round(s, 3), round(l, 3)], "jobs": a.jobs}))
    else:
        print(json.dumps({"host_cpu_ms_per_task": None, "why": "needs root and cgroup v1 cpuacct"}))
    total, by_program = idle_sandbox_tasks(a.bin, work, env)
    print(json.dumps({"kernel_tasks_per_idle_sandbox": total, "by_program": by_program}))


if __name__ == "__main__":
    main()
