"""The exceptions, provoked through the real binary where runsbx can be
made to produce them; the mapping of every documented error kind; a
missing binary; results of a later schema."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import tempfile
import unittest

import _support
from _support import RunsbxTestCase

import runsbx
from runsbx.errors import error_class
from runsbx.result import parse_result, parse_session


class CallErrorTest(RunsbxTestCase):
    def assert_call_error(self, cm: unittest.case._AssertRaisesContext, kind: str, code: int) -> None:  # type: ignore[type-arg]
        e = cm.exception
        self.assertIsInstance(e, runsbx.CallError)
        self.assertIsInstance(e, runsbx.RunsbxError)
        self.assertEqual(e.kind, kind)
        self.assertEqual(e.returncode, code)
        assert e.result is not None
        self.assertEqual(e.result.status, "error")
        assert e.result.error is not None
        self.assertEqual(e.message, e.result.error.message)
        self.assertEqual(str(e), e.message)

    def test_bad_env_key(self) -> None:
        with self.assertRaises(runsbx.BadInput) as cm:
            runsbx.run(["true"], rootfs=self.rootfs, env={"1BAD": "x"})
        self.assert_call_error(cm, "bad_input", 125)
        self.assertIn("--env", str(cm.exception))
        # A key runsbx would split differently is refused here.
        with self.assertRaises(runsbx.BadInput) as cm2:
            runsbx.run(["true"], rootfs=self.rootfs, env={"A=B": "x"})
        self.assertIsNone(cm2.exception.result)

    def test_bad_options(self) -> None:
        for kwargs, needle in [
            ({"memory": "lots"}, "--memory"),
            ({"outputs": ["/etc/passwd"]}, '--output "/etc/passwd": names no file in /workspace'),
            ({"outputs": ["out/../../x"]}, "without `..`"),
            ({"files": {"x": pathlib.Path("/nonexistent/file.csv")}}, "/nonexistent/file.csv"),
            ({"allow_hosts": ["bad host!"]}, "--allow-host"),
            ({"profile": "no-such-profile"}, "no-such-profile"),
        ]:
            with self.subTest(kwargs=kwargs):
                with self.assertRaises(runsbx.BadInput) as cm:
                    runsbx.run(["true"], rootfs=self.rootfs, **kwargs)  # type: ignore[arg-type]
                self.assert_call_error(cm, "bad_input", 125)
                self.assertIn(needle, str(cm.exception))
                self.assertNotIsInstance(cm.exception, runsbx.NotFound)

    def test_bad_arguments_are_named_as_given(self) -> None:
        # Refused before runsbx runs, with the argument's own name rather
        # than the runsbx option the client would make of it.
        for args, kwargs, said in [
            (["true"], {"timeout": -1}, "timeout -1: give a positive number of seconds"),
            (["true"], {"timeout": 0}, "timeout 0: give a positive"),
            (["true"], {"timeout": float("nan")}, "timeout nan: give a positive"),
            (["true"], {"timeout": 1e12}, "at most a week (604800)"),
            (
                ["true"],
                {"files": {"../escape.txt": "x"}},
                "files key '../escape.txt': a call's files are below /workspace",
            ),
            (["true"], {"files": {"/etc/passwd": "x"}}, "files key '/etc/passwd'"),
            (["true"], {"files": {"/workspace": "x"}}, "files key '/workspace': names /workspace itself"),
            ([], {}, "cmd is empty"),
        ]:
            with self.subTest(args=args, kwargs=kwargs):
                with self.assertRaises(runsbx.BadInput) as cm:
                    runsbx.run(args, rootfs=self.rootfs, **kwargs)  # type: ignore[arg-type]
                self.assertIn(said, str(cm.exception))
                self.assertIsNone(cm.exception.result)
                self.assertNotIn("--", str(cm.exception))
        # A path under /workspace is one, written in any of these ways.
        r = runsbx.run(
            ["cat", "/workspace/in/a.txt", "b.txt", "c.txt"],
            rootfs=self.rootfs,
            files={"/workspace/in/a.txt": "a", "./b.txt": "b", "x/../c.txt": "c"},
        )
        self.assertEqual(r.stdout.data, b"abc")

    def test_options_runsbx_cannot_parse(self) -> None:
        # runsbx's command line parser refuses these (exit 2, no JSON).
        with self.assertRaises(runsbx.BadInput) as cm:
            runsbx.run(["true"], rootfs=self.rootfs, pids=0)
        self.assertEqual(cm.exception.returncode, 2)
        self.assertIsNone(cm.exception.result)
        self.assertIn("--pids", str(cm.exception))
        with self.assertRaises(runsbx.BadInput) as cm:
            runsbx.run(["true"], rootfs=self.rootfs, image="python")
        self.assertIn("--image", str(cm.exception) + cm.exception.stderr)

    def test_rootfs_refusals(self) -> None:
        with self.assertRaises(runsbx.BadInput) as cm:
            runsbx.run(["true"], rootfs="/nonexistent-rootfs")
        self.assert_call_error(cm, "bad_input", 125)
        with self.assertRaises(runsbx.BadInput) as cm:
            runsbx.run(["true"], rootfs="/")
        self.assertIn("root directory", str(cm.exception))

    def test_image_not_found(self) -> None:
        with self.assertRaises(runsbx.ImageNotFound) as cm:
            runsbx.run(["true"], image="no-such-image-for-py-tests")
        self.assert_call_error(cm, "bad_input", 125)
        # Both a bad input (runsbx's kind) and a not found.
        self.assertIsInstance(cm.exception, runsbx.BadInput)
        self.assertIsInstance(cm.exception, runsbx.NotFound)
        self.assertIn("no-such-image-for-py-tests", str(cm.exception))

    def test_command_not_found(self) -> None:
        with self.assertRaises(runsbx.CommandNotFound) as cm:
            runsbx.run(["no-such-command"], rootfs=self.rootfs)
        self.assert_call_error(cm, "not_found", 127)
        self.assertIsInstance(cm.exception, runsbx.NotFound)
        self.assertNotIsInstance(cm.exception, runsbx.BadInput)
        self.assertIn("no-such-command", str(cm.exception))

    def test_not_executable(self) -> None:
        with self.assertRaises(runsbx.NotExecutable) as cm:
            runsbx.run(["/etc/passwd"], rootfs=self.rootfs)
        self.assert_call_error(cm, "not_executable", 126)

    def test_failure(self) -> None:
        # runsbx fails on the host reading an input: the kernel answers
        # EIO to a read of a process's memory at address 0.
        mem = pathlib.Path("/proc/self/mem")
        with self.assertRaises(runsbx.Failure) as cm:
            runsbx.run(["true"], rootfs=self.rootfs, files={"f": mem})
        self.assert_call_error(cm, "failure", 123)
        self.assertIn("--input", str(cm.exception))

    def test_an_input_a_workspace_cannot_hold(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            fifo = os.path.join(d, "fifo")
            os.mkfifo(fifo)
            with self.assertRaises(runsbx.BadInput) as cm:
                runsbx.run(["true"], rootfs=self.rootfs, files={"f": pathlib.Path(fifo)})
        self.assert_call_error(cm, "bad_input", 125)
        self.assertIn("is not a regular file, directory or symlink", str(cm.exception))

    def test_type_errors(self) -> None:
        for kwargs in [
            {"env": {"A": 1}},
            {"files": {"a": 1}},
            {"stdin": 5},
            {"timeout": "30s"},
            {"pids": "4"},
            {"outputs": [1]},
        ]:
            with self.subTest(kwargs=kwargs):
                with self.assertRaises(TypeError):
                    runsbx.run(["true"], rootfs=self.rootfs, **kwargs)  # type: ignore[arg-type]
        with self.assertRaises(TypeError):
            runsbx.run([b"true"], rootfs=self.rootfs)  # type: ignore[list-item]
        with self.assertRaises(runsbx.BadInput):
            runsbx.run(["echo", "nul\0"], rootfs=self.rootfs)


class BinaryTest(unittest.TestCase):
    def setUp(self) -> None:
        self.saved = {k: os.environ.get(k) for k in ("RUNSBX_BIN", "PATH")}

    def tearDown(self) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def test_missing_binary(self) -> None:
        os.environ.pop("RUNSBX_BIN", None)
        os.environ["PATH"] = "/nonexistent-dir"
        with self.assertRaises(runsbx.BinaryNotFound) as cm:
            runsbx.run(["true"])
        message = str(cm.exception)
        self.assertIn("not on PATH", message)
        self.assertIn("RUNSBX_BIN", message)
        self.assertIn("binary=", message)
        self.assertIn("install", message)
        self.assertIsInstance(cm.exception, runsbx.RunsbxError)
        with self.assertRaises(runsbx.BinaryNotFound):
            runsbx.stream(["true"])

    def test_missing_binary_named(self) -> None:
        os.environ["RUNSBX_BIN"] = "/nonexistent/runsbx"
        with self.assertRaises(runsbx.BinaryNotFound) as cm:
            runsbx.run(["true"])
        self.assertIn("$RUNSBX_BIN '/nonexistent/runsbx' does not exist", str(cm.exception))
        with self.assertRaises(runsbx.BinaryNotFound) as cm:
            runsbx.run(["true"], binary="/nonexistent/other")
        self.assertIn("binary= '/nonexistent/other'", str(cm.exception))
        with tempfile.NamedTemporaryFile() as f:
            os.chmod(f.name, stat.S_IRUSR)
            with self.assertRaises(runsbx.BinaryNotFound) as cm:
                runsbx.run(["true"], binary=f.name)
            self.assertIn("not executable", str(cm.exception))

    def test_a_binary_that_is_not_runsbx(self) -> None:
        with self.assertRaises(runsbx.ProtocolError) as cm:
            runsbx.run(["true"], binary="/bin/true")
        self.assertEqual(cm.exception.returncode, 0)
        with self.assertRaises(runsbx.ProtocolError):
            list(runsbx.stream(["x"], binary="/bin/echo"))

    def test_find_binary(self) -> None:
        found = _support.binary()
        if found is None:
            _support.skip(self, "no runsbx binary: set RUNSBX_BIN")
        assert found is not None
        os.environ["RUNSBX_BIN"] = found
        self.assertEqual(runsbx.find_binary(), found)
        self.assertEqual(runsbx.find_binary("/bin/true"), "/bin/true")
        self.assertEqual(runsbx.find_binary("true"), shutil.which("true"))
        self.assertEqual(runsbx.find_binary(pathlib.Path("/bin/true")), "/bin/true")


class ParseTest(unittest.TestCase):
    """The client's side of the schema, without runsbx."""

    def test_every_error_kind_has_its_class(self) -> None:
        cases = {
            ("bad_input", "--env: bad", 125): runsbx.BadInput,
            ("bad_input", "image `x` not found (searched ...)", 125): runsbx.ImageNotFound,
            ("refused", "a hook is refused by profile `default`", 125): runsbx.Refused,
            ("not_found", "command `x`: executable file not found", 127): runsbx.CommandNotFound,
            ("not_executable", "command `/etc` is not ...", 126): runsbx.NotExecutable,
            ("failure", "copy --input", 123): runsbx.Failure,
            ("bad_input", "session `s-1` does not exist (in ...)", 125): runsbx.SessionNotFound,
            ("a_future_kind", "?", 125): runsbx.BadInput,
            ("a_future_kind", "?", 99): runsbx.CallError,
        }
        for (kind, message, code), cls in cases.items():
            with self.subTest(kind=kind, message=message):
                self.assertIs(error_class(kind, message, code), cls)
                self.assertTrue(issubclass(cls, runsbx.CallError))

    def test_a_session_object(self) -> None:
        info = parse_session(
            {
                "schema": "runsbx.session/v1", "name": "s-0123456789ab", "image": "python",
                "created": "2026-11-23T05:00:00Z", "disk": {"limit_bytes": 1 << 30, "enforced": False,
                "reason": "rootless"}, "memory_bytes": None, "pids": 64, "timeout_ms": 30000,
                "allow_hosts": ["pypi.org"], "proxy_resolve": {"a.test": "10.0.0.7"},
                "in_use": True, "a_new_field": 1,
            }
        )
        self.assertEqual((info.name, info.image, info.pids, info.timeout_ms), ("s-0123456789ab", "python", 64, 30000))
        self.assertEqual(info.disk, runsbx.Disk(limit_bytes=1 << 30, enforced=False, reason="rootless"))
        self.assertEqual((info.allow_hosts, info.proxy_allow_addresses), (("pypi.org",), ()))
        self.assertEqual(info.proxy_resolve, {"a.test": "10.0.0.7"})
        self.assertTrue(info.in_use)
        self.assertEqual(info.raw["a_new_field"], 1)
        for bad in ({"schema": "runsbx.session/v2", "name": "x"}, {"schema": "runsbx.session/v1"}, []):
            with self.subTest(bad=bad):
                with self.assertRaises(runsbx.ProtocolError):
                    parse_session(bad)

    def test_unknown_fields_and_a_later_minor_schema(self) -> None:
        obj = {
            "schema": "runsbx.call/v1.1",
            "id": "call-1",
            "status": "exited",
            "exit_code": 0,
            "stdout": {"data": "aGk=", "encoding": "base64", "bytes": 2, "new": 1},
            "limits": {"timeout_ms": 5, "new_limit": True},
            "attestation": [{"layer": "x", "in_force": True, "detail": "d", "more": []}],
            "outputs": [{"path": "p", "error": "no such file in /workspace", "mode": 420}],
            "a_new_field": {"nested": [1, 2]},
        }
        r = parse_result(json.loads(json.dumps(obj)))
        self.assertTrue(r.ok)
        self.assertEqual(r.stdout.data, b"hi")
        self.assertEqual(r.stderr, runsbx.Stream.empty())
        self.assertEqual(r.limits.timeout_ms, 5)
        self.assertEqual(r.raw["a_new_field"], {"nested": [1, 2]})
        self.assertEqual(r.outputs[0].error, "no such file in /workspace")
        # A short result (refused before it ran) parses too.
        short = parse_result(
            {"schema": "runsbx.call/v1", "status": "error",
             "error": {"kind": "bad_input", "message": "m"}}
        )
        self.assertEqual((short.id, short.command, short.outputs), (None, (), ()))
        # Another major version is another schema.
        with self.assertRaises(runsbx.ProtocolError):
            parse_result({"schema": "runsbx.call/v2", "status": "exited"})
        with self.assertRaises(runsbx.ProtocolError):
            parse_result({"schema": "runsbx.call/v1", "exit_code": "0"})


if __name__ == "__main__":
    unittest.main()
