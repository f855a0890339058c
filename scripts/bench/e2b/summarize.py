#!/usr/bin/env python3
"""Tables for scripts/bench/e2b/run.sh: reads OUT/results.jsonl and OUT/machine.txt, prints
Markdown. Every ratio is "how many times better ours is" (time: SDK or baseline over ours;
throughput: ours over SDK), from the medians over rounds; the per-round range is shown too.

    summarize.py OUT
"""

import json
import statistics
import sys
from collections import defaultdict


def load(out):
    rows = [json.loads(line) for line in open(f"{out}/results.jsonl") if line.strip()]
    machine = dict(
        line.rstrip("\n").split(": ", 1) for line in open(f"{out}/machine.txt") if ": " in line
    )
    return rows, machine


def pick(rows, label, client=None, bench=None, **eq):
    out = []
    for r in rows:
        if r.get("label") != label:
            continue
        if client is not None and r.get("client") != client:
            continue
        if bench is not None and r.get("bench") != bench:
            continue
        if any(r.get(k) != v for k, v in eq.items()):
            continue
        out.append(r)
    return out


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def by_round(rows, key):
    d = {}
    for r in rows:
        d[r["round"]] = key(r)
    return d


def ratio_range(ours, base, key, higher_is_better=False):
    """Per-round ratios (rounds where both sides ran), as 'min-max'."""
    o, b = by_round(ours, key), by_round(base, key)
    rs = []
    for rnd in sorted(set(o) & set(b)):
        if o[rnd] and b[rnd]:
            rs.append(o[rnd] / b[rnd] if higher_is_better else b[rnd] / o[rnd])
    if not rs:
        return "-"
    return f"{min(rs):.2f}-{max(rs):.2f}"


def fmt(v, unit="", digits=3):
    if v is None:
        return "-"
    return f"{v:.{digits}g}{unit}" if abs(v) < 1000 else f"{v:.0f}{unit}"


def verdict(ratio, goal):
    if ratio is None:
        return "not measured"
    return "met" if ratio >= goal else "missed"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def main():
    out = sys.argv[1]
    rows, machine = load(out)
    p = print
    p(f"Machine: {machine.get('cpus', '?')} cores ({machine.get('cpu_model', '?')}), "
      f"{machine.get('mem_total', '?')}; {machine.get('date_utc', '?')}; "
      f"{machine.get('python', '?')}; {machine.get('rustc', '?')}; git {machine.get('git', '?')}; "
      f"load average at start {machine.get('loadavg_at_start', '?')}, "
      f"at end {machine.get('loadavg_at_end', '?')}.")
    rounds = max((r["round"] for r in rows if r.get("label") == "seq"), default=0)
    p(f"Medians over {rounds} rounds (alternating which side goes first); "
      "ratio = how many times better ours is, from the medians; range = per-round ratios.\n")

    # 1a
    o, s = pick(rows, "seq", "ours"), pick(rows, "seq", "sdk")
    wall = lambda r: r["wall_s"]
    ow, sw = med(map(wall, o)), med(map(wall, s))
    ratio = sw / ow if ow and sw else None
    cpu = lambda r: (r.get("cpu") or {}).get("client_cpu_s")
    emu = lambda r: (r.get("cpu") or {}).get("emulator_cpu_s")
    ph = lambda rs, k: med(r["phase_mean_ms"][k] for r in rs)
    p("### 1a. 50 x (create -> run `true` -> kill), in sequence\n")
    p(table(
        ["", "ours", "SDK", "ratio (range)", "goal", "result"],
        [["wall, 50 cycles", fmt(ow, " s"), fmt(sw, " s"),
          f"{fmt(ratio)}x ({ratio_range(o, s, wall)})", ">= 2x", verdict(ratio, 2)],
         ["per cycle", fmt(ow and ow * 20, " ms"), fmt(sw and sw * 20, " ms"), "", "", ""],
         ["  create / run / kill (mean)",
          f"{fmt(ph(o, 'create'))} / {fmt(ph(o, 'run'))} / {fmt(ph(o, 'kill'))} ms",
          f"{fmt(ph(s, 'create'))} / {fmt(ph(s, 'run'))} / {fmt(ph(s, 'kill'))} ms", "", "", ""],
         ["client CPU, 50 cycles", fmt(med(map(cpu, o)), " s"), fmt(med(map(cpu, s)), " s"),
          f"{fmt(med(map(cpu, s)) / med(map(cpu, o)) if med(map(cpu, o)) else None)}x", "", ""],
         ["emulator CPU (incl. sandbox processes)", fmt(med(map(emu, o)), " s"),
          fmt(med(map(emu, s)), " s"), "", "", ""]]))
    for r in pick(rows, "seq-default-options", "ours"):
        p(f"\nWith E2bOptions::default() (create_rate {r['create_rate']}/s, the rate gate on): "
          f"{fmt(r['wall_s'], ' s')} for 50 cycles ({fmt(sw / r['wall_s'] if sw else None)}x the "
          f"SDK's median), create mean {fmt(r['phase_mean_ms']['create'], ' ms')}.")
    p()

    # 1b
    o = pick(rows, "stream", "ours")
    osp = pick(rows, "stream-spawn", "ours")
    s = pick(rows, "stream", "sdk")
    mbs = lambda r: r["mb_per_s"]
    om, ospm, sm = med(map(mbs, o)), med(map(mbs, osp)), med(map(mbs, s))
    ratio = om / sm if om and sm else None
    ratio_sp = ospm / sm if ospm and sm else None
    p("### 1b. stdout throughput, one command printing 50,000,000 bytes\n")
    p(table(
        ["", "ours", "SDK", "ratio (range)", "goal", "result"],
        [["`Sandbox::run` (1 MiB head+tail kept) vs `commands.run(on_stdout, retain_output=False)`",
          fmt(om, " MB/s"), fmt(sm, " MB/s"), f"{fmt(ratio)}x ({ratio_range(o, s, mbs, True)})",
          ">= 2x", verdict(ratio, 2)],
         ["`Sandbox::spawn`, counting bytes", fmt(ospm, " MB/s"), fmt(sm, " MB/s"),
          f"{fmt(ratio_sp)}x ({ratio_range(osp, s, mbs, True)})", ">= 2x", verdict(ratio_sp, 2)],
         ["client CPU (run / spawn vs SDK)",
          f"{fmt(med(map(cpu, o)), ' s')} / {fmt(med(map(cpu, osp)), ' s')}",
          fmt(med(map(cpu, s)), " s"), "", "", ""],
         ["emulator CPU", fmt(med(map(emu, o)), " s"), fmt(med(map(emu, s)), " s"), "", "", ""]]))
    p()

    # 1c
    o, s = pick(rows, "concurrent", "ours"), pick(rows, "concurrent", "sdk")
    ow, sw = med(map(wall, o)), med(map(wall, s))
    ratio = sw / ow if ow and sw else None
    fails = sum(r["failed"] for r in o + s)
    lims = o[0] if o else {}
    p("### 1c. 100 x (create -> run `true` -> kill), 100 threads each side\n")
    p(table(
        ["", "ours", "SDK", "ratio (range)", "goal", "result"],
        [["wall", fmt(ow, " s"), fmt(sw, " s"), f"{fmt(ratio)}x ({ratio_range(o, s, wall)})",
          "(ratio reported)", f"{fmt(ratio)}x"],
         ["  create / run / kill (mean per thread)",
          f"{fmt(ph(o, 'create'))} / {fmt(ph(o, 'run'))} / {fmt(ph(o, 'kill'))} ms",
          f"{fmt(ph(s, 'create'))} / {fmt(ph(s, 'run'))} / {fmt(ph(s, 'kill'))} ms", "", "", ""],
         ["client CPU", fmt(med(map(cpu, o)), " s"), fmt(med(map(cpu, s)), " s"),
          f"{fmt(med(map(cpu, s)) / med(map(cpu, o)) if med(map(cpu, o)) else None)}x", "", ""],
         ["emulator CPU", fmt(med(map(emu, o)), " s"), fmt(med(map(emu, s)), " s"), "", "", ""]]))
    p(f"\nLimits: ours create_rate {lims.get('create_rate')}/s, max_sandboxes "
      f"{lims.get('max_sandboxes')}; emulator --max-sandboxes 2000; failed cycles: {fails}.\n")

    # 1a-1c at a realistic latency
    delay = machine.get("delay_ms", "20")
    o, s = pick(rows, "seq-delay", "ours"), pick(rows, "seq-delay", "sdk")
    oc, sc = pick(rows, "concurrent-delay", "ours"), pick(rows, "concurrent-delay", "sdk")
    ost, osp, sst = (pick(rows, "stream-delay", "ours"), pick(rows, "stream-spawn-delay", "ours"),
                     pick(rows, "stream-delay", "sdk"))
    if o or s:
        rounds_d = max((r["round"] for r in o + s), default=0)
        p(f"### 1d. 1a-1c with {delay} ms added to every client-to-server read (proxy), "
          f"{rounds_d} rounds\n")
        drows = []
        for name, a, b in (("1a: 50 x create -> run -> kill, wall", o, s),
                           ("1c: 100 at once, wall", oc, sc)):
            aw, bw = med(map(wall, a)), med(map(wall, b))
            r_ = bw / aw if aw and bw else None
            drows.append([name, fmt(aw, " s"), fmt(bw, " s"),
                          f"{fmt(r_)}x ({ratio_range(a, b, wall)})", ">= 2x", verdict(r_, 2)])
        for name, a in (("1b: 50 MB stdout, `run`", ost), ("1b: 50 MB stdout, `spawn`", osp)):
            am, bm = med(map(mbs, a)), med(map(mbs, sst))
            r_ = am / bm if am and bm else None
            drows.append([name, fmt(am, " MB/s"), fmt(bm, " MB/s"),
                          f"{fmt(r_)}x ({ratio_range(a, sst, mbs, True)})", ">= 2x",
                          verdict(r_, 2)])
        drows.append(["1a: create / run / kill (mean)",
                      f"{fmt(ph(o, 'create'))} / {fmt(ph(o, 'run'))} / {fmt(ph(o, 'kill'))} ms",
                      f"{fmt(ph(s, 'create'))} / {fmt(ph(s, 'run'))} / {fmt(ph(s, 'kill'))} ms",
                      "", "", ""])
        drows.append(["1c: client CPU", fmt(med(map(cpu, oc)), " s"), fmt(med(map(cpu, sc)), " s"),
                      "", "", ""])
        p(table(["", "ours", "SDK", "ratio (range)", "goal", "result"], drows))
        p()

    # 2
    rp = pick(rows, "reap", bench="reap-cli")
    kl = pick(rows, "kill-loop", bench="kill-loop")
    secs = lambda r: r["seconds"]
    rs, ks = med(map(secs, rp)), med(map(secs, kl))
    ratio = ks / rs if rs and ks else None
    killed = [r["results"].get("killed", 0) for r in rp]
    rd = pick(rows, "reap-delay", bench="reap-cli")
    kd = pick(rows, "kill-loop-delay", bench="kill-loop")
    rds, kds = med(map(secs, rd)), med(map(secs, kd))
    p("### 2. reap of 500 leaked sandboxes vs a sequential kill loop (same E2bBackend)\n")
    p(table(
        ["", "reap (CLI, 16 workers)", "kill loop", "ratio (range)", "goal", "result"],
        [["emulator, loopback", fmt(rs, " s"), fmt(ks, " s"),
          f"{fmt(ratio)}x ({ratio_range(rp, kl, secs)})", ">= 8x", verdict(ratio, 8)],
         [f"secondary: +{machine.get('delay_ms', '20')} ms per request (proxy), one round",
          fmt(rds, " s"), fmt(kds, " s"),
          f"{fmt(kds / rds if rds and kds else None)}x", ">= 8x",
          verdict(kds / rds if rds and kds else None, 8)]]))
    p(f"\nKilled per reap: {killed}; kill-loop kills: {[r['killed'] for r in kl]}.")
    for label in ("reap-lib-disk", "reap-lib-tmpfs"):
        for r in pick(rows, label, bench="reap-lib"):
            c = r.get("cpu") or {}
            p(f"- `{label}`: plan {fmt(r['plan_seconds'], ' s')}, execute "
              f"{fmt(r['execute_seconds'], ' s')} (results {r['results']}); client CPU "
              f"{fmt(c.get('client_cpu_s'), ' s')}, emulator CPU {fmt(c.get('emulator_cpu_s'), ' s')}")
    for r in kl[:1]:
        c = r.get("cpu") or {}
        p(f"- kill loop: list {fmt(r['list_seconds'], ' s')}; client CPU "
          f"{fmt(c.get('client_cpu_s'), ' s')}, emulator CPU {fmt(c.get('emulator_cpu_s'), ' s')}")
    p()

    # 3
    o = pick(rows, "snapshot", "ours", bench="snapshot")
    s = pick(rows, "snapshot", "sdk", bench="snapshot")
    os_, ss = med(map(secs, o)), med(map(secs, s))
    ratio = ss / os_ if os_ and ss else None
    oe, se = pick(rows, "snapshot-e2e", "ours"), pick(rows, "snapshot-e2e", "sdk")
    oes, ses = med(map(secs, oe)), med(map(secs, se))
    od, sd = pick(rows, "snapshot-delay", "ours"), pick(rows, "snapshot-delay", "sdk")
    ods, sds = med(map(secs, od)), med(map(secs, sd))
    hashes = {r["tree_hash"] for r in o + s + od + sd}
    files = {(r["files"], r["bytes"]) for r in o + s}
    p("### 3. `project snapshot` of 1,000 files / 8,000,000 bytes vs SDK `files.list` + `files.read`\n")
    p(table(
        ["", "ours", "SDK", "ratio (range)", "goal", "result"],
        [["harvest in process (connected)", fmt(os_, " s"), fmt(ss, " s"),
          f"{fmt(ratio)}x ({ratio_range(o, s, secs)})", ">= 5x", verdict(ratio, 5)],
         ["end to end (`wmo-e2b project snapshot --json` vs `python sdk_bench.py harvest`)",
          fmt(oes, " s"), fmt(ses, " s"), f"{fmt(ses / oes if oes and ses else None)}x", "", ""],
         [f"secondary: +{machine.get('delay_ms', '20')} ms per request (proxy), one round",
          fmt(ods, " s"), fmt(sds, " s"), f"{fmt(sds / ods if ods and sds else None)}x", ">= 5x",
          verdict(sds / ods if ods and sds else None, 5)]]))
    p(f"\nTrees harvested (files, bytes): {sorted(files)}; distinct tree hashes across both "
      f"clients: {len(hashes)} (1 = identical harvests).")
    for r in pick(rows, "snapshot-breakdown", bench="snapshot-breakdown"):
        p(f"- breakdown (best of 3 each): `run true` {fmt(r['run_true_s'] * 1e3, ' ms')}, "
          f"`node -e ''` {fmt(r['node_startup_s'] * 1e3, ' ms')}, the walker with its output "
          f"to /dev/null {fmt(r.get('walker_to_devnull_s', 0) * 1e3, ' ms')}, "
          f"{r['walker_json_bytes']} stdout bytes (the walker's JSON) "
          f"{fmt(r['stdout_transport_s'] * 1e3, ' ms')}, host parse + base64 decode "
          f"{fmt(r['host_parse_decode_s'] * 1e3, ' ms')}; for comparison `tar` + one `/files` "
          f"read {fmt(r['tar_then_files_read_s'] * 1e3, ' ms')}")
    p()

    # diagnostics
    p("### Diagnostics: one warm sandbox, 40 operations each\n")
    drows = []
    for r in pick(rows, "ops") + pick(rows, "ops-no-internet"):
        name = f"{r['client']} {r['op']}" + (" (internet off)" if r["label"] == "ops-no-internet" else "")
        drows.append([name, fmt(r["p50_ms"], " ms"), fmt(r["p90_ms"], " ms"),
                      r.get("new_connections", "-")])
    p(table(["operation", "p50", "p90", "new TCP connections (of 40)"], drows))
    for r in pick(rows, "captured"):
        p(f"\n`Captured::push` of 50 MB in 64 KiB chunks with max 1 MiB: "
          f"{fmt(r['seconds'] * 1e3, ' ms')} ({fmt(r['gb_per_s'], ' GB/s')}).")


if __name__ == "__main__":
    main()
