#!/usr/bin/env python3
"""A TCP proxy that holds every client-to-server read for DELAY_MS before forwarding it, so a
request to a loopback emulator costs about one network round trip more. Used by
scripts/bench/e2b/run.sh (the latency rows: client, reap, snapshot, each side through it
alike) and scripts/bench/e2b/eval_latency.sh.

    delay_proxy.py --upstream 127.0.0.1:PORT --delay-ms 20

Prints {"url": "http://127.0.0.1:PORT"} once listening; stops on SIGTERM.
"""

import argparse
import json
import signal
import socket
import sys
import threading
import time


def pipe(src, dst, delay):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if delay:
                time.sleep(delay)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(client, upstream, delay):
    try:
        server = socket.create_connection(upstream)
    except OSError:
        client.close()
        return
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=pipe, args=(client, server, delay), daemon=True).start()
    threading.Thread(target=pipe, args=(server, client, 0), daemon=True).start()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", required=True)
    p.add_argument("--delay-ms", type=float, default=20)
    a = p.parse_args()
    host, port = a.upstream.rsplit(":", 1)
    upstream = (host, int(port))
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(512)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(json.dumps({"url": f"http://127.0.0.1:{lsock.getsockname()[1]}"}), flush=True)
    while True:
        client, _ = lsock.accept()
        serve(client, upstream, a.delay_ms / 1000)


if __name__ == "__main__":
    main()
