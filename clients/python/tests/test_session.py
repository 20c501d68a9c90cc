"""runsbx.Session and runsbx.aio.Session against the real binary: what
persists between calls (files in /workspace, $HOME, the image's writable
layer) and what does not (/tmp, processes), isolation between sessions,
the file operations, serialised calls, and the errors."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import unittest
from typing import List, Set

from _support import RunsbxTestCase

import runsbx
import runsbx.aio


def unique(prefix: str = "py-test") -> str:
    return f"{prefix}-{os.urandom(6).hex()}"


class SessionTestCase(RunsbxTestCase):
    """Needs the `python` image (sessions run on images); checks that each
    test leaves no session behind."""

    def setUp(self) -> None:
        super().setUp()
        self.need_python_image()
        self.before = self.names()

    def tearDown(self) -> None:
        left = self.names() - self.before
        for name in left:  # do not let one failure spill into the next test
            runsbx.Session.attach(name, keep=False).close()
        self.assertEqual(left, set(), "sessions left behind")
        super().tearDown()

    def names(self) -> Set[str]:
        return {s.name for s in runsbx.sessions()}


class SessionTest(SessionTestCase):
    def test_what_persists_and_what_does_not(self) -> None:
        with runsbx.Session() as s:
            self.assertRegex(s.name, r"^s-[0-9a-f]{12}$")
            self.assertEqual(s.info.schema, runsbx.SESSION_SCHEMA)
            self.assertEqual(s.info.image, "python")
            self.assertEqual(s.info.disk.limit_bytes, 1 << 30)
            self.assertIn(s.name, self.names())
            first = s.run(
                "echo kept > /workspace/a.txt; echo gone > /tmp/t.txt; "
                "mkdir -p \"$HOME/.cache\" && echo home > \"$HOME/.cache/h\"; "
                "echo layer > /layer.txt; "
                f"{'echo lib > /usr/local/lib/lib.txt; ' if os.geteuid() == 0 else ''}"
                "sleep 300 >/dev/null 2>&1 & pwd",
                check=True,
            )
            self.assertEqual(first.stdout_text, "/workspace\n")
            assert first.session is not None
            self.assertEqual(first.session.name, s.name)
            second = s.run(
                "cat /workspace/a.txt \"$HOME/.cache/h\" /layer.txt; "
                f"{'cat /usr/local/lib/lib.txt; ' if os.geteuid() == 0 else 'echo lib; '}"
                "if [ -e /tmp/t.txt ]; then echo tmp-kept; else echo tmp-fresh; fi; "
                "echo w > /tmp/w && echo tmp-writable; "
                "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
                check=True,
            )
        lines = second.stdout_text.splitlines()
        # Files in /workspace, under $HOME and in the session's layer over
        # the image are the session's. As root that is anywhere, such as
        # /usr/local/lib where pip install writes; rootless, the image's
        # own directories belong to ids the user cannot map (only / and
        # what the sandbox makes are its own), so pip needs --user there.
        self.assertEqual(lines[:4], ["kept", "home", "layer", "lib"])
        # /tmp is fresh (and writable), and the first call's background
        # process is gone with its sandbox.
        self.assertEqual(lines[4:6], ["tmp-fresh", "tmp-writable"])
        processes = [line for line in lines[6:] if line.strip()]
        self.assertFalse([p for p in processes if "sleep 300" in p], processes)
        self.assertTrue(processes, "the listing ran")

    def test_two_sessions_are_isolated(self) -> None:
        with runsbx.Session() as a, runsbx.Session() as b:
            self.assertNotEqual(a.name, b.name)
            a.write_file("secret.txt", "only a's")
            b.write_file("other.txt", "only b's")
            self.assertEqual(a.list_files(), ["secret.txt"])
            self.assertEqual(b.list_files(), ["other.txt"])
            with self.assertRaises(FileNotFoundError):
                b.read_file("secret.txt")
            # Nothing of a's, by any path b's sandbox has.
            search = ["grep", "-rlsF", "only a's", "/", "--exclude-dir=proc", "--exclude-dir=sys", "--exclude-dir=dev"]
            r = b.run(search)
            # 1: no match; 2: no match, and some directories of the image
            # were unreadable (rootless, they belong to unmapped ids).
            self.assertIn(r.exit_code, (1, 2))
            self.assertEqual(r.stdout_text, "")
            # The same search in a finds its own file: the search works.
            r = a.run(search)
            self.assertEqual(r.stdout_text, "/workspace/secret.txt\n")

    def test_files(self) -> None:
        blob = bytes(range(256)) * 3
        with runsbx.Session() as s:
            s.write_file("text.txt", "é\n")
            s.write_file("dir/sub/blob.bin", blob)
            s.write_file("/workspace/abs.txt", b"absolute")
            s.write_file("name with space", "s")
            s.write_file(".hidden", "h")
            s.write_file("star*.txt", "the star")
            s.write_file("starX.txt", "not the star")
            self.assertEqual(s.read_file("text.txt"), "é\n".encode())
            self.assertEqual(s.read_file("dir/sub/blob.bin"), blob)
            self.assertEqual(s.read_file("/workspace/abs.txt"), b"absolute")
            self.assertEqual(s.read_file("./dir/../abs.txt"), b"absolute")
            self.assertEqual(s.read_file("star*.txt"), b"the star")
            self.assertEqual(s.read_file("starX.txt"), b"not the star")
            self.assertEqual(
                s.list_files(),
                sorted([".hidden", "abs.txt", "dir", "name with space", "star*.txt", "starX.txt", "text.txt"]),
            )
            self.assertEqual(s.list_files("dir"), ["sub"])
            self.assertEqual(s.list_files("/workspace/dir/sub"), ["blob.bin"])
            # Written files are the session's: a command sees them.
            r = s.run(["sha256sum", "dir/sub/blob.bin"], check=True)
            self.assertEqual(r.stdout_text.split()[0], hashlib.sha256(blob).hexdigest())
            # Replacing a file.
            s.write_file("text.txt", "second")
            self.assertEqual(s.read_file("text.txt"), b"second")
            # What a command wrote, read back.
            s.run(["sh", "-c", "printf 'from a call' > made.txt; ln -s /etc/passwd link"])
            self.assertEqual(s.read_file("made.txt"), b"from a call")
            # The errors.
            with self.assertRaises(FileNotFoundError):
                s.read_file("absent.txt")
            with self.assertRaises(IsADirectoryError):
                s.read_file("dir")
            with self.assertRaises(runsbx.Refused) as cm:
                s.read_file("link")
            self.assertIn("symbolic link", str(cm.exception))
            with self.assertRaises(runsbx.BadInput):
                s.read_file("/etc/passwd")
            with self.assertRaises(runsbx.BadInput):
                s.write_file("../escape.txt", "x")
            with self.assertRaises(FileNotFoundError):
                s.list_files("absent")
            with self.assertRaises(NotADirectoryError):
                s.list_files("abs.txt")
            with self.assertRaises(TypeError):
                s.write_file("x", 5)  # type: ignore[arg-type]

    def test_run_python_and_stream(self) -> None:
        with runsbx.Session() as s:
            r = s.run_python("import sys\nopen('v.txt', 'w').write(str(sys.version_info[0]))\nprint('ok')")
            self.assertEqual(r.stdout_text, "ok\n")
            r = s.run_python("print(open('v.txt').read())", check=True)
            self.assertEqual(r.stdout_text, "3\n")
            r = s.run_python("raise SystemExit(3)")
            self.assertEqual(r.exit_code, 3)
            with s.stream(["sh", "-c", "cat v.txt; echo; echo err >&2"]) as st:
                chunks = list(st)
            self.assertEqual("".join(c.text for c in chunks if c.stream == "stdout"), "3\n")
            self.assertEqual("".join(c.text for c in chunks if c.stream == "stderr"), "err\n")
            assert st.result.session is not None
            self.assertEqual(st.result.session.name, s.name)
            # Module-level run and stream take session= too.
            r = runsbx.run(["cat", "v.txt"], session=s.name, timeout=None)
            self.assertEqual(r.stdout_text, "3")
            self.assertEqual(list(runsbx.stream(["cat", "v.txt"], session=s.name, timeout=None))[0].text, "3")

    def test_calls_into_one_session_run_one_at_a_time(self) -> None:
        spans: List[List[float]] = []
        with runsbx.Session() as s:

            def call() -> None:
                r = s.run_python(
                    "import time\nstart = time.time()\ntime.sleep(1)\nprint(start, time.time())", check=True
                )
                spans.append([float(x) for x in r.stdout_text.split()])

            threads = [threading.Thread(target=call) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        self.assertEqual(len(spans), 2)
        (s1, e1), (s2, e2) = sorted(spans)
        self.assertGreaterEqual(s2, e1, f"the calls overlapped: {spans}")

    def test_limits_are_defaults_a_call_may_only_tighten(self) -> None:
        with runsbx.Session(timeout=5, memory="256M", allow_hosts=["example.org"]) as s:
            self.assertEqual(s.info.timeout_ms, 5000)
            self.assertEqual(s.info.allow_hosts, ("example.org",))
            # The session's deadline ends a call that names none.
            r = s.run(["sleep", "30"])
            self.assertTrue(r.timed_out)
            self.assertLess(r.duration_ms, 15000)
            self.assertEqual(r.limits.timeout_ms, 5000)
            r = s.run(["sleep", "30"], timeout=1)
            self.assertTrue(r.timed_out)
            self.assertEqual(r.limits.timeout_ms, 1000)
            for kwargs in ({"timeout": 60}, {"allow_hosts": ["other.example"]}, {"image": "no-such-image"}):
                with self.subTest(kwargs=kwargs):
                    with self.assertRaises(runsbx.CallError) as cm:
                        s.run(["true"], **kwargs)  # type: ignore[arg-type]
                    self.assertEqual(cm.exception.returncode, 125)

    def test_disk(self) -> None:
        with runsbx.Session(disk="64M") as s:
            disk = s.info.disk
            self.assertEqual(disk.limit_bytes, 64 << 20)
            r = s.run("dd if=/dev/zero of=big bs=1M count=100 2>&1; echo rc=$?")
            assert r.session is not None
            self.assertEqual(r.session.disk.limit_bytes, 64 << 20)
            if disk.enforced:
                self.assertIn("No space left on device", r.stdout_text)
                self.assertNotIn("rc=0", r.stdout_text)
            else:
                # Only rootless runsbx cannot enforce it; it says why.
                self.assertNotEqual(os.geteuid(), 0, disk)
                self.assertTrue(disk.reason, disk)

    def test_attach_keep_and_close(self) -> None:
        name = unique()
        s = runsbx.Session(name, keep=True)
        self.assertEqual(s.name, name)
        s.write_file("kept.txt", "still here")
        s.close()
        self.assertTrue(s.closed)
        with self.assertRaises(RuntimeError):
            s.run(["true"])
        self.assertIn(name, self.names())
        again = runsbx.Session.attach(name)
        self.assertEqual(again.read_file("kept.txt"), b"still here")
        again.close()  # attached: kept by default
        self.assertIn(name, self.names())
        runsbx.Session.attach(name, keep=False).close()
        self.assertNotIn(name, self.names())
        with self.assertRaises(runsbx.SessionNotFound):
            runsbx.Session.attach(name)

    def test_errors(self) -> None:
        # A call into a session that does not exist.
        with self.assertRaises(runsbx.SessionNotFound) as cm:
            runsbx.run(["true"], session="no-such-session-for-py-tests")
        e = cm.exception
        self.assertIsInstance(e, runsbx.BadInput)
        self.assertIsInstance(e, runsbx.NotFound)
        self.assertEqual((e.kind, e.returncode), ("bad_input", 125))
        self.assertIn("no-such-session-for-py-tests", str(e))
        # Removing one that does not exist (removed behind this handle's back).
        s = runsbx.Session()
        runsbx.Session.attach(s.name, keep=False).close()
        with self.assertRaises(runsbx.SessionNotFound) as cm2:
            s.close()
        self.assertEqual(cm2.exception.returncode, 4)
        # A name taken, a bad name, a missing image.
        name = unique()
        with runsbx.Session(name):
            with self.assertRaises(runsbx.SessionExists) as cm3:
                runsbx.Session(name)
            self.assertIsInstance(cm3.exception, runsbx.Conflict)
            self.assertEqual(cm3.exception.returncode, 5)
        for bad in ("-starts-with-dash", "has/slash", "x" * 65, ""):
            with self.subTest(name=bad):
                with self.assertRaises(runsbx.BadInput):
                    runsbx.Session(bad)
        with self.assertRaises(runsbx.ImageNotFound):
            runsbx.Session(image="no-such-image-for-py-tests")
        with runsbx.Session() as s2:
            with self.assertRaises(TypeError):
                s2.run(["true"], session="x")  # type: ignore[call-arg]

    def test_in_use_is_a_conflict(self) -> None:
        s = runsbx.Session()
        with s.stream(["sh", "-c", "echo running; sleep 60"]) as st:
            self.assertEqual(next(st).text, "running\n")
            with self.assertRaises(runsbx.SessionInUse) as cm:
                s.close()
            self.assertIsInstance(cm.exception, runsbx.Conflict)
            self.assertEqual(cm.exception.returncode, 5)
            self.assertFalse(s.closed)
            self.assertTrue([i for i in runsbx.sessions() if i.name == s.name][0].in_use)
        # The call is over: now it goes.
        s.close()
        self.assertNotIn(s.name, self.names())


class AioSessionTest(SessionTestCase):
    def test_session(self) -> None:
        async def main() -> None:
            session = runsbx.aio.Session()
            with self.assertRaises(RuntimeError):
                session.name  # noqa: B018 - not created yet
            async with session as s:
                self.assertRegex(s.name, r"^s-[0-9a-f]{12}$")
                self.assertIn(s.name, {i.name for i in await runsbx.aio.sessions()})
                await s.write_file("in.txt", "from aio")
                r = await s.run(["sh", "-c", "cat in.txt > out.txt; touch /tmp/x; echo done"])
                self.assertEqual(r.stdout_text, "done\n")
                self.assertEqual(await s.read_file("out.txt"), b"from aio")
                self.assertEqual(await s.list_files(), ["in.txt", "out.txt"])
                r = await s.run_python("import os; print(sorted(os.listdir()), os.path.exists('/tmp/x'))")
                self.assertEqual(r.stdout_text, "['in.txt', 'out.txt'] False\n")
                async with s.stream(["cat", "out.txt"]) as st:
                    self.assertEqual([c.text async for c in st], ["from aio"])
                with self.assertRaises(FileNotFoundError):
                    await s.read_file("absent")
                attached = await runsbx.aio.Session.attach(s.name)
                self.assertEqual(await attached.read_file("in.txt"), b"from aio")
                await attached.close()
            self.assertTrue(session.closed)
            self.assertNotIn(session.name, {i.name for i in await runsbx.aio.sessions()})
            with self.assertRaises(runsbx.SessionNotFound):
                await runsbx.aio.Session.attach(session.name)
            with self.assertRaises(runsbx.SessionNotFound):
                await runsbx.aio.run(["true"], session=session.name)

        asyncio.run(main())

    def test_calls_wait_for_each_other(self) -> None:
        async def main() -> List[List[float]]:
            async with runsbx.aio.Session() as s:
                code = "import time\nstart = time.time()\ntime.sleep(1)\nprint(start, time.time())"
                results = await asyncio.gather(*(s.run_python(code, check=True) for _ in range(2)))
            return [[float(x) for x in r.stdout_text.split()] for r in results]

        (s1, e1), (s2, e2) = sorted(asyncio.run(main()))
        self.assertGreaterEqual(s2, e1)


if __name__ == "__main__":
    unittest.main()
