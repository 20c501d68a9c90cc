"""runsbx.run against the real binary: output, exit codes, stdin, env,
files in and out, truncation, binary output, the deadline, egress."""

from __future__ import annotations

import http.server
import json
import os
import pathlib
import socket
import tempfile
import threading
import unittest
from typing import List, Optional

from _support import RunsbxTestCase

import runsbx


class RunTest(RunsbxTestCase):
    def test_output_and_exit_code(self) -> None:
        r = runsbx.run(
            ["sh", "-c", "echo out; echo err >&2; exit 3"], rootfs=self.rootfs
        )
        self.assertIsInstance(r, runsbx.CallResult)
        self.assertEqual(r.schema, runsbx.SCHEMA)
        self.assertEqual((r.status, r.exit_code, r.signal), ("exited", 3, None))
        self.assertFalse(r.ok)
        self.assertFalse(r.timed_out)
        self.assertEqual(r.stdout.data, b"out\n")
        self.assertEqual(r.stdout_text, "out\n")
        self.assertEqual(r.stderr_text, "err\n")
        self.assertEqual((r.stdout.bytes, r.stdout.truncated, r.stdout.omitted_bytes), (4, False, 0))
        self.assertEqual(r.command, ("sh", "-c", "echo out; echo err >&2; exit 3"))
        self.assertTrue(r.id and r.id.startswith("call-"), r.id)
        self.assertIsNone(r.image)
        self.assertIsNone(r.error)
        self.assertGreater(r.duration_ms, 0)
        # The isolation layers in force, and the limits.
        self.assertIsNotNone(r.attestation)
        assert r.attestation is not None
        layers = {layer.layer: layer for layer in r.attestation}
        self.assertTrue(layers["seccomp_allowlist"].in_force, layers)
        self.assertEqual(r.limits.timeout_ms, 30000)
        self.assertIn("schema", r.raw)
        # A non-zero exit is a result; with check it raises.
        with self.assertRaises(runsbx.NonZeroExit) as cm:
            r.check()
        self.assertIs(cm.exception.result, r)
        self.assertEqual(cm.exception.exit_code, 3)

    def test_success_and_a_string_command(self) -> None:
        r = runsbx.run("echo $((6*7)) | cat", rootfs=self.rootfs, check=True)
        self.assertTrue(r.ok)
        self.assertEqual(r.stdout_text, "42\n")
        self.assertEqual(r.command, ("sh", "-c", "echo $((6*7)) | cat"))
        self.assertIs(r.check(), r)

    def test_check_raises_non_zero_exit(self) -> None:
        with self.assertRaises(runsbx.NonZeroExit) as cm:
            runsbx.run(["false"], rootfs=self.rootfs, check=True)
        self.assertEqual(cm.exception.exit_code, 1)
        self.assertIsInstance(cm.exception, runsbx.RunsbxError)
        assert cm.exception.result is not None
        self.assertEqual(cm.exception.result.status, "exited")

    def test_stdin(self) -> None:
        r = runsbx.run(["cat"], rootfs=self.rootfs, stdin=b"bytes in\x00\xff")
        self.assertEqual(r.stdout.data, b"bytes in\x00\xff")
        r = runsbx.run(["cat"], rootfs=self.rootfs, stdin="text é\n")
        self.assertEqual(r.stdout_text, "text é\n")
        # Without stdin the command reads an empty one, at once.
        r = runsbx.run(["sh", "-c", "cat; echo end"], rootfs=self.rootfs, timeout=10)
        self.assertEqual(r.stdout_text, "end\n")
        # More than a pipe holds.
        big = b"x" * (1 << 20)
        r = runsbx.run(["wc", "-c"], rootfs=self.rootfs, stdin=big)
        self.assertEqual(r.stdout_text.strip(), str(len(big)))

    def test_env(self) -> None:
        r = runsbx.run(
            ["sh", "-c", 'printf "%s|%s|%s" "$GREETING" "$EMPTY" "$HOME"'],
            rootfs=self.rootfs,
            env={"GREETING": "hello world=1 'q'", "EMPTY": ""},
        )
        self.assertEqual(r.stdout_text, "hello world=1 'q'||/tmp")
        # This process's environment never reaches the sandbox.
        os.environ["RUNSBX_PY_TEST_SECRET"] = "leak"
        try:
            r = runsbx.run(["env"], rootfs=self.rootfs)
        finally:
            del os.environ["RUNSBX_PY_TEST_SECRET"]
        self.assertNotIn("RUNSBX_PY_TEST_SECRET", r.stdout_text)

    def test_files_in_and_outputs_out(self) -> None:
        with tempfile.TemporaryDirectory() as host:
            tree = pathlib.Path(host, "tree")
            (tree / "sub").mkdir(parents=True)
            (tree / "sub" / "deep.txt").write_text("from a host directory\n")
            r = runsbx.run(
                [
                    "sh",
                    "-c",
                    "cat data/in.txt tree/sub/deep.txt; printf '\\000\\001\\377' > data/in.bin.out; "
                    "mkdir -p res/a; echo made > res/a/one.txt; echo two > res/two.txt; "
                    "cat script.sh > copy.txt; ln -s /etc/passwd link.txt",
                ],
                rootfs=self.rootfs,
                files={
                    "data/in.txt": "text input\n",
                    "/workspace/script.sh": b"#!/bin/sh\n",
                    "tree": tree,
                },
                outputs=["res/**/*.txt", "copy.txt", "link.txt", "data/*.out", "absent.txt"],
            )
        self.assertTrue(r.ok, r)
        self.assertEqual(r.stdout_text, "text input\nfrom a host directory\n")
        by_path = {o.path: o for o in r.outputs}
        self.assertEqual(r.output("res/a/one.txt"), b"made\n")
        self.assertEqual(r.output("res/two.txt"), b"two\n")
        self.assertEqual(r.output("copy.txt"), b"#!/bin/sh\n")
        self.assertEqual(r.output("data/in.bin.out"), b"\x00\x01\xff")
        self.assertEqual(by_path["res/a/one.txt"].bytes, 5)
        self.assertTrue(by_path["copy.txt"].ok)
        # A symbolic link is refused, a glob without a match says so.
        self.assertFalse(by_path["link.txt"].ok)
        self.assertIn("symbolic link", by_path["link.txt"].error or "")
        self.assertIsNone(by_path["link.txt"].data)
        self.assertIn("no such file", by_path["absent.txt"].error or "")
        with self.assertRaises(KeyError):
            r.output("link.txt")
        with self.assertRaises(KeyError):
            r.output("never-asked.txt")

    def test_private_directory_is_removed(self) -> None:
        before = set(os.listdir(tempfile.gettempdir()))
        runsbx.run(
            ["sh", "-c", "cat in > out"],
            rootfs=self.rootfs,
            files={"in": "x"},
            outputs="out",
        )
        after = set(os.listdir(tempfile.gettempdir()))
        self.assertFalse(
            [d for d in after - before if d.startswith("runsbx-call-")], after - before
        )

    def test_truncation(self) -> None:
        r = runsbx.run(
            ["sh", "-c", "printf 0123456789abcdef; printf ABCDEFGHIJ >&2"],
            rootfs=self.rootfs,
            max_output=8,
        )
        self.assertTrue(r.truncated)
        self.assertTrue(r.stdout.truncated)
        self.assertEqual(r.stdout.data, b"0123cdef")
        self.assertEqual((r.stdout.head, r.stdout.tail), (b"0123", b"cdef"))
        self.assertEqual((r.stdout.bytes, r.stdout.omitted_bytes), (16, 8))
        self.assertEqual(r.stderr.data, b"ABCDGHIJ")
        # A size as runsbx writes it.
        r = runsbx.run(["sh", "-c", "yes | head -c 5000"], rootfs=self.rootfs, max_output="2K")
        self.assertEqual((len(r.stdout.data), r.stdout.bytes), (2048, 5000))

    def test_binary_output(self) -> None:
        r = runsbx.run(["printf", "\\377\\376\\000bin"], rootfs=self.rootfs)
        self.assertEqual(r.stdout.encoding, "base64")
        self.assertEqual(r.stdout.data, b"\xff\xfe\x00bin")
        self.assertEqual(r.stdout.text, "\ufffd\ufffd\x00bin")

    def test_timeout_is_a_result(self) -> None:
        r = runsbx.run(["sh", "-c", "echo started; sleep 30"], rootfs=self.rootfs, timeout=1.5)
        self.assertTrue(r.timed_out)
        self.assertEqual((r.status, r.exit_code), ("timed_out", None))
        self.assertEqual(r.limits.timeout_ms, 1500)
        self.assertEqual(r.stdout_text, "started\n")
        self.assertLess(r.duration_ms, 20000)
        self.assertFalse(r.ok)

    def test_timeout_raises_with_check(self) -> None:
        with self.assertRaises(runsbx.TimedOut) as cm:
            runsbx.run(["sleep", "30"], rootfs=self.rootfs, timeout=0.5, check=True)
        result = cm.exception.result
        assert result is not None
        self.assertTrue(result.timed_out)
        self.assertIn("timed out", str(cm.exception))

    def test_limits(self) -> None:
        r = runsbx.run(["true"], rootfs=self.rootfs, memory="64M", pids=16)
        self.assertTrue(r.ok, r)
        if os.geteuid() == 0:
            self.assertEqual((r.limits.memory_bytes, r.limits.pids), (64 << 20, 16))
        r = runsbx.run(["true"], rootfs=self.rootfs, memory=32 << 20)
        if os.geteuid() == 0:
            self.assertEqual(r.limits.memory_bytes, 32 << 20)

    def test_egress_report(self) -> None:
        r = runsbx.run(
            ["sh", "-c", 'echo "$HTTPS_PROXY"'],
            rootfs=self.rootfs,
            allow_hosts="example.org",
        )
        self.assertTrue(r.ok, r)
        assert r.egress is not None
        self.assertEqual(r.egress.allow, ("example.org",))
        self.assertEqual(r.egress.proxy, "127.0.0.1:3128")
        self.assertIn("127.0.0.1:3128", r.stdout_text)
        self.assertEqual(r.egress.denied, ())
        self.assertEqual(r.egress.stats.connections, 0)
        # Without allow_hosts there is no egress at all.
        self.assertIsNone(runsbx.run(["true"], rootfs=self.rootfs).egress)

    def test_seccomp_denials(self) -> None:
        # mount(2) from Python on the default image: refused with EPERM,
        # and reported by syscall and process.
        self.need_python_image()
        script = "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); " \
            "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())"
        r = runsbx.run(["python3", "-c", script])
        self.assertTrue(r.ok, r)
        self.assertEqual(r.stdout_text, "-1 1\n")
        assert r.seccomp is not None
        self.assertIn(("mount", "python3"), [(d.syscall, d.process) for d in r.seccomp.denied], r.seccomp)
        self.assertEqual(r.seccomp.dropped, 0)
        clean = runsbx.run(["true"], rootfs=self.rootfs)
        assert clean.seccomp is not None
        self.assertEqual(clean.seccomp.denied, ())
        assert clean.hints is not None
        self.assertEqual(clean.hints.connects, ())

    def test_refused_connect_hint(self) -> None:
        # The host's loopback is not the sandbox's: a connect there is
        # refused, and the result says why.
        with socket.socket() as api:
            api.bind(("127.0.0.1", 0))
            api.listen()
            port = api.getsockname()[1]
            r = runsbx.run(["sh", "-c", f"nc 127.0.0.1 {port} </dev/null; echo $?"], rootfs=self.rootfs)
        self.assertEqual(r.stdout_text, "1\n", r)
        assert r.hints is not None
        self.assertEqual(
            [(h.kind, h.destination, h.protocol, h.errno, h.process, h.count) for h in r.hints.connects],
            [("loopback_is_own", f"127.0.0.1:{port}", "tcp", "ECONNREFUSED", "nc", 1)],
            r.hints,
        )
        self.assertIn("host's loopback", r.hints.connects[0].message)


class ProxyOptionsTest(RunsbxTestCase):
    """proxy_resolve and proxy_allow_addresses, against a server on the
    host's loopback that the sandbox knows by a made-up name."""

    def setUp(self) -> None:
        super().setUp()
        self.server = Server()
        self.addCleanup(self.server.stop)
        self.port = self.server.port
        self.host = f"index.test:{self.port}"

    def fetch(self, **kwargs: object) -> runsbx.CallResult:
        return runsbx.run(
            ["wget", "-q", "-O", "-", f"http://{self.host}/simple/"],
            rootfs=self.rootfs,
            allow_hosts=[self.host],
            timeout=20,
            **kwargs,  # type: ignore[arg-type]
        )

    def test_a_named_loopback_service(self) -> None:
        r = self.fetch(
            proxy_resolve={"index.test": "127.0.0.1"},
            proxy_allow_addresses=[f"127.0.0.1:{self.port}"],
        )
        self.assertTrue(r.ok, r)
        self.assertEqual(r.stdout_text, "the index\n")
        self.assertEqual(self.server.paths, ["/simple/"])
        assert r.egress is not None
        self.assertEqual(r.egress.denied, ())
        self.assertEqual(r.egress.stats.connections, 1)

    def test_resolved_but_not_allowed_is_refused(self) -> None:
        # The name resolves to loopback, which the proxy refuses unless
        # the address and port are named.
        for allowed in ([], [f"127.0.0.1:{self.port + 1 if self.port < 65535 else 1}"]):
            with self.subTest(allowed=allowed):
                r = self.fetch(proxy_resolve={"index.test": "127.0.0.1"}, proxy_allow_addresses=allowed)
                self.assertFalse(r.ok)
                assert r.egress is not None
                self.assertEqual([d.code for d in r.egress.denied], ["address_class"], r.egress.denied)
                self.assertEqual(r.egress.denied[0].host, "index.test")
        self.assertEqual(self.server.paths, [])

    def test_request_rules(self) -> None:
        # `allow`: only the requests a rule names reach the server; the
        # others are 403 with an event naming the rule and the path.
        loopback = {
            "proxy_resolve": {"index.test": "127.0.0.1"},
            "proxy_allow_addresses": [f"127.0.0.1:{self.port}"],
        }
        base = f"http://{self.host}"
        r = runsbx.run(
            ["sh", "-c", f"wget -q -O - {base}/simple/; wget -q -O - {base}/private/ || echo refused"],
            rootfs=self.rootfs,
            allow=[f"GET {self.host}/simple/**"],
            timeout=20,
            **loopback,  # type: ignore[arg-type]
        )
        self.assertTrue(r.ok, r)
        self.assertEqual(r.stdout_text, "the index\nrefused\n")
        self.assertEqual(self.server.paths, ["/simple/"])
        assert r.egress is not None
        self.assertEqual([(d.code, d.path) for d in r.egress.denied], [("request_not_allowed", "/private/")])
        self.assertEqual(r.egress.denied[0].reason["rules"], ["GET /simple/**"])

    def loopback(self) -> dict:
        return {
            "proxy_resolve": {"index.test": "127.0.0.1"},
            "proxy_allow_addresses": [f"127.0.0.1:{self.port}"],
        }

    def test_a_secret_is_used_but_never_seen(self) -> None:
        # The server gets the value; the sandbox, its output and the
        # result only the sentinel.
        value = "s3cr3t-" + os.urandom(8).hex()
        script = (
            'echo "inside: $RUNSBX_SECRET_TOKEN"; '
            f'wget -q -O - --header "Authorization: Bearer $RUNSBX_SECRET_TOKEN" http://{self.host}/simple/'
        )
        r = runsbx.run(
            ["sh", "-c", script],
            rootfs=self.rootfs,
            allow_hosts=[self.host],
            timeout=20,
            secrets={"TOKEN": runsbx.Secret(host=self.host, value=value)},
            **self.loopback(),  # type: ignore[arg-type]
        )
        self.assertTrue(r.ok, r)
        self.assertEqual(self.server.auth, [f"Bearer {value}"])
        self.assertRegex(r.stdout_text, r"^inside: runsbx-secret-TOKEN-[0-9a-f]+\nthe index\n$")
        self.assertNotIn(value, json.dumps(r.raw))
        self.assertNotIn(value, r.stderr_text)

    def test_learn_mode(self) -> None:
        r = self.fetch(learn=True, **self.loopback())
        self.assertTrue(r.ok, r)
        assert r.learned is not None
        self.assertEqual(
            [(q.method, q.host, q.port, q.path, q.tls, q.count) for q in r.learned.requests],
            [("GET", "index.test", self.port, "/simple/", False, 1)],
        )
        self.assertEqual(r.learned.dropped, 0)
        self.assertIsNone(self.fetch(**self.loopback()).learned)

    def test_option_checks(self) -> None:
        with self.assertRaises(TypeError):
            self.fetch(secrets={"T": runsbx.Secret(host=self.host, value="v", env="V")})
        with self.assertRaises(TypeError):
            self.fetch(secrets={"T": "v"})
        with self.assertRaises(TypeError) as te:
            self.fetch(secrets={"T": runsbx.Secret(host=self.host, value=b"hidden-bytes")})  # type: ignore[arg-type]
        self.assertNotIn("hidden-bytes", str(te.exception))
        self.assertNotIn("hidden", repr(runsbx.Secret(host=self.host, value="hidden")))
        with self.assertRaises(runsbx.BadInput):
            self.fetch(secrets={"A,B": runsbx.Secret(host=self.host, value="v")})
        with self.assertRaises(runsbx.BadInput) as cm:
            # runsbx's own check: a secret's host must be allowed.
            self.fetch(secrets={"T": runsbx.Secret(host="elsewhere.test", value="v")})
        self.assertIn("--secret", str(cm.exception))
        with self.assertRaises(runsbx.BadInput):
            self.fetch(proxy_resolve={"a=b": "127.0.0.1"})
        with self.assertRaises(TypeError):
            self.fetch(proxy_resolve=[("index.test", "127.0.0.1")])
        with self.assertRaises(runsbx.BadInput) as cm:
            self.fetch(proxy_resolve={"index.test": "not-an-ip"})
        self.assertIn("--proxy-resolve", str(cm.exception))
        with self.assertRaises(runsbx.BadInput) as cm:
            self.fetch(proxy_allow_addresses=["127.0.0.1"])
        self.assertIn("--proxy-allow-address", str(cm.exception))


class Server:
    """A stdlib HTTP server on 127.0.0.1 that answers every GET with
    "the index" and records the paths."""

    def __init__(self) -> None:
        paths: List[str] = []
        auth: List[Optional[str]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                paths.append(self.path)
                auth.append(self.headers.get("Authorization"))
                body = b"the index\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.paths = paths
        self.auth = auth
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class PythonImageTest(RunsbxTestCase):
    """On the default image, when `runsbx image ls` lists `python`."""

    def setUp(self) -> None:
        super().setUp()
        self.need_python_image()

    def test_python_on_the_default_image(self) -> None:
        r = runsbx.run(["python3", "-c", "print(6*7)"], check=True)
        self.assertEqual(r.image, "python")
        self.assertEqual(r.stdout_text, "42\n")

    def test_python_files_stdin_and_outputs(self) -> None:
        code = (
            "import json, sys, os\n"
            "data = json.load(open('in/data.json'))\n"
            "line = sys.stdin.readline().strip()\n"
            "open('out.bin', 'wb').write(bytes(range(256)))\n"
            "print(json.dumps({'sum': sum(data), 'line': line, 'cwd': os.getcwd(),\n"
            "                  'uid': os.getuid(), 'key': os.environ['KEY']}))\n"
        )
        r = runsbx.run(
            ["python3", "main.py"],
            files={"main.py": code, "in/data.json": "[1, 2, 3]"},
            stdin="a line\n",
            env={"KEY": "value"},
            outputs=["*.bin"],
            check=True,
        )
        import json

        got = json.loads(r.stdout_text)
        self.assertEqual(
            got, {"sum": 6, "line": "a line", "cwd": "/workspace", "uid": 0, "key": "value"}
        )
        self.assertEqual(r.output("out.bin"), bytes(range(256)))

    def test_python_exception_is_a_result(self) -> None:
        r = runsbx.run(["python3", "-c", "raise SystemExit('bad: ' + 'x')"])
        self.assertEqual(r.exit_code, 1)
        self.assertIn("bad: x", r.stderr_text)


if __name__ == "__main__":
    unittest.main()
