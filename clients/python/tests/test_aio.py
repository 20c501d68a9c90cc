"""runsbx.aio against the real binary: run, stream, errors, cancellation."""

from __future__ import annotations

import asyncio
import os
import time
import unittest
from typing import Any, Coroutine, TypeVar

from _support import RunsbxTestCase

import runsbx
import runsbx.aio

T = TypeVar("T")


def arun(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class AioRunTest(RunsbxTestCase):
    def test_run(self) -> None:
        r = arun(
            runsbx.aio.run(
                ["sh", "-c", "cat; echo \"$X\" >&2; exit 5"],
                rootfs=self.rootfs,
                stdin=b"in\n",
                env={"X": "y"},
            )
        )
        self.assertEqual((r.status, r.exit_code), ("exited", 5))
        self.assertEqual((r.stdout_text, r.stderr_text), ("in\n", "y\n"))

    def test_run_files_outputs_and_truncation(self) -> None:
        r = arun(
            runsbx.aio.run(
                "cat a.txt > b.txt; printf 0123456789abcdef",
                rootfs=self.rootfs,
                files={"a.txt": b"abc"},
                outputs=["b.txt"],
                max_output=8,
            )
        )
        self.assertEqual(r.output("b.txt"), b"abc")
        self.assertEqual(r.stdout.data, b"0123cdef")

    def test_calls_run_at_once(self) -> None:
        async def main() -> list:  # type: ignore[type-arg]
            return await asyncio.gather(
                *(
                    runsbx.aio.run(["sh", "-c", f"sleep 0.5; echo {i}"], rootfs=self.rootfs)
                    for i in range(4)
                )
            )

        start = time.monotonic()
        results = arun(main())
        self.assertEqual([r.stdout_text for r in results], ["0\n", "1\n", "2\n", "3\n"])
        # Concurrently: well under four times half a second each.
        self.assertLess(time.monotonic() - start, 20)

    def test_errors(self) -> None:
        with self.assertRaises(runsbx.CommandNotFound):
            arun(runsbx.aio.run(["no-such-command"], rootfs=self.rootfs))
        with self.assertRaises(runsbx.BadInput):
            arun(runsbx.aio.run(["true"], rootfs=self.rootfs, env={"1BAD": "x"}))
        with self.assertRaises(runsbx.TimedOut):
            arun(runsbx.aio.run(["sleep", "10"], rootfs=self.rootfs, timeout=0.5, check=True))
        r = arun(runsbx.aio.run(["sleep", "10"], rootfs=self.rootfs, timeout=0.5))
        self.assertTrue(r.timed_out)
        with self.assertRaises(runsbx.BinaryNotFound):
            arun(runsbx.aio.run(["true"], rootfs=self.rootfs, binary="/nonexistent/runsbx"))

    def test_cancelling_stops_the_call(self) -> None:
        async def main() -> float:
            task = asyncio.ensure_future(
                runsbx.aio.run(["sleep", "60"], rootfs=self.rootfs, timeout=60)
            )
            await asyncio.sleep(1.0)
            start = time.monotonic()
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            return time.monotonic() - start

        self.assertLess(arun(main()), 30)


class AioStreamTest(RunsbxTestCase):
    def test_stream_order_and_first_chunk_before_the_end(self) -> None:
        async def main() -> None:
            async with runsbx.aio.stream(
                ["sh", "-c", "echo one; read go; echo two >&2; sleep 0.2; echo three"],
                rootfs=self.rootfs,
                stdin=runsbx.PIPE,
            ) as s:
                chunks = []
                async for chunk in s:
                    chunks.append(chunk)
                    if len(chunks) == 1:
                        self.assertEqual((chunk.stream, chunk.text), ("stdout", "one\n"))
                        self.assertTrue(s.running)
                        await s.write_stdin(b"go\n")
                        s.close_stdin()
            self.assertEqual(
                [(c.stream, c.text) for c in chunks],
                [("stdout", "one\n"), ("stderr", "two\n"), ("stdout", "three\n")],
            )
            self.assertEqual([c.t_ms for c in chunks], sorted(c.t_ms for c in chunks))
            self.assertTrue(s.result.ok)
            self.assertEqual(s.result.stdout_text, "one\nthree\n")

        arun(main())

    def test_stream_capped_and_stdin_bytes(self) -> None:
        async def main() -> None:
            s = runsbx.aio.stream(
                ["sh", "-c", "cat; printf 0123456789abcdef >&2"],
                rootfs=self.rootfs,
                stdin=b"in",
                max_output=8,
            )
            chunks = [c async for c in s]
            self.assertEqual(b"".join(c.data for c in chunks if c.stream == "stdout"), b"in")
            self.assertEqual(b"".join(c.data for c in chunks if c.stream == "stderr"), b"0123")
            self.assertEqual(s.capped["stderr"].kept_bytes, 4)
            self.assertNotIn("stdout", s.capped)
            self.assertEqual(s.result.stderr.data, b"0123cdef")
            self.assertEqual(await s.wait(), s.result)

        arun(main())

    def test_stream_leaving_early_stops_the_call(self) -> None:
        async def main() -> None:
            async with runsbx.aio.stream(
                ["sh", "-c", "echo ready; sleep 60"], rootfs=self.rootfs, timeout=60
            ) as s:
                async for chunk in s:
                    self.assertEqual(chunk.text, "ready\n")
                    break
            self.assertFalse(s.running)
            self.assertEqual(s.result.status, "interrupted")

        start = time.monotonic()
        arun(main())
        self.assertLess(time.monotonic() - start, 30)

    def test_stream_errors(self) -> None:
        async def main() -> None:
            s = runsbx.aio.stream(["/etc/passwd"], rootfs=self.rootfs)
            with self.assertRaises(runsbx.NotExecutable):
                async for _ in s:
                    pass
            with self.assertRaises(runsbx.NotExecutable):
                s.result  # noqa: B018
            with self.assertRaises(runsbx.ImageNotFound):
                async with runsbx.aio.stream(
                    ["true"], image="no-such-image-for-py-tests"
                ) as s2:
                    await s2.wait()

        arun(main())


if __name__ == "__main__":
    unittest.main()
