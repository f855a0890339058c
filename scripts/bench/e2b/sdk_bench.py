#!/usr/bin/env python3
"""The official E2B Python SDK (pinned in scripts/e2b-requirements.txt) on the workloads of
examples/bench_e2b_client.rs and the snapshot harvest, against the endpoint in E2B_API_KEY,
E2B_API_URL and E2B_SANDBOX_URL (normally `wmo-e2b emulator`). Run by
scripts/bench/e2b/run.sh.

    sdk_bench.py seq --n 50
    sdk_bench.py stream --bytes 50000000
    sdk_bench.py concurrent --n 100 [--threads 100]
    sdk_bench.py harvest --sandbox ID --dir /home/user/project --depth 8 [--reps 3]
    sdk_bench.py ops --k 40       # one sandbox, K x commands.run("true"), latency each

Prints one JSON object per measurement on stdout. Every sandbox it creates is killed.
"""

import argparse
import hashlib
import json
import os
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from e2b import FileType, Sandbox


def emulator_cpu_s():
    """CPU seconds used by the emulator and its reaped children (WMO_BENCH_EMULATOR_PID)."""
    pid = os.environ.get("WMO_BENCH_EMULATOR_PID")
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # utime, stime, cutime, cstime: the sandbox processes it has reaped count too.
    return sum(int(v) for v in rest[11:15]) / os.sysconf("SC_CLK_TCK")


class Cpu:
    """CPU used by this client (all threads) and by the emulator since creation."""

    def __init__(self):
        self.client, self.server = time.process_time(), emulator_cpu_s()

    def json(self):
        now = emulator_cpu_s()
        server = None if self.server is None or now is None else now - self.server
        return {"client_cpu_s": time.process_time() - self.client, "emulator_cpu_s": server}


def cycle():
    """create -> run `true` -> kill, with the phases timed (seconds)."""
    t0 = time.perf_counter()
    sbx = Sandbox.create()
    t1 = time.perf_counter()
    try:
        r = sbx.commands.run("true")
        t2 = time.perf_counter()
    finally:
        sbx.kill()
    t3 = time.perf_counter()
    if r.exit_code != 0:
        raise RuntimeError(f"`true` exited {r.exit_code}")
    return t1 - t0, t2 - t1, t3 - t2


def pct(sorted_ms, p):
    if not sorted_ms:
        return 0.0
    return sorted_ms[round((len(sorted_ms) - 1) * p)]


def seq(a):
    cycle()  # warm the connection pool, as the Rust side does
    totals, phases = [], [0.0, 0.0, 0.0]
    cpu = Cpu()
    start = time.perf_counter()
    for _ in range(a.n):
        t = time.perf_counter()
        p = cycle()
        totals.append((time.perf_counter() - t) * 1e3)
        for i in range(3):
            phases[i] += p[i] * 1e3
    wall = time.perf_counter() - start
    totals.sort()
    print(json.dumps({
        "client": "sdk", "bench": "seq", "n": a.n, "wall_s": wall,
        "per_cycle_ms": {"mean": wall * 1e3 / a.n, "p50": pct(totals, 0.5), "p90": pct(totals, 0.9)},
        "phase_mean_ms": {"create": phases[0] / a.n, "run": phases[1] / a.n, "kill": phases[2] / a.n},
        "cpu": cpu.json(),
    }))


def stream(a):
    sbx = Sandbox.create()
    try:
        sbx.commands.run("true")
        got = [0, 0]

        def on_stdout(s):
            # The SDK hands over decoded text; /dev/zero is ASCII NULs, so len == bytes.
            got[0] += len(s)
            got[1] += 1

        cpu = Cpu()
        start = time.perf_counter()
        r = sbx.commands.run(f"head -c {a.bytes} /dev/zero", on_stdout=on_stdout,
                             retain_output=False, timeout=300)
        secs = time.perf_counter() - start
        if r.exit_code != 0 or got[0] != a.bytes:
            raise RuntimeError(f"exit {r.exit_code}, got {got[0]} bytes, want {a.bytes}")
        print(json.dumps({"client": "sdk", "bench": "stream", "via": "commands.run(on_stdout, retain_output=False)",
                          "bytes": got[0], "seconds": secs, "mb_per_s": got[0] / secs / 1e6,
                          "chunks": got[1], "cpu": cpu.json()}))
    finally:
        sbx.kill()


def concurrent(a):
    cycle()
    lat, failures, phases = [], [], [0.0, 0.0, 0.0]
    lock = threading.Lock()

    def one(_):
        t = time.perf_counter()
        try:
            p = cycle()
        except Exception as e:  # reported, not fatal: the count says how many failed
            with lock:
                failures.append(f"{type(e).__name__}: {e}")
            return
        with lock:
            lat.append((time.perf_counter() - t) * 1e3)
            for i in range(3):
                phases[i] += p[i] * 1e3

    cpu = Cpu()
    start = time.perf_counter()
    with ThreadPoolExecutor(a.threads or a.n) as ex:
        list(ex.map(one, range(a.n)))
    wall = time.perf_counter() - start
    cpu = cpu.json()
    lat.sort()
    ok = max(1, len(lat))
    print(json.dumps({
        "client": "sdk", "bench": "concurrent", "n": a.n, "threads": a.threads or a.n,
        "ok": len(lat), "failed": len(failures), "wall_s": wall, "cpu": cpu,
        "phase_mean_ms": {"create": phases[0] / ok, "run": phases[1] / ok, "kill": phases[2] / ok},
        "cycle_ms": {"p50": pct(lat, 0.5), "p90": pct(lat, 0.9), "max": pct(lat, 1.0)},
        "first_failure": failures[0] if failures else None,
    }))
    if failures:
        sys.exit(1)


def ops(a):
    sbx = Sandbox.create()
    try:
        lat = []
        start = time.perf_counter()
        for _ in range(a.k):
            t = time.perf_counter()
            sbx.commands.run("true")
            lat.append((time.perf_counter() - t) * 1e3)
        wall = time.perf_counter() - start
        lat.sort()
        print(json.dumps({"client": "sdk", "bench": "ops", "op": "run", "k": a.k,
                          "mean_ms": wall * 1e3 / a.k, "p50_ms": pct(lat, 0.5),
                          "p90_ms": pct(lat, 0.9), "max_ms": pct(lat, 1.0)}))
    finally:
        sbx.kill()


def tree_hash(files):
    """The same hash as wmo_e2b::project::snapshot::Snapshot::tree_hash."""
    h = hashlib.sha256()
    for path in sorted(files, key=lambda p: p.encode()):
        p, c = path.encode(), files[path].encode()
        h.update(struct.pack(">I", len(p)) + p + struct.pack(">Q", len(c)) + c)
    return h.hexdigest()


def harvest(a):
    sbx = Sandbox.connect(a.sandbox)
    root = a.dir.rstrip("/") + "/"
    for rep in range(a.reps):
        cpu = Cpu()
        start = time.perf_counter()
        entries = sbx.files.list(a.dir, depth=a.depth)
        files = {}
        for e in entries:
            if e.type == FileType.FILE:
                files[e.path[len(root):]] = sbx.files.read(e.path)
        secs = time.perf_counter() - start
        print(json.dumps({"client": "sdk", "bench": "snapshot", "rep": rep, "files": len(files),
                          "bytes": sum(len(c.encode()) for c in files.values()),
                          "seconds": secs, "tree_hash": tree_hash(files), "cpu": cpu.json()}))
        sys.stdout.flush()


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seq")
    s.add_argument("--n", type=int, default=50)
    s = sub.add_parser("stream")
    s.add_argument("--bytes", type=int, default=50_000_000)
    s = sub.add_parser("concurrent")
    s.add_argument("--n", type=int, default=100)
    s.add_argument("--threads", type=int, default=0)
    s = sub.add_parser("harvest")
    s.add_argument("--sandbox", required=True)
    s.add_argument("--dir", required=True)
    s.add_argument("--depth", type=int, default=8)
    s.add_argument("--reps", type=int, default=1)
    s = sub.add_parser("ops")
    s.add_argument("--k", type=int, default=40)
    a = p.parse_args()
    {"seq": seq, "stream": stream, "concurrent": concurrent, "harvest": harvest, "ops": ops}[a.cmd](a)


if __name__ == "__main__":
    main()
