#!/usr/bin/env python3
"""Warm-pool figures for hack/bench.sh: latency of a warm call from the
Python client (runsbx.Pool) and from `runsbx serve` directly (one JSON
line each way), calls per second with 2 and 8 at once, and a sustained
run. Prints one line per figure; times are of the whole call as the
caller sees it.

    hack/pool-bench.py RUNSBX_BINARY [RUNS] [SUSTAINED] [BWRAP_TRUE_MS BWRAP_PY_MS [BWRAP_RATE]]

With bubblewrap's cold medians of the same run (from hack/bench.sh), the
warm medians are also printed as ratios to them; with its cold sandboxes
per second (SUSTAINED of /bin/true, 2 at once), the sustained rate too.

A warm call is one that finds a sandbox ready: an agent's tool calls come
seconds apart (the model thinks between them), so the latency runs leave
the pool 0.2 s to refill between calls (not counted). The per-second and
sustained runs do not: they measure how fast sandboxes are built and torn
down.
"""

import base64  # noqa: F401  (the protocol's stdin encoding, see serve.rs)
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "clients", "python", "src"))
import runsbx


def pct(times, p):
    s = sorted(times)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def ms(x):
    return f"{x * 1000:.2f}"


def warm_client(binary, cmd, runs):
    """Warm calls from runsbx.Pool, one at a time."""
    times = []
    with runsbx.Pool(size=2, binary=binary) as pool:
        pool.run(cmd)
        for _ in range(runs):
            time.sleep(0.2)
            t0 = time.perf_counter()
            r = pool.run(cmd)
            times.append(time.perf_counter() - t0)
            assert r.exit_code == 0, r
    return times


def serve_call(serve, i, cmd):
    """Call `i` of `cmd`, written to the `runsbx serve` process `serve` as
    one JSON line, after 0.2 s for its pool to refill: its reply, and the
    seconds from the request's write to the reply's read."""
    time.sleep(0.2)
    line = json.dumps({"id": i, "argv": ["--json", "--", *cmd]}) + "\n"
    t0 = time.perf_counter()
    serve.stdin.write(line.encode())
    serve.stdin.flush()
    reply = json.loads(serve.stdout.readline())
    return reply, time.perf_counter() - t0


def warm_serve(binary, cmd, runs):
    """Warm calls written to `runsbx serve` as JSON lines, one at a time."""
    p = subprocess.Popen(
        [binary, "serve", "--size=2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    times = []
    try:
        for i in range(runs + 1):
            reply, dt = serve_call(p, i, cmd)
            assert reply["result"]["exit_code"] == 0, reply
            if i:
                times.append(dt)
    finally:
        p.stdin.close()
        p.wait()
    return times


def per_second(binary, cmd, at_once, calls, size):
    """Calls finished per second with `at_once` in flight."""
    with runsbx.Pool(size=size, binary=binary) as pool:
        pool.run(cmd)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(at_once) as ex:
            results = list(ex.map(lambda _: pool.run(cmd), range(calls)))
        dt = time.perf_counter() - t0
    assert all(r.exit_code == 0 for r in results)
    warm = len({r.id for r in results})
    assert warm == calls, "a sandbox was handed out twice"
    return calls / dt


def main():
    binary = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    sustained = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    bwrap = [float(x) for x in sys.argv[4:6]] if len(sys.argv) > 5 else [None, None]
    bwrap_rate = float(sys.argv[6]) if len(sys.argv) > 6 else None
    for cmd, cold in zip((["/bin/true"], ["python3", "-c", "pass"]), bwrap):
        name = " ".join(cmd)
        c = warm_client(binary, cmd, runs)
        s = warm_serve(binary, cmd, runs)
        ratio = f"   Pool.run p50/bwrap cold = {pct(c, 50) * 1000 / cold:.2f}" if cold else ""
        print(
            f"  {name:<16} Pool.run p50 {ms(pct(c, 50))} p99 {ms(pct(c, 99))}   "
            f"serve p50 {ms(pct(s, 50))} p99 {ms(pct(s, 99))}{ratio}"
        )
    cmd = ["python3", "-c", "pass"]
    for n in (2, 8):
        print(f"  {n} at once: {per_second(binary, cmd, n, 8 * n, size=n):.1f} calls/s (pool size {n})")
    rate = per_second(binary, ["/bin/true"], 2, sustained, size=4)
    vs = f"   pool/bwrap cold = {rate / bwrap_rate:.2f}" if bwrap_rate else ""
    print(f"  sustained: {sustained} calls of /bin/true, 2 at once, pool size 4: {rate:.1f} calls/s{vs}")


if __name__ == "__main__":
    threading.excepthook = lambda a: (print(a.exc_value, file=sys.stderr), os._exit(1))
    main()
