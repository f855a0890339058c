#!/usr/bin/env python3
"""Turns one scripts/bench/pi/run.sh results directory into the tables of RESULTS.md.

usage: summarize.py RESULTS_DIR
Every ratio is between two numbers measured in that same run.
"""
import json
import os
import statistics
import sys

D = sys.argv[1]
med = statistics.median
FLAT = 0.01  # MiB/episode over the second half: what "flat" means (as in BENCHMARKS.md)
HELLO_GOAL_MS = 80.0  # BENCHMARKS.md, "Runner spawn-to-hello": <= 80 ms
WALL_GOAL = 0.5  # warm pi episode wall <= 1/2 of the reference's


def load(name):
    p = os.path.join(D, name)
    if not os.path.exists(p):
        return []
    out = []
    for line in open(p):
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def verdict(ok):
    if ok is None:
        return "no goal given"
    return "**met**" if ok else "**missed**"


def f(x, nd=1):
    if x is None:
        return "–"
    if isinstance(x, float) and abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{nd}f}"


def ratio(a, b):
    return a / b if a is not None and b else None


def slope(points, lo=0):
    pts = [(x, y / 1024.0) for x, y in points if x >= lo]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def row(*cells):
    print("| " + " | ".join(str(c) for c in cells) + " |")


print(f"# Results: {os.path.basename(D.rstrip('/'))}\n")
try:
    print("```\n" + open(os.path.join(D, "machine.txt")).read().strip() + "\n```\n")
except OSError:
    pass

# ------------------------------------------------------------------------------------- 1
inst = load("install.jsonl")
hello = load("hello.jsonl")
print("## 1. Install and spawn-to-hello (baseline: the builtin runner, same run)\n")
warm_cache = [r for r in inst if r.get("npm_cache") != "empty"]
empty_cache = [r for r in inst if r.get("npm_cache") == "empty"]
cold = [x["install_cold_ms"] for r in warm_cache for x in r["rows"]]
cold_empty = [x["install_cold_ms"] for r in empty_cache for x in r["rows"]]
ens_warm = [x["ensure_installed_warm_median_ms"] for r in inst for x in r["rows"]]
after_install = [x["hello_after_install_ms"] for r in inst for x in r["rows"]]
first_after_install = [x["first_pi_episode_ms"] for r in inst for x in r["rows"]]
h = hello[0] if hello else None
b_hello = h["median_builtin_hello_ms"] if h else None
p_hello = h["median_pi_hello_ms"] if h else None
row("measure", "n", "ours: pi", "baseline: builtin", "ratio", "goal", "verdict")
row(*["---"] * 7)
if cold:
    row("`ensure_installed`, fresh state dir (npm's cache warm), s", len(cold),
        f"{med(cold) / 1000:.1f} (" + ", ".join(f"{c / 1000:.1f}" for c in cold) + ")",
        "0 (nothing to install)", "–", "–", verdict(None))
if cold_empty:
    row("`ensure_installed`, fresh state dir and empty npm cache, s", len(cold_empty),
        f"{med(cold_empty) / 1000:.1f}", "0", "–", "–", verdict(None))
if ens_warm:
    row("`ensure_installed`, warm (marker read; median of 30 per install), ms",
        len(ens_warm), f(med(ens_warm), 3), "0", "–", "–", verdict(None))
# What the install directory holds: the bundle and its inputs (older runs: node_modules).
size_key = next((k for k in ("install", "node_modules") if inst and inst[0].get(k + "_bytes")), None)
if size_key:
    bundle = inst[0].get("bundle_bytes")
    row("install size", 1, f"{inst[0][size_key + '_bytes'] / 1e6:.2f} MB "
        f"({inst[0].get(size_key + '_disk_bytes', 0) / 1e6:.2f} MB on disk), "
        f"{inst[0][size_key + '_files']:,} files"
        + (f"; the bundle sandboxes get: {bundle / 1e6:.2f} MB" if bundle else ""),
        "–", "–", "–", verdict(None))
if h:
    row("spawn-to-hello, warm cache (median), ms", h["reps"], f(p_hello), f(b_hello),
        f(ratio(p_hello, b_hello), 2), f"≤ {HELLO_GOAL_MS:.0f} ms",
        verdict(p_hello <= HELLO_GOAL_MS))
    if after_install:
        a = med(after_install)
        row("spawn-to-hello of the first runner after a cold install, ms", len(after_install),
            f(a) + " (" + ", ".join(f(x) for x in after_install) + ")", f(b_hello),
            f(ratio(a, b_hello), 2), f"≤ {HELLO_GOAL_MS:.0f} ms", verdict(a <= HELLO_GOAL_MS))
    if cold:
        tot = med(cold) + (med(after_install) if after_install else p_hello)
        row("cold cache, nothing to hello (install + spawn-to-hello), ms", len(cold), f(tot),
            f(b_hello), f(ratio(tot, b_hello), 0), "–", verdict(None))
    row("first episode on a fresh runner (pi: its lazy import), ms", h["reps"],
        f(h["median_pi_first_episode_ms"]), f(h["median_builtin_first_episode_ms"]),
        f(ratio(h["median_pi_first_episode_ms"], h["median_builtin_first_episode_ms"]), 0),
        "–", verdict(None))
    if first_after_install:
        row("first pi episode right after a cold install, ms", len(first_after_install),
            f(med(first_after_install)), f(h["median_builtin_first_episode_ms"]), "–", "–",
            verdict(None))
    row("bare `node -e ''` (sandbox env), ms, for context", h["reps"],
        f(h["median_bare_node_ms"]), "–", "–", "–", "–")
print()

# ------------------------------------------------------------------------------------- 2
print("## 2. Per-episode host overhead on a warm sandbox (baseline: builtin, interleaved)\n")
row("env", "measure", "n", "ours: pi", "baseline: builtin", "ratio", "goal", "verdict")
row(*["---"] * 8)
for e in load("episode.jsonl"):
    p, b = e["pi"], e["builtin"]
    for key, label in [
        ("host_cpu_ms_per_episode", "host CPU per episode (mean), ms"),
        ("median_host_cpu_ms", "host CPU per episode (median), ms"),
        ("host_cpu_ms_per_episode_episode", "… of which the episode itself, ms"),
        ("median_wall_ms", "wall per episode, acquire → release (median), ms"),
        ("p90_wall_ms", "wall per episode (p90), ms"),
        ("median_episode_wall_ms", "`run_episode` alone (median), ms"),
        ("runner_cpu_ms_per_episode", "runner CPU per episode, ms"),
    ]:
        row(e["env"], label, p["episodes"], f(p[key], 2), f(b[key], 2),
            f(ratio(p[key], b[key]), 2), "–", verdict(None))
    row(e["env"], "runner RSS after the run, MiB", p["episodes"],
        f(p["runner_rss_kb"] / 1024), f(b["runner_rss_kb"] / 1024),
        f(ratio(p["runner_rss_kb"], b["runner_rss_kb"]), 2), "–", verdict(None))
print()

# ------------------------------------------------------------------------------------- 3
print("## 3. Side by side with the reference (`bench_episode.py seq`, same run)\n")
ref = {r.get("round"): r for r in load("seq_ref.jsonl")}
ours = load("seq_ours.jsonl")
variants = []
for r in ours:
    if r["variant"] not in variants:
        variants.append(r["variant"])
print("Warm episode wall time, alternating rounds (median of each run's episodes):\n")
row("round", "reference ms", *[f"ours {v} ms" for v in variants], *[f"ratio {v}" for v in variants])
row(*["---"] * (2 + 2 * len(variants)))
ratios = {v: [] for v in variants}
for rnd in sorted({r["round"] for r in ours}):
    rf = ref.get(rnd)
    rms = rf["median_wall_s"] * 1000 if rf else None
    cells, rcells = [], []
    for v in variants:
        o = next((r for r in ours if r["round"] == rnd and r["variant"] == v), None)
        oms = o["median_wall_ms"] if o else None
        q = ratio(oms, rms)
        if q is not None:
            ratios[v].append(q)
        cells.append(f(oms, 2))
        rcells.append(f(q, 3))
    row(rnd, f(rms, 2), *cells, *rcells)
print()

long_ours = {r["variant"]: r for r in load("long_ours.jsonl")}
long_ref = (load("long_ref.jsonl") or [None])[0]
lp = long_ours.get("pi")
row("measure", "ours: pi", "baseline: reference", "ratio", "goal", "verdict")
row(*["---"] * 6)
for v in variants:
    if ratios[v]:
        m = med(ratios[v])
        rr = [r["median_wall_s"] * 1000 for r in ref.values()]
        oo = [r["median_wall_ms"] for r in ours if r["variant"] == v]
        label = "warm episode wall, median of rounds, ms" + ("" if v == "pi" else f" ({v})")
        row(label, f(med(oo), 2), f(med(rr), 2),
            f"{m:.3f} (rounds {min(ratios[v]):.3f}–{max(ratios[v]):.3f})",
            "≤ 0.5" if v == "pi" else "–",
            verdict(m <= WALL_GOAL) if v == "pi" else verdict(None))
if lp and long_ref:
    rms = long_ref["median_wall_s"] * 1000
    row(f"warm episode wall, the {lp['episodes']}-episode runs, ms", f(lp["median_wall_ms"], 2),
        f(rms, 2), f(ratio(lp["median_wall_ms"], rms), 3), "≤ 0.5",
        verdict(lp["median_wall_ms"] / rms <= WALL_GOAL))
    rc = long_ref["host_cpu_s_per_episode"] * 1000
    row("host CPU per episode, ms", f(lp["host_cpu_ms_per_episode"], 2), f(rc, 2),
        f(ratio(lp["host_cpu_ms_per_episode"], rc), 3), "–", verdict(None))
    nc = long_ref["node_cpu_s_per_episode"] * 1000
    row("runner CPU per episode, ms", f(lp["runner_cpu_ms_per_episode"], 2), f(nc, 2),
        f(ratio(lp["runner_cpu_ms_per_episode"], nc), 3), "–", verdict(None))
    w0 = lp["warmup_wall_ms"][0]
    r0 = long_ref["warmup_wall_s"][0] * 1000
    row("first episode on a cold pool (create + hello + pi import + episode), ms", f(w0),
        f(r0), f(ratio(w0, r0), 3), "–", verdict(None))
    row("episode_start on the wire, bytes",
        f"{lp['episode_start_wire_bytes']:,}", "~376,000 (25 files, 255,974 B)", "–", "–", "–")
    rs = long_ref["node_rss_samples_kb"]
    n = long_ref["episodes"]
    s_all, s_2nd = slope(rs), slope(rs, n / 2)
    o_all = lp["runner_rss_slope_mib_per_episode"]
    o_2nd = lp["runner_rss_slope_2nd_half_mib_per_episode"]
    row(f"runner RSS, first → last of {n}, MiB",
        f"{lp['runner_rss_kb'][0][1] / 1024:.1f} → {lp['runner_rss_kb'][-1][1] / 1024:.1f}",
        f"{rs[0][1] / 1024:.1f} → {rs[-1][1] / 1024:.1f}", "–", "–", "–")
    row("runner RSS slope, MiB/episode, all / 2nd half", f"{o_all:.4f} / {o_2nd:.4f}",
        f"{s_all:.4f} / {s_2nd:.4f}", f"{ratio(o_2nd, s_2nd):.3f} (2nd half)",
        f"flat (≤ {FLAT} 2nd half)", verdict(o_2nd <= FLAT))
lb = long_ours.get("builtin")
if lb:
    row(f"(ours builtin, same {lb['episodes']} episodes) runner RSS slope all / 2nd half, "
        "wall ms",
        f"{lb['runner_rss_slope_mib_per_episode']:.4f} / "
        f"{lb['runner_rss_slope_2nd_half_mib_per_episode']:.4f}, {lb['median_wall_ms']:.2f}",
        "–", "–", "–", "–")
lst = (load("longest_ours.jsonl") or [None])[0]
if lst:
    kb = [k for _, k in lst["runner_rss_kb"]]
    row(f"(ours pi, {lst['episodes']:,} episodes) runner RSS first / peak / last MiB, "
        "slope 2nd half",
        f"{kb[0] / 1024:.1f} / {max(kb) / 1024:.1f} / {kb[-1] / 1024:.1f}, "
        f"{lst['runner_rss_slope_2nd_half_mib_per_episode']:.4f}", "–", "–",
        f"flat (≤ {FLAT} 2nd half)",
        verdict(lst["runner_rss_slope_2nd_half_mib_per_episode"] <= FLAT))
print()
for name, r in [("ours pi", lp), ("ours builtin", lb), ("ours pi, longest", lst)]:
    if r:
        print(f"- {name} runner RSS samples (episode, KiB): {r['runner_rss_kb']}")
if long_ref:
    print(f"- reference runner RSS samples (episode, KiB): {long_ref['node_rss_samples_kb']}")
