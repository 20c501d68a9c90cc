"""runsbx.stream against the real binary: chunks while the command runs,
in order, the cap, the result at the end, stopping early."""

from __future__ import annotations

import time
import unittest

from _support import RunsbxTestCase

import runsbx


class StreamTest(RunsbxTestCase):
    def test_first_chunk_arrives_while_the_command_runs(self) -> None:
        # The command waits on its stdin until the test has read its first
        # chunk: that chunk cannot have come from a finished call.
        with runsbx.stream(
            ["sh", "-c", "echo one; read go; echo two >&2; sleep 0.2; echo three"],
            rootfs=self.rootfs,
            stdin=runsbx.PIPE,
        ) as s:
            first = next(s)
            self.assertEqual((first.stream, first.data, first.text), ("stdout", b"one\n", "one\n"))
            self.assertTrue(s.running)
            with self.assertRaises(RuntimeError):
                s.result  # noqa: B018 - the call is still running
            s.write_stdin("go\n")
            s.close_stdin()
            rest = list(s)
        self.assertEqual([(c.stream, c.text) for c in rest], [("stderr", "two\n"), ("stdout", "three\n")])
        times = [first.t_ms] + [c.t_ms for c in rest]
        self.assertEqual(times, sorted(times))
        self.assertGreater(rest[-1].t_ms - rest[0].t_ms, 150)
        r = s.result
        self.assertTrue(r.ok, r)
        self.assertEqual(r.stdout_text, "one\nthree\n")
        self.assertEqual(r.stderr_text, "two\n")
        self.assertFalse(s.running)
        self.assertEqual(s.capped, {})

    def test_chunks_come_as_they_are_written(self) -> None:
        start = time.monotonic()
        arrivals = []
        s = runsbx.stream(
            "for i in 1 2 3; do echo $i; sleep 0.3; done; exit 4", rootfs=self.rootfs
        )
        for chunk in s:
            arrivals.append((chunk.text, time.monotonic() - start))
        self.assertEqual([t for t, _ in arrivals], ["1\n", "2\n", "3\n"])
        # Each came about 0.3 s after the one before, not all at the end.
        self.assertGreater(arrivals[2][1] - arrivals[0][1], 0.4, arrivals)
        self.assertEqual(s.result.exit_code, 4)
        self.assertEqual(s.wait(), s.result)

    def test_stdin_bytes_and_binary_chunks(self) -> None:
        s = runsbx.stream(["cat"], rootfs=self.rootfs, stdin=b"\xff\x00binary")
        data = b"".join(c.data for c in s if c.stream == "stdout")
        self.assertEqual(data, b"\xff\x00binary")
        self.assertEqual(s.result.stdout.data, b"\xff\x00binary")

    def test_capped_stream(self) -> None:
        with runsbx.stream(
            ["sh", "-c", "printf 0123456789abcdef"], rootfs=self.rootfs, max_output=8
        ) as s:
            chunks = list(s)
        self.assertEqual(b"".join(c.data for c in chunks), b"0123")
        self.assertEqual(list(s.capped), ["stdout"])
        capped = s.capped["stdout"]
        self.assertIsInstance(capped, runsbx.Capped)
        self.assertEqual((capped.stream, capped.kept_bytes), ("stdout", 4))
        r = s.result
        self.assertTrue(r.stdout.truncated)
        self.assertEqual(r.stdout.data, b"0123cdef")
        self.assertEqual(r.stdout.tail, b"cdef")

    def test_leaving_early_stops_the_call(self) -> None:
        start = time.monotonic()
        with runsbx.stream(
            ["sh", "-c", "echo ready; sleep 60"], rootfs=self.rootfs, timeout=60
        ) as s:
            first = next(s)
            self.assertEqual(first.text, "ready\n")
            pid = s.pid
        self.assertFalse(s.running)
        self.assertLess(time.monotonic() - start, 30)
        # runsbx printed its result as it stopped.
        r = s.result
        self.assertEqual(r.status, "interrupted", r)
        self.assertEqual(r.signal, "SIGTERM")
        self.assertFalse(r.ok)
        with self.assertRaises(ProcessLookupError):
            import os

            os.kill(pid, 0)

    def test_errors_are_raised_by_the_iteration(self) -> None:
        s = runsbx.stream(["no-such-command"], rootfs=self.rootfs)
        with self.assertRaises(runsbx.CommandNotFound) as cm:
            list(s)
        self.assertEqual(cm.exception.kind, "not_found")
        # ...and again by result.
        with self.assertRaises(runsbx.CommandNotFound):
            s.result  # noqa: B018
        with self.assertRaises(runsbx.TimedOut):
            with runsbx.stream(
                ["sleep", "10"], rootfs=self.rootfs, timeout=0.5, check=True
            ) as s:
                list(s)
        with self.assertRaises(runsbx.BadInput):
            list(runsbx.stream(["true"], rootfs=self.rootfs, env={"1BAD": "x"}))

    def test_stdin_pipe_is_for_streams_only(self) -> None:
        with self.assertRaises(TypeError):
            runsbx.run(["cat"], rootfs=self.rootfs, stdin=runsbx.PIPE)  # type: ignore[arg-type]
        with runsbx.stream(["true"], rootfs=self.rootfs) as s:
            with self.assertRaises(RuntimeError):
                s.write_stdin(b"x")
            self.assertTrue(s.wait().ok)


if __name__ == "__main__":
    unittest.main()
