"""runsbx.Pool against the real binary: a pooled call returns what
runsbx.run returns, each sandbox runs one call, calls from several threads,
options that do not fit run cold, errors are run's, and close leaves
nothing running."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List

from _support import RunsbxTestCase

import runsbx

PROBE = (
    "id; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; ls -A /tmp /workspace; "
    "cat /proc/[0-9]*/comm | grep -c sleep; env | sort; pwd"
)


def shape(r: runsbx.CallResult) -> List[tuple]:
    """The attestation without the host id range (as root each sandbox
    has its own)."""
    assert r.attestation is not None
    return [(l.layer, l.in_force, l.detail if l.layer != "user_namespace" else "") for l in r.attestation]


def processes_with(text: str) -> List[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


class PoolTest(RunsbxTestCase):
    def pool(self, size: int = 2, **options) -> runsbx.Pool:
        pool = runsbx.Pool(size, rootfs=self.rootfs, binary=self.bin, **options)
        self.addCleanup(pool.close)
        return pool

    def test_a_pooled_call_is_a_cold_call(self) -> None:
        cold = runsbx.run(["sh", "-c", PROBE], rootfs=self.rootfs, env={"A": "1"}, binary=self.bin)
        pool = self.pool()
        warm = pool.run(["sh", "-c", PROBE], env={"A": "1"})
        self.assertEqual(pool.warm_calls, 1)
        self.assertEqual(warm.stdout_text, cold.stdout_text)
        self.assertEqual((warm.status, warm.exit_code), ("exited", 0))
        self.assertEqual(shape(warm), shape(cold))
        self.assertEqual(warm.limits, cold.limits)
        self.assertEqual(warm.command, cold.command)
        self.assertNotEqual(warm.id, cold.id)

    def test_each_sandbox_runs_one_call(self) -> None:
        pool = self.pool()
        script = "ls -A /tmp /workspace; cat /proc/[0-9]*/comm | grep -c sleep; touch /tmp/x /workspace/x; (sleep 1000 &)"
        ids = set()
        for _ in range(5):
            r = pool.run(["sh", "-c", script], check=True)
            self.assertEqual(r.stdout_text, "/tmp:\n\n/workspace:\n0\n")
            ids.add(r.id)
        self.assertEqual(len(ids), 5)
        self.assertEqual(pool.warm_calls, 5)

    def test_calls_from_threads(self) -> None:
        pool = self.pool(2)

        def one(i: int) -> runsbx.CallResult:
            return pool.run(["sh", "-c", f"echo {i}; ls -A /tmp; touch /tmp/mine"], check=True)

        with ThreadPoolExecutor(6) as ex:
            results = list(ex.map(one, range(18)))
        self.assertEqual([r.stdout_text for r in results], [f"{i}\n" for i in range(18)])
        self.assertEqual(len({r.id for r in results}), 18)
        self.assertEqual(pool.warm_calls, 18)

    def test_stdin_files_and_outputs(self) -> None:
        pool = self.pool(1)
        r = pool.run(
            ["sh", "-c", "cat; cat in.txt; echo made > out.txt"],
            stdin="from stdin\n",
            files={"in.txt": "a file\n"},
            outputs=["out.txt"],
            check=True,
        )
        self.assertEqual(r.stdout_text, "from stdin\na file\n")
        self.assertEqual([o.path for o in r.outputs], ["out.txt"])
        self.assertEqual(r.outputs[0].data, b"made\n")
        self.assertEqual(pool.warm_calls, 1)

    def test_options_that_do_not_fit_run_cold(self) -> None:
        pool = self.pool(1)
        r = pool.run(["true"], pids=64)
        self.assertTrue(r.ok)
        self.assertEqual((pool.warm_calls, pool.cold_calls), (0, 1))
        r = pool.run(["echo", "warm"], timeout=5)
        self.assertEqual(r.stdout_text, "warm\n")
        self.assertEqual(r.limits.timeout_ms, 5000)
        self.assertEqual((pool.warm_calls, pool.cold_calls), (1, 1))

    def test_deadline(self) -> None:
        pool = self.pool(1)
        started = time.monotonic()
        r = pool.run(["sleep", "30"], timeout=1)
        self.assertTrue(r.timed_out, r)
        self.assertLess(time.monotonic() - started, 20)
        self.assertEqual(pool.warm_calls, 1)

    def test_errors_are_runs(self) -> None:
        pool = self.pool(1)
        with self.assertRaises(runsbx.CommandNotFound):
            pool.run(["no-such-command"])
        with self.assertRaises(runsbx.NonZeroExit):
            pool.run(["false"], check=True)
        with self.assertRaises(TypeError):
            pool.run(["true"], binary=self.bin)  # type: ignore[call-arg]
        # A secret's value would have to reach `runsbx serve`'s environment.
        with self.assertRaises(runsbx.BadInput):
            pool.run(["true"], secrets={"T": runsbx.Secret(host="example.org", value="v")})
        self.assertEqual(pool.run(["echo", "still"]).stdout_text, "still\n")

    def test_close_leaves_nothing_running(self) -> None:
        pool = runsbx.Pool(2, rootfs=self.rootfs, binary=self.bin)
        pool.run(["true"], check=True)
        pid = pool.pid
        pool.close()
        self.assertFalse(os.path.exists(f"/proc/{pid}") and processes_with(self.rootfs))
        deadline = time.monotonic() + 20
        while processes_with(self.rootfs) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(processes_with(self.rootfs), [])
        with self.assertRaises(runsbx.ProtocolError):
            pool.run(["true"])

    def test_settings_a_call_refuses_end_the_pool(self) -> None:
        pool = runsbx.Pool(2, image="no-such-image", binary=self.bin)
        self.addCleanup(pool.close)
        # `runsbx serve` ends before its first sandbox. A call that reached
        # it ran cold; one after that finds it ended: each is refused as
        # runsbx.run refuses it.
        for _ in range(3):
            with self.assertRaises(runsbx.ImageNotFound) as caught:
                pool.run(["true"])
            self.assertIn("no-such-image", str(caught.exception))
            self.assertEqual(caught.exception.returncode, 125)
        self.assertFalse(os.path.exists(f"/proc/{pool.pid}"), "runsbx serve is still there")
        self.assertEqual(processes_with("no-such-image"), [])

    def test_bad_size(self) -> None:
        for size in (0, 65, True, "2"):
            with self.assertRaises(ValueError):
                runsbx.Pool(size, rootfs=self.rootfs, binary=self.bin)  # type: ignore[arg-type]

    def test_replies_reach_their_callers_in_any_order(self) -> None:
        # The slow call is asked first, so its thread reads serve's output
        # while the quick calls' replies come: each is handed to its own
        # caller, and the slow one still gets its own.
        pool = self.pool(3)
        with ThreadPoolExecutor(3) as ex:
            # Long enough that the quick calls end first on a loaded machine.
            slow = ex.submit(pool.run, ["sh", "-c", "sleep 3; echo slow"], check=True)
            time.sleep(0.2)
            quick = [ex.submit(pool.run, ["echo", str(i)], check=True) for i in range(2)]
            self.assertEqual([q.result(timeout=30).stdout_text for q in quick], ["0\n", "1\n"])
            self.assertFalse(slow.done())
            self.assertEqual(slow.result(timeout=30).stdout_text, "slow\n")

    def test_a_pool_killed_under_a_waiting_call(self) -> None:
        pool = self.pool(1)
        pool.run(["true"], check=True)
        with ThreadPoolExecutor(1) as ex:
            waiting = ex.submit(pool.run, ["sleep", "30"])
            time.sleep(0.5)
            os.kill(pool.pid, 9)
            started = time.monotonic()
            with self.assertRaises(runsbx.ProtocolError) as caught:
                waiting.result(timeout=30)
        self.assertLess(time.monotonic() - started, 10)
        self.assertIn("the pool ended before the call's result came", str(caught.exception))
        with self.assertRaises(runsbx.ProtocolError):
            pool.run(["true"])
