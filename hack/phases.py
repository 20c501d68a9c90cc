#!/usr/bin/env python3
"""Where a tool call's time goes, step by step: the median time of each
step of a cold `runsbx call -- /bin/true` and of a warm call through
`runsbx serve`, from runsbx's own phase events (crate runsbx-runtime,
`phase`), which mark the end of each step.

    hack/phases.py [RUNSBX_BINARY] [RUNS]      (default: the release build, 40)

Each call's log is read with RUNSBX_LOG=runsbx::phase=debug and
--log-format json, in a file on /dev/shm (every other event stays off).
Writing the log has a cost of its own, so each figure's whole call is
also timed without it. The first row of the cold call is from this
script's spawn to runsbx's first event (exec, the C runtime, the command
line), the last from runsbx's last event to its exit as this script sees
it; for the warm call, from this script's write of the request to the
worker's reading of it (through serve), and from the worker's reply to
this script's reading of it. Times between calls leave the machine idle
(0.2 s), as an agent's calls are. A profile, not a benchmark: the
benchmarks with their peers are hack/bench.sh.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BINARY = os.path.join(HERE, "..", "target", "x86_64-unknown-linux-gnu", "release", "runsbx")
ENV = dict(os.environ, RUNSBX_LOG="runsbx::phase=debug")
WARMUP = 3
LOG_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


def ns_of(stamp):
    """RFC 3339 with nanoseconds (UTC) to nanoseconds since the epoch."""
    whole, frac = stamp.rstrip("Z").split(".")
    secs = datetime.fromisoformat(whole + "+00:00").timestamp()
    return int(secs) * 1_000_000_000 + int(frac.ljust(9, "0")[:9])


def events(log_path):
    """(pid, step, ns) of every phase event in a log, in order."""
    out = []
    with open(log_path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            step, _, pid = e.get("msg", "").rpartition(" pid=")
            if step and pid.isdigit():
                out.append((int(pid), step, ns_of(e["time"])))
    return out


def table(title, rows):
    """rows: {step: [ms, ...]} in order."""
    print(title)
    total = 0.0
    for step, times in rows.items():
        med = statistics.median(times)
        total += med
        print(f"  {step:<34} {med:7.3f} ms   {total:7.2f}")
    print(f"  {'(sum of the medians)':<34} {total:7.3f} ms")


def cold(binary, runs, root):
    rows = defaultdict(list)
    totals = []
    unlogged = []
    for i in range(runs + WARMUP):
        t0 = time.time_ns()
        subprocess.run([binary, "--root", root, "call", "--", "/bin/true"],
                       stdout=subprocess.DEVNULL, check=True)
        if i >= WARMUP:
            unlogged.append((time.time_ns() - t0) / 1e6)
        time.sleep(0.2)
        with tempfile.NamedTemporaryFile(suffix=".json", dir=LOG_DIR) as log:
            t0 = time.time_ns()
            subprocess.run(
                [binary, "--root", root, "--log-format", "json", "--log", log.name,
                 "call", "--", "/bin/true"],
                env=ENV, stdout=subprocess.DEVNULL, check=True)
            t1 = time.time_ns()
            seen = events(log.name)
        if i < WARMUP:
            continue
        prev = t0
        named = set()
        for n, (_, step, t) in enumerate(seen):
            # Rootless, runsbx starts again in a user namespace of its own.
            name = step + " (again)" if step in named else step
            named.add(step)
            rows["spawn to " + name if n == 0 else name].append((t - prev) / 1e6)
            prev = t
        rows["exit, seen by the caller"].append((t1 - prev) / 1e6)
        totals.append((t1 - t0) / 1e6)
        time.sleep(0.2)
    table(f"cold `runsbx call -- /bin/true`, {runs} calls (median per step, running sum)", rows)
    print(f"  {'(median of the whole call)':<34} {statistics.median(totals):7.3f} ms")
    print(f"  {'(the same, not logged)':<34} {statistics.median(unlogged):7.3f} ms")


def serve_calls(binary, runs, root, log=None):
    """Warm calls through `runsbx serve`, one at a time: (start, end) of
    each, as this script saw them, in nanoseconds."""
    logging = ["--log-format", "json", "--log", log] if log else []
    serve = subprocess.Popen(
        [binary, "--root", root, *logging, "serve", "--size=2"],
        env=ENV if log else None, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    asked = {}
    try:
        for i in range(runs + WARMUP):
            time.sleep(0.2)
            line = json.dumps({"id": i, "argv": ["--json", "--", "/bin/true"]}) + "\n"
            t0 = time.time_ns()
            serve.stdin.write(line.encode())
            serve.stdin.flush()
            reply = json.loads(serve.stdout.readline())
            t1 = time.time_ns()
            if not reply.get("warm"):
                sys.exit(f"phases.py: call {i} was not warm: {reply}")
            asked[i] = (t0, t1)
    finally:
        serve.stdin.close()
        serve.wait()
    return asked


def warm(binary, runs, root):
    rows = defaultdict(list)
    totals = []
    unlogged = [(t1 - t0) / 1e6 for i, (t0, t1) in serve_calls(binary, runs, root).items() if i >= WARMUP]
    with tempfile.NamedTemporaryFile(suffix=".json", dir=LOG_DIR) as log:
        asked = serve_calls(binary, runs, root, log.name)
        by_pid = defaultdict(list)
        for pid, step, t in events(log.name):
            by_pid[pid].append((step, t))
    # Each worker's steps from its request to its reply, matched to the
    # requests in the order they were read.
    served = sorted((steps for steps in by_pid.values() if any(s == "request read" for s, _ in steps)),
                    key=lambda steps: next(t for s, t in steps if s == "request read"))
    for i, steps in enumerate(served):
        if i < WARMUP or i not in asked:
            continue
        t0, t1 = asked[i]
        names = [s for s, _ in steps]
        steps = steps[names.index("request read"):names.index("replied") + 1]
        prev = t0
        for n, (step, t) in enumerate(steps):
            rows["request written to " + step if n == 0 else step].append((t - prev) / 1e6)
            prev = t
        rows["reply read by the caller"].append((t1 - prev) / 1e6)
        totals.append((t1 - t0) / 1e6)
    table(f"warm call of /bin/true through `runsbx serve`, {len(totals)} calls", rows)
    print(f"  {'(median of the whole call)':<34} {statistics.median(totals):7.3f} ms")
    print(f"  {'(the same, not logged)':<34} {statistics.median(unlogged):7.3f} ms")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_BINARY
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    root = tempfile.mkdtemp(prefix="runsbx-phases.")
    try:
        cold(binary, runs, root)
        print()
        warm(binary, runs, root)
    finally:
        # runsbx removes what it made there; what it keeps for the next
        # call (its locks' directory and the like) goes with the root.
        subprocess.run(["rm", "-rf", root], check=False)


if __name__ == "__main__":
    main()
