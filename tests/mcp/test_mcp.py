"""`runsbx mcp` through the real MCP client SDK (PyPI ``mcp``) over stdio.

Each test starts ``runsbx mcp`` as an MCP client does, with
``mcp.client.stdio.stdio_client``, and observes what the client sees: the
tool list, structured results, tool errors, and that the sessions the server
made are gone once the client has disconnected. hack/mcp-test.sh makes a
virtualenv with the SDK and runs this as root and as an unprivileged user::

    RUNSBX_BIN=target/x86_64-unknown-linux-gnu/release/runsbx python3 -m pytest -v tests/mcp

A test that cannot run prints ``SKIP <reason>``; with CI=true it fails.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Dict, List, Optional, Set, Tuple

import anyio
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

CI = os.environ.get("CI") == "true"

#: Every tool the server offers without --allow-session-tools.
TOOLS = {"run_command", "run_python", "write_file", "read_file", "list_files"}
SESSION_TOOLS = {"create_session", "close_session"}

#: Passed on to the server: where rootless state and the data live.
PASSED_ENV = ("XDG_RUNTIME_DIR", "RUNSBX_DATA_DIR", "TMPDIR", "RUNSBX_LOG")

#: The longest a tool call may take before the test gives up on it.
CALL_TIMEOUT = 120.0


def skip(test: unittest.TestCase, reason: str) -> None:
    """Skips with ``SKIP <reason>`` on stdout; under CI=true, fails."""
    print(f"SKIP {reason}", flush=True)
    if CI:
        test.fail(f"SKIP under CI=true: {reason}")
    raise unittest.SkipTest(reason)


def binary() -> Optional[str]:
    env = os.environ.get("RUNSBX_BIN")
    if env:
        return os.path.abspath(env) if os.sep in env else shutil.which(env)
    return shutil.which("runsbx")


def server_env() -> Dict[str, str]:
    """What the server gets beyond the SDK's defaults (HOME, PATH, USER…)."""
    return {k: os.environ[k] for k in PASSED_ENV if k in os.environ}


def runsbx(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    bin_path = binary()
    assert bin_path is not None
    env = dict(os.environ)
    out = subprocess.run(
        [bin_path, *args], capture_output=True, text=True, timeout=120, env=env
    )
    if check and out.returncode != 0:
        raise AssertionError(
            f"runsbx {' '.join(args)} exited {out.returncode}: {out.stderr.strip()}"
        )
    return out


def processes(argv: List[str]) -> List[int]:
    """The pids on this host running exactly ``argv`` (sandboxes' too)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:-1] == [a.encode() for a in argv]:
                    found.append(int(pid))
        except OSError:
            pass
    return found


def pool_pids(session: str, kinds: Tuple[bytes, ...] = (b"serve", b"pool-worker")) -> List[int]:
    """The pids of a session's pool: its ``runsbx serve`` and the worker
    whose sandbox waits for the next call (``kinds``: which of them)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if f"--session={session}".encode() in argv and any(k in argv for k in kinds):
            found.append(int(pid))
    return found


def session_names() -> Set[str]:
    out = runsbx("session", "ls", "--json")
    return {s["name"] for s in json.loads(out.stdout)}


class McpTest(unittest.TestCase):
    """Starts ``runsbx mcp`` per connection; every test leaves no session
    that was not there before it."""

    bin: str

    def setUp(self) -> None:
        found = binary()
        if found is None or not os.access(found, os.X_OK):
            skip(self, "no runsbx binary: set RUNSBX_BIN=/path/to/runsbx")
        assert found is not None
        self.bin = found
        ls = runsbx("session", "ls", "--json", check=False)
        if ls.returncode != 0:
            skip(self, f"runsbx has no sessions here: {ls.stderr.strip()}")
        images = runsbx("image", "ls", "--json", check=False)
        if images.returncode != 0 or "python" not in {
            i.get("name") for i in json.loads(images.stdout or "[]")
        }:
            skip(self, "no `python` image: run `sudo runsbx image build python`")
        self.sessions_before = session_names()
        self.errlog = tempfile.TemporaryFile(mode="w+")

    def tearDown(self) -> None:
        self.errlog.close()

    def server_log(self) -> str:
        self.errlog.seek(0)
        return self.errlog.read()

    def assert_pool_ends(self, session: str, why: str) -> None:
        """Waits (at most 20 s) until ``session`` has no pool process."""
        deadline = time.monotonic() + 20
        while pool_pids(session) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(pool_pids(session), [], why)

    def assert_no_new_sessions(self) -> None:
        left = session_names() - self.sessions_before
        self.assertEqual(left, set(), f"sessions left behind; server log:\n{self.server_log()}")

    @asynccontextmanager
    async def connect(self, *args: str) -> AsyncIterator[ClientSession]:
        params = StdioServerParameters(
            command=self.bin, args=["mcp", *args], env=server_env()
        )
        async with stdio_client(params, errlog=self.errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session

    async def call(
        self, session: ClientSession, tool: str, args: Dict[str, Any], error: bool = False
    ) -> Dict[str, Any]:
        """Calls ``tool``; asserts isError is ``error``; the structured content."""
        result = await session.call_tool(tool, args, read_timeout_seconds=CALL_TIMEOUT)
        content = result.structured_content
        self.assertIsNotNone(content, f"{tool}: no structured content: {result.content}")
        assert content is not None
        self.assertEqual(
            bool(result.is_error),
            error,
            f"{tool} {args}: isError={result.is_error}: {json.dumps(content)[:2000]}\n"
            f"server log:\n{self.server_log()}",
        )
        return content

    def run_async(self, fn, *args) -> Any:
        return anyio.run(fn, *args)

    # --- the tools -------------------------------------------------------

    def test_lists_the_tools_with_their_schemas(self) -> None:
        async def go() -> None:
            async with self.connect() as s:
                tools = (await s.list_tools()).tools
                self.assertEqual({t.name for t in tools}, TOOLS)
                for t in tools:
                    self.assertTrue(t.description, t.name)
                    self.assertEqual(t.input_schema.get("type"), "object", t.name)
                    out = t.output_schema or {}
                    for field in ("exit_code", "stdout", "stderr", "timed_out", "status",
                                  "egress", "attestation", "error"):
                        self.assertIn(field, out.get("properties", {}), f"{t.name}: {field}")
            async with self.connect("--allow-session-tools") as s:
                names = {t.name for t in (await s.list_tools()).tools}
                self.assertEqual(names, TOOLS | SESSION_TOOLS)

        self.run_async(go)
        self.assert_no_new_sessions()

    def test_run_python(self) -> None:
        async def go() -> None:
            async with self.connect() as s:
                r = await self.call(s, "run_python", {"code": "print(6*7)"})
                self.assertEqual(r["status"], "exited")
                self.assertEqual(r["exit_code"], 0)
                self.assertEqual(r["stdout"]["data"], "42\n")
                self.assertFalse(r["stdout"]["truncated"])
                self.assertFalse(r["timed_out"])
                self.assertIsNone(r["error"])
                layers = {a["layer"]: a["in_force"] for a in r["attestation"]}
                self.assertTrue(layers.get("namespaces"), layers)

        self.run_async(go)
        self.assert_no_new_sessions()

    def test_a_non_zero_exit_is_a_result(self) -> None:
        async def go() -> None:
            async with self.connect() as s:
                r = await self.call(
                    s, "run_command", {"command": "echo out; echo err >&2; exit 3"}
                )
                self.assertEqual(r["status"], "exited")
                self.assertEqual(r["exit_code"], 3)
                self.assertEqual(r["stdout"]["data"], "out\n")
                self.assertEqual(r["stderr"]["data"], "err\n")
                self.assertIsNone(r["error"])

        self.run_async(go)
        self.assert_no_new_sessions()

    def test_output_is_capped_and_says_so(self) -> None:
        async def go() -> None:
            async with self.connect("--max-output", "4K") as s:
                r = await self.call(
                    s, "run_python", {"code": "print('x' * 100000)"}
                )
                out = r["stdout"]
                self.assertTrue(out["truncated"], out)
                self.assertEqual(out["bytes"], 100001)
                self.assertLessEqual(len(out["data"]), 4096)
                self.assertEqual(out["omitted_bytes"], 100001 - len(out["data"]))

        self.run_async(go)
        self.assert_no_new_sessions()

    def test_files_persist_within_a_connection(self) -> None:
        async def go() -> None:
            async with self.connect() as s:
                w = await self.call(
                    s, "write_file", {"path": "notes/a.txt", "content": "hello\n"}
                )
                self.assertEqual((w["path"], w["bytes"]), ("notes/a.txt", 6))
                r = await self.call(s, "read_file", {"path": "/workspace/notes/a.txt"})
                self.assertEqual((r["content"], r["encoding"]), ("hello\n", "utf-8"))
                # Written again: replaced.
                await self.call(s, "write_file", {"path": "notes/a.txt", "content": "bye"})
                r = await self.call(s, "read_file", {"path": "notes/a.txt"})
                self.assertEqual(r["content"], "bye")
                # Binary content goes both ways as base64.
                blob = bytes(range(256))
                await self.call(
                    s,
                    "write_file",
                    {"path": "blob.bin", "content": base64.b64encode(blob).decode(),
                     "encoding": "base64"},
                )
                r = await self.call(s, "read_file", {"path": "blob.bin"})
                self.assertEqual(r["encoding"], "base64")
                self.assertEqual(base64.b64decode(r["content"]), blob)
                # What one call wrote, the next sees.
                await self.call(
                    s, "run_command", {"command": "mkdir -p out && echo made > out/c.txt"}
                )
                listed = await self.call(s, "list_files", {"depth": 2})
                entries = {e["path"]: (e["type"], e["size"]) for e in listed["entries"]}
                self.assertEqual(listed["path"], "/workspace")
                self.assertFalse(listed["truncated"])
                self.assertEqual(entries["notes"][0], "dir")
                self.assertEqual(entries.get("notes/a.txt"), ("file", 3))
                self.assertEqual(entries.get("blob.bin"), ("file", 256))
                self.assertEqual(entries.get("out/c.txt"), ("file", 5))
                r = await self.call(s, "run_python", {"code": "print(open('notes/a.txt').read())"})
                self.assertEqual(r["stdout"]["data"], "bye\n")

        self.run_async(go)
        self.assert_no_new_sessions()

    def test_file_errors(self) -> None:
        async def go() -> None:
            async with self.connect() as s:
                r = await self.call(s, "read_file", {"path": "missing.txt"}, error=True)
                self.assertEqual(r["error"]["kind"], "not_found", r["error"])
                for path in ("/etc/passwd", "../x"):
                    r = await self.call(s, "read_file", {"path": path}, error=True)
                    self.assertEqual(r["error"]["kind"], "bad_input", r["error"])
                    r = await self.call(
                        s, "write_file", {"path": path, "content": "x"}, error=True
                    )
                    self.assertEqual(r["error"]["kind"], "bad_input", r["error"])
                # A link left in the workspace is not followed out of it.
                await self.call(s, "run_command", {"command": "ln -s /etc/hostname link"})
                r = await self.call(s, "read_file", {"path": "link"}, error=True)
                self.assertIn("symbolic link", r["error"]["message"])
                r = await self.call(s, "list_files", {"path": "nowhere"}, error=True)
                self.assertEqual(r["error"]["kind"], "not_found", r["error"])

        self.run_async(go)
        self.assert_no_new_sessions()

    # --- the operator decides; a client only tightens ---------------------

    def test_a_client_can_only_tighten(self) -> None:
        async def go() -> None:
            async with self.connect("--timeout", "3s") as s:
                r = await self.call(
                    s, "run_command", {"command": "true", "timeout_seconds": 60}, error=True
                )
                self.assertEqual(r["status"], "error")
                self.assertEqual(r["error"]["kind"], "bad_input", r["error"])
                self.assertIn("timeout", r["error"]["message"].lower())
                # Shorter is allowed, and the deadline holds.
                r = await self.call(
                    s, "run_command", {"command": "sleep 30", "timeout_seconds": 1}
                )
                self.assertTrue(r["timed_out"], r)
                self.assertEqual(r["status"], "timed_out")
                self.assertIsNone(r["exit_code"])
                self.assertEqual(r["limits"]["timeout_ms"], 1000)
                self.assertLess(r["duration_ms"], 10_000)
                # Without one, the operator's deadline holds.
                r = await self.call(s, "run_command", {"command": "sleep 30"})
                self.assertTrue(r["timed_out"], r)
                self.assertEqual(r["limits"]["timeout_ms"], 3000)
                self.assertLess(r["duration_ms"], 15_000)

        self.run_async(go)
        self.assert_no_new_sessions()

    def test_egress_denial_is_structured(self) -> None:
        # The proxy refuses a host outside the allowlist by name, before
        # any DNS: no network is needed.
        code = (
            "import urllib.request, urllib.error\n"
            "try:\n"
            "    urllib.request.urlopen('http://example.com/', timeout=10)\n"
            "    print('reached')\n"
            "except urllib.error.HTTPError as e:\n"
            "    print('refused', e.code)\n"
        )

        async def go() -> None:
            async with self.connect("--allow-host", "example.invalid") as s:
                r = await self.call(s, "run_python", {"code": code})
                self.assertEqual(r["stdout"]["data"], "refused 403\n", r)
                egress = r["egress"]
                self.assertIsNotNone(egress, r)
                self.assertIn("example.invalid", egress["allow"])
                denied = egress["denied"]
                self.assertEqual(len(denied), 1, denied)
                self.assertEqual((denied[0]["host"], denied[0]["port"]), ("example.com", 80))
                self.assertTrue(denied[0]["reason"], denied[0])

        self.run_async(go)
        self.assert_no_new_sessions()

    # --- sessions --------------------------------------------------------

    def test_disconnect_removes_the_session(self) -> None:
        async def go() -> str:
            async with self.connect() as s:
                r = await self.call(s, "run_command", {"command": "true"})
                self.assertIn(r["session"], session_names())
                return r["session"]

        name = self.run_async(go)
        self.assertNotIn(name, session_names())
        self.assert_no_new_sessions()

    def test_calls_run_in_the_sessions_pool(self) -> None:
        async def go() -> str:
            async with self.connect() as s:
                first = await self.call(s, "run_command", {"command": "echo 1 > /tmp/x; echo one"})
                name = first["session"]
                # The session's pool: `runsbx serve` and the worker whose
                # sandbox waits for the next call.
                self.assertTrue(pool_pids(name), self.server_log())
                second = await self.call(s, "run_command", {"command": "ls -A /tmp; echo two"})
                self.assertEqual(second["stdout"]["data"], "two\n", second)
                self.assertEqual(second["exit_code"], 0)
                return name

        name = self.run_async(go)
        self.assert_pool_ends(name, "the pool outlived its connection")
        self.assert_no_new_sessions()

    def test_a_sessions_pool_that_dies_leaves_its_calls_cold(self) -> None:
        async def go() -> None:
            async with self.connect() as s:
                first = await self.call(s, "run_command", {"command": "echo kept > f; echo one"})
                name = first["session"]
                serve = pool_pids(name, (b"serve",))
                self.assertEqual(len(serve), 1, self.server_log())
                os.kill(serve[0], signal.SIGKILL)
                # Its worker lets the session go once its stdin ends.
                self.assert_pool_ends(name, "the dead pool's worker lives on")
                for n in ("two", "three"):
                    r = await self.call(s, "run_command", {"command": f"cat f; echo {n}"})
                    self.assertEqual(r["stdout"]["data"], f"kept\n{n}\n", r)
                    self.assertEqual(r["exit_code"], 0)
                # Cold: no pool was started again.
                self.assertEqual(pool_pids(name), [], self.server_log())

        self.run_async(go)
        self.assert_no_new_sessions()

    def test_disconnect_during_a_call_removes_the_session(self) -> None:
        async def go() -> float:
            async with self.connect() as s:
                async with anyio.create_task_group() as tg:
                    async def long() -> None:
                        await s.call_tool("run_command", {"command": "sleep 60"})

                    tg.start_soon(long)
                    # Until the call holds the session.
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline:
                        ls = json.loads(runsbx("session", "ls", "--json").stdout)
                        if any(x["in_use"] for x in ls if x["name"] not in self.sessions_before):
                            break
                        await anyio.sleep(0.1)
                    else:
                        self.fail(f"the call never held its session:\n{self.server_log()}")
                    tg.cancel_scope.cancel()
                started = time.monotonic()
            return time.monotonic() - started

        took = self.run_async(go)
        self.assert_no_new_sessions()
        self.assertEqual(processes(["sleep", "60"]), [], "the call's sandbox outlived it")
        # Within the SDK's grace after stdin closes (2 s), before it signals.
        self.assertLess(took, 2.0, self.server_log())

    def test_sigterm_during_a_call_removes_the_session(self) -> None:
        # JSON-RPC by hand: the server is ours to signal.
        server = subprocess.Popen(
            [self.bin, "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errlog,
            env={**os.environ},
        )
        assert server.stdin is not None
        try:
            for message in (
                {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "test", "version": "0"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                 "params": {"name": "run_command", "arguments": {"command": "sleep 60"}}},
            ):
                server.stdin.write((json.dumps(message) + "\n").encode())
                server.stdin.flush()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                ls = json.loads(runsbx("session", "ls", "--json").stdout)
                if any(x["in_use"] for x in ls if x["name"] not in self.sessions_before):
                    break
                time.sleep(0.1)
            else:
                self.fail(f"the call never held its session:\n{self.server_log()}")
            server.send_signal(signal.SIGTERM)
            self.assertEqual(server.wait(timeout=30), 0, self.server_log())
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        self.assert_no_new_sessions()
        self.assertEqual(processes(["sleep", "60"]), [], "the call's sandbox outlived it")

    def test_a_named_session_is_served_and_kept(self) -> None:
        name = f"mcp-test-{os.getpid()}"
        runsbx("session", "create", name)
        try:
            async def write() -> None:
                async with self.connect("--session", name) as s:
                    r = await self.call(s, "write_file", {"path": "kept.txt", "content": "k"})
                    self.assertEqual(r["session"], name)

            async def read() -> None:
                async with self.connect("--session", name) as s:
                    r = await self.call(s, "read_file", {"path": "kept.txt"})
                    self.assertEqual(r["content"], "k")

            self.run_async(write)
            self.assertIn(name, session_names())
            self.run_async(read)
        finally:
            runsbx("session", "rm", name, check=False)
        # The operator's session cannot be mixed with the operator's limits.
        out = runsbx("mcp", "--session", name, "--timeout", "5s", check=False)
        self.assertEqual(out.returncode, 2, out.stderr)
        self.assert_no_new_sessions()

    def test_a_bad_operator_setting_ends_the_server_with_its_code(self) -> None:
        # The code `runsbx session create` gives the same setting (README,
        # "Exit codes"): 3 a bad value, 4 nothing of that name.
        cases = [
            (["--memory", "100k"], 3, "--memory: 102400 bytes is below 4194304 (4M)"),
            (["--timeout", "0"], 3, '--timeout "0": is not a duration'),
            (["--allow", "x"], 3, '--allow "x": names no method or path'),
            (["--max-output", "lots"], 3, '--max-output "lots": "lots" is not a size'),
            (["--max-output", "1G"], 3, "--max-output 1G: is more than the 64M"),
            (["--image", "no-such-image"], 4, "image `no-such-image` not found"),
            (["--session", "no-such-session"], 4, 'session "no-such-session" does not exist'),
        ]
        for flags, code, said in cases:
            with self.subTest(flags=flags):
                out = subprocess.run(
                    [self.bin, "mcp", *flags],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                self.assertEqual(out.returncode, code, out.stderr)
                lines = out.stderr.splitlines()
                self.assertEqual(len(lines), 1, out.stderr)
                self.assertTrue(lines[0].startswith("runsbx: error: "), out.stderr)
                self.assertIn(said, lines[0])
                self.assertEqual(out.stdout, "")
        self.assert_no_new_sessions()

    def test_session_tools(self) -> None:
        async def go() -> None:
            async with self.connect("--allow-session-tools") as s:
                own = (await self.call(s, "run_command", {"command": "true"}))["session"]
                made = await self.call(s, "create_session", {})
                other = made["session"]
                self.assertTrue(other.startswith("s-"), made)
                self.assertEqual(made["details"]["name"], other)
                self.assertNotEqual(other, own)
                await self.call(
                    s, "write_file", {"path": "x.txt", "content": "1", "session": other}
                )
                # Sessions are apart: the connection's own has no x.txt.
                r = await self.call(s, "read_file", {"path": "x.txt"}, error=True)
                self.assertEqual(r["error"]["kind"], "not_found")
                r = await self.call(s, "read_file", {"path": "x.txt", "session": other})
                self.assertEqual(r["content"], "1")
                # No session but its own and those it made.
                for foreign in ("someone-elses", own + "x"):
                    r = await self.call(
                        s, "run_command", {"command": "true", "session": foreign}, error=True
                    )
                    self.assertEqual(r["error"]["kind"], "bad_input")
                r = await self.call(s, "close_session", {"name": own}, error=True)
                self.assertEqual(r["error"]["kind"], "bad_input")
                r = await self.call(s, "create_session", {"name": "--image=evil"}, error=True)
                self.assertEqual(r["error"]["kind"], "bad_input")
                closed = await self.call(s, "close_session", {"name": other})
                self.assertTrue(closed["closed"])
                self.assertNotIn(other, session_names())
                r = await self.call(
                    s, "run_command", {"command": "true", "session": other}, error=True
                )
                self.assertEqual(r["error"]["kind"], "bad_input")
                # One left open is removed at disconnect.
                await self.call(s, "create_session", {})

        self.run_async(go)
        self.assert_no_new_sessions()


if __name__ == "__main__":
    unittest.main(verbosity=2)
