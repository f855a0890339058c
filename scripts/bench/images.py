#!/usr/bin/env python3
"""Task environments, side by side in one run (run as root, from the repository root):

1. cold pull + unpack of a ~100 MB image from a loopback registry: `wmo-e2b image pull`
   against `skopeo copy` + `umoci unpack`, interleaved, each into fresh directories;
2. a warm task (a reused sandbox) on that image against one on the host's root;
3. 64 tasks on one image from an empty store: blobs fetched from the registry and stored;
4. 50 image tasks at -j 8: wall, host CPU per task, store size.

Needs the release binary (`cargo build --release`), docker-registry, buildah, skopeo, umoci
and busybox-static (scripts/system-deps.sh installs them). QUICK=1 runs small counts.
Prints a Markdown table; no test asserts on any of it.
"""

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUICK = os.environ.get("QUICK") == "1"
BIN = Path("target/release/wmo-e2b").resolve()
LAYERS = 4
LAYER_MB = 6 if QUICK else 25
ROUNDS = 1 if QUICK else 3


def run(*args, env=None, **kw):
    return subprocess.run(args, check=True, env=env, **kw)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_registry(work):
    port = free_port()
    config = work / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {work / 'registry'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: info\n"
    )
    log = open(work / "registry.log", "w")
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    raise SystemExit("docker-registry did not start")


def build_image(work, registry):
    """busybox as /bin/sh, then LAYERS layers of data (half random, half text)."""
    b = ["buildah", "--root", str(work / "b/root"), "--runroot", str(work / "b/run"),
         "--storage-driver", "vfs"]
    tree = work / "tree"
    (tree / "bin").mkdir(parents=True)
    (tree / "app").mkdir()
    shutil.copy("/bin/busybox", tree / "bin/busybox")
    for applet in ["sh", "cat", "test", "true", "ls", "timeout", "rm", "mkdir", "cp"]:
        os.symlink("busybox", tree / "bin" / applet)
    base = subprocess.run(b + ["from", "scratch"], check=True, capture_output=True,
                          text=True).stdout.strip()
    run(*b, "copy", base, str(tree), "/", stdout=subprocess.DEVNULL)
    run(*b, "config", "--workingdir", "/app", base)
    run(*b, "commit", "--quiet", base, "bench-0", stdout=subprocess.DEVNULL)
    for i in range(1, LAYERS + 1):
        data = work / f"data{i}"
        data.mkdir()
        half = LAYER_MB * 1024 * 1024 // 2
        (data / "random.bin").write_bytes(os.urandom(half))
        line = b"the quick brown fox jumps over the lazy dog %d\n"
        text = b"".join(line % n for n in range(half // len(line) + 1))[:half]
        (data / "text.txt").write_bytes(text)
        c = subprocess.run(b + ["from", f"bench-{i - 1}"], check=True, capture_output=True,
                           text=True).stdout.strip()
        run(*b, "copy", c, str(data), f"/data/{i}", stdout=subprocess.DEVNULL)
        run(*b, "commit", "--quiet", c, f"bench-{i}", stdout=subprocess.DEVNULL)
    ref = f"{registry}/bench/big:1"
    run(*b, "push", "--quiet", "--tls-verify=false", f"bench-{LAYERS}", f"docker://{ref}",
        stdout=subprocess.DEVNULL)
    return ref


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cold_pulls(work, ref):
    ours, theirs = [], []
    for n in range(ROUNDS):
        home = work / f"home-cold-{n}"
        env = dict(os.environ, WMO_E2B_HOME=str(home))
        ours.append(timed(lambda: run(str(BIN), "image", "pull", ref, env=env,
                                      stdout=subprocess.DEVNULL)))
        layout, bundle = work / f"oci-{n}", work / f"bundle-{n}"
        theirs.append(timed(lambda: (
            run("skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{ref}",
                f"oci:{layout}:big"),
            run("umoci", "unpack", "--image", f"{layout}:big", str(bundle),
                stdout=subprocess.DEVNULL),
        )))
        shutil.rmtree(home)
        shutil.rmtree(layout)
        shutil.rmtree(bundle)
    return statistics.median(ours), statistics.median(theirs)


def tasks_file(path, n, image):
    with open(path, "w") as f:
        for i in range(n):
            task = {"id": f"t{i:03}", "instruction": "x", "verify": "test -d /"}
            if image:
                task["image"] = image
            f.write(json.dumps(task) + "\n")


def evaluate(work, name, n, image, jobs, home):
    tasks = work / f"{name}.jsonl"
    tasks_file(tasks, n, image)
    out = work / f"out-{name}"
    env = dict(os.environ, WMO_E2B_HOME=str(home))
    t0 = time.perf_counter()
    before = os.times()
    run(str(BIN), "eval", "--tasks", str(tasks), "--harness", "nop", "-j", str(jobs),
        "--out", str(out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = os.times()
    wall = time.perf_counter() - t0
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    records = [json.loads(line) for line in open(out / "results.jsonl")]
    assert all(r["status"] == "passed" for r in records), name
    return wall, cpu, records


def warm_task_seconds(records):
    per = [r["timings"]["acquire"] + r["timings"]["episode"] + r["timings"]["verify"]
           for r in records if r["sandbox"]["reused"]]
    return statistics.median(per)


def blob_gets(log, start):
    with open(log) as f:
        f.seek(start)
        # The registry's access log: one `"GET /v2/<name>/blobs/<digest> HTTP/1.1"` line
        # per request served.
        return sum(1 for line in f if '"GET /v2/' in line and "/blobs/" in line)


def du(path):
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


def main():
    if os.geteuid() != 0:
        raise SystemExit("run as root: image roots need sandboxes with id ranges of their own")
    if not BIN.is_file():
        raise SystemExit("build first: cargo build --release")
    work = Path(tempfile.mkdtemp(prefix="wmo-bench-images-"))
    registry, addr = start_registry(work)
    try:
        ref = build_image(work, addr)
        ours, theirs = cold_pulls(work, ref)
        home = work / "home-warm"
        env = dict(os.environ, WMO_E2B_HOME=str(home))
        run(str(BIN), "image", "pull", ref, env=env, stdout=subprocess.DEVNULL)
        n = 10 if QUICK else 30
        on_image = warm_task_seconds(evaluate(work, "warm-image", n, ref, 1, home)[2])
        on_host = warm_task_seconds(evaluate(work, "warm-host", n, None, 1, home)[2])
        fresh = work / "home-64"
        log = work / "registry.log"
        start = log.stat().st_size
        evaluate(work, "many", 16 if QUICK else 64, ref, 4, fresh)
        gets = blob_gets(log, start)
        blobs = len(list((fresh / "images/blobs/sha256").iterdir()))
        roots = len([p for p in (fresh / "images/rootfs").iterdir() if p.is_dir()])
        n50 = 12 if QUICK else 50
        wall, cpu, _ = evaluate(work, "fifty", n50, ref, 8, home)
        store = du(home / "images")
    finally:
        registry.terminate()
        registry.wait()
    mb = LAYERS * LAYER_MB
    print(f"| measurement | ours | baseline | ratio |")
    print(f"|---|---|---|---|")
    print(f"| cold pull + unpack, {mb} MB in {LAYERS + 1} layers (median of {ROUNDS}) | "
          f"{ours:.2f} s | skopeo + umoci {theirs:.2f} s | {theirs / ours:.2f}x faster |")
    print(f"| warm task, nop (median of reused sandboxes) | image {on_image * 1000:.0f} ms | "
          f"host root {on_host * 1000:.0f} ms | {on_image / on_host:.2f}x |")
    print(f"| {16 if QUICK else 64} tasks on one image, empty store, -j 4 | "
          f"{gets} blob GETs, {blobs} blobs stored, {roots} unpacked root | "
          f"{LAYERS + 3} blobs in the image ({LAYERS + 1} layers, config, manifest) | |")
    print(f"| {n50} image tasks, -j 8 (pulled) | wall {wall:.1f} s, "
          f"CPU {cpu / n50 * 1000:.0f} ms/task | store {store / 1e6:.0f} MB | |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
