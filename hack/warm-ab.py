#!/usr/bin/env python3
"""Two runsbx builds' warm calls, interleaved in one loop: the median time
of a warm call through `runsbx serve` for each, and their ratio.

    hack/warm-ab.py BUILD_A BUILD_B [CALLS] [COMMAND...]
                                          (default 80 calls each, /bin/true)

Each build runs its own `runsbx serve --size=2`; the requests alternate
between them (which goes first swaps every round), 0.2 s apart so that
each finds its pool refilled and the CPUs idle, as an agent's calls do.
On these VMs the speed drifts from minute to minute, which separate runs
of hack/phases.py or hack/pool-bench.py take for a difference; in one
loop the drift falls on both builds alike. A call is timed from the
write of its request line to the read of its reply, as
hack/pool-bench.py's `serve` figures are (its `serve_call`). For a small change, run it
twice with the builds swapped.
"""

import importlib.util
import os
import statistics
import subprocess
import sys

# hack/pool-bench.py's call through `runsbx serve`, timed as its figures are.
_spec = importlib.util.spec_from_file_location(
    "pool_bench", os.path.join(os.path.dirname(os.path.abspath(__file__)), "pool-bench.py")
)
pool_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pool_bench)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    builds = {"A": sys.argv[1], "B": sys.argv[2]}
    calls = int(sys.argv[3]) if len(sys.argv) > 3 else 80
    cmd = sys.argv[4:] or ["/bin/true"]
    serves = {
        k: subprocess.Popen([b, "serve", "--size=2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for k, b in builds.items()
    }
    times = {k: [] for k in builds}
    try:
        for i in range(calls + 1):
            for k in ("A", "B") if i % 2 else ("B", "A"):
                reply, dt = pool_bench.serve_call(serves[k], i, cmd)
                if reply.get("warm") is not True:
                    sys.exit(f"build {k}: the call was not warm: {reply}")
                if i:  # the first of each is left out
                    times[k].append(dt)
    finally:
        for serve in serves.values():
            serve.stdin.close()
            serve.wait()
    a, b = (statistics.median(times[k]) * 1000 for k in ("A", "B"))
    print(f"A {a:.3f} ms  B {b:.3f} ms  B/A {b / a:.3f}  ({calls} warm calls each of {' '.join(cmd)}, interleaved)")


if __name__ == "__main__":
    main()
