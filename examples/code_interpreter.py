#!/usr/bin/env python3
"""A code-interpreter HTTP API whose sandboxed code can reach a package
index and cannot reach the API itself.

The pattern it replaces: a code-interpreter service listens on
127.0.0.1:8000 and runs submitted code in a subprocess or a container
with the host's network, so that ``pip install`` works. The code then
reaches everything on the host's loopback and network -- the
interpreter's own API (to run code outside any limit, or read other
users' results), databases, cloud metadata -- under one spelling or
another (``localhost``, ``0.0.0.0``, ``[::1]``, ``127.1``, ``2130706433``,
the host's own addresses...), and blocklists of spellings never end.

Here each piece of code runs in a fresh runsbx sandbox whose network holds
only its own loopback: no address of the host exists in it, whatever its
spelling. The one way out is runsbx's egress proxy, which lets through only
the package index's host names (``--allow-host``) and refuses any address
that is loopback, private, link-local or metadata, and any IP literal, in
every spelling, unless named on purpose.

API (JSON)::

    GET    /health                 {"ok": true}
    POST   /run  {"code": "...", "timeout": 10, "session": "s-..." (optional)}
           -> {"status": "exited", "exit_code": 0, "stdout": "...", "stderr": "...",
               "timed_out": false, "duration_ms": 70.1,
               "egress_denied": [{"host": "127.0.0.1", "port": 8000, "code": "ip_literal", ...}]}
    POST   /sessions               -> 201 {"session": "s-..."}: files (and what pip
                                   installs) persist between the runs given it
    DELETE /sessions/NAME          -> {"closed": "s-..."}

Only sessions this API made can be named: a caller cannot run code in
another session of the user the API runs as.

Run it::

    python3 examples/code_interpreter.py            # 127.0.0.1:8000, egress to PyPI
    curl -s localhost:8000/run -d '{"code": "print(6*7)"}'

For a private index: ``--allow-host pypi.internal:8443 --proxy-resolve
pypi.internal=10.0.0.7 --proxy-allow-address 10.0.0.7:8443``. The API has
no authentication: keep it on loopback, or put one in front.

It needs the runsbx client (``pip install ./clients/python``, or
``PYTHONPATH=clients/python/src``), the ``runsbx`` binary and its
``python`` image (``sudo runsbx image build python``).
"""

from __future__ import annotations

import argparse
import http.server
import json
import socket
import socketserver
import sys
import threading
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import runsbx

#: The package index a sandbox may reach by default: PyPI's pages and files.
PYPI = ("pypi.org", "files.pythonhosted.org")
#: The largest request body the API reads.
MAX_BODY = 1 << 20
#: The file a session's code is written to (in its /workspace).
CELL = ".cell.py"


class Interpreter:
    """Runs code for the API: one fresh sandbox per request, with egress to
    the package index only.

    Args:
        index_hosts: The hosts the code may reach (``NAME[:PORT]``).
        proxy_resolve: Names the egress proxy resolves to these addresses
            (a private index).
        proxy_allow_addresses: ``IP:PORT`` destinations exempt from the
            proxy's refusal of private and loopback addresses (a private
            index; nothing else).
        timeout: The longest a request may ask for, and the default.
        memory: Each sandbox's memory limit (at most the operator profile's, 512M by default).
        max_running: Sandboxes at once; more requests get 503.
        max_sessions: Sessions open at once; more get 503.
        image: The runsbx image (default ``python``).
        binary: The runsbx binary.
    """

    def __init__(
        self,
        *,
        index_hosts: Iterable[str] = PYPI,
        proxy_resolve: Optional[Mapping[str, str]] = None,
        proxy_allow_addresses: Iterable[str] = (),
        timeout: float = 30.0,
        memory: str = "512M",
        max_running: int = 4,
        max_sessions: int = 16,
        image: Optional[str] = None,
        binary: Optional[str] = None,
    ) -> None:
        self.index_hosts = list(index_hosts)
        self.proxy_resolve = dict(proxy_resolve or {})
        self.proxy_allow_addresses = list(proxy_allow_addresses)
        self.timeout = timeout
        self.memory = memory
        self.image = image
        self.binary = binary
        self.max_sessions = max_sessions
        self._slots = threading.BoundedSemaphore(max_running)
        self._lock = threading.Lock()
        self._sessions: Dict[str, runsbx.Session] = {}

    def run(
        self, code: str, timeout: Optional[float] = None, session: Optional[str] = None
    ) -> Tuple[int, Dict[str, Any]]:
        """Runs ``code`` with ``python3`` (in ``session`` when given: one
        of :meth:`open_session`'s); returns the HTTP status and the
        response object."""
        limit = self.timeout if timeout is None else min(float(timeout), self.timeout)
        handle: Optional[runsbx.Session] = None
        if session is not None:
            with self._lock:
                handle = self._sessions.get(session)
            if handle is None:
                return 404, {"error": f"no session {session!r} (POST /sessions makes one)"}
        if not self._slots.acquire(blocking=False):
            return 503, {"error": "busy: too many runs at once; retry later"}
        try:
            if handle is None:
                r = runsbx.run(
                    ["python3", "main.py"],
                    files={"main.py": code},
                    timeout=limit,
                    memory=self.memory,
                    allow_hosts=self.index_hosts,
                    proxy_resolve=self.proxy_resolve,
                    proxy_allow_addresses=self.proxy_allow_addresses,
                    image=self.image,
                    max_output="256K",
                    binary=self.binary,
                )
            else:
                # The session holds the image, memory and egress settings.
                r = handle.run(["python3", CELL], files={CELL: code}, timeout=limit, max_output="256K")
        except runsbx.SessionNotFound:
            return 404, {"error": f"session {session!r} is gone"}
        except runsbx.CallError as e:
            return 500, {"error": f"{type(e).__name__}: {e}"}
        finally:
            self._slots.release()
        denied = [
            {"host": d.host, "port": d.port, "code": d.code, "message": d.message}
            for d in (r.egress.denied if r.egress else ())
        ]
        return 200, {
            "status": r.status,
            "exit_code": r.exit_code,
            "stdout": r.stdout_text,
            "stderr": r.stderr_text,
            "timed_out": r.timed_out,
            "duration_ms": r.duration_ms,
            "egress_denied": denied,
        }

    def open_session(self) -> Tuple[int, Dict[str, Any]]:
        """Makes a session with this interpreter's settings."""
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                return 503, {"error": f"{self.max_sessions} sessions are open; close one first"}
        try:
            s = runsbx.Session(
                image=self.image,
                memory=self.memory,
                timeout=self.timeout,
                allow_hosts=self.index_hosts,
                proxy_resolve=self.proxy_resolve,
                proxy_allow_addresses=self.proxy_allow_addresses,
                binary=self.binary,
            )
        except runsbx.CallError as e:
            return 500, {"error": f"{type(e).__name__}: {e}"}
        with self._lock:
            self._sessions[s.name] = s
        return 201, {"session": s.name}

    def close_session(self, name: str) -> Tuple[int, Dict[str, Any]]:
        """Removes one of this interpreter's sessions."""
        with self._lock:
            s = self._sessions.pop(name, None)
        if s is None:
            return 404, {"error": f"no session {name!r}"}
        try:
            s.close()
        except runsbx.SessionInUse:
            with self._lock:
                self._sessions[name] = s
            return 409, {"error": f"session {name!r} is running code; close it once that ends"}
        except runsbx.SessionNotFound:
            pass
        return 200, {"closed": name}

    def close(self) -> None:
        """Removes every session this interpreter made."""
        with self._lock:
            names = list(self._sessions)
        for name in names:
            self.close_session(name)


class Handler(http.server.BaseHTTPRequestHandler):
    """The API's routes."""

    server: ApiServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.seen(self)
        if self.path == "/health":
            self._reply(200, {"ok": True})
        else:
            self._reply(404, {"error": f"no route GET {self.path}"})

    def do_DELETE(self) -> None:  # noqa: N802
        self.server.seen(self)
        prefix = "/sessions/"
        if self.path.startswith(prefix) and "/" not in self.path[len(prefix) :]:
            self._reply(*self.server.interpreter.close_session(self.path[len(prefix) :]))
        else:
            self._reply(404, {"error": f"no route DELETE {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        self.server.seen(self)
        if self.path == "/sessions":
            self._reply(*self.server.interpreter.open_session())
            return
        if self.path != "/run":
            self._reply(404, {"error": f"no route POST {self.path}"})
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._reply(411, {"error": "a Content-Length is required"})
            return
        if not 0 <= length <= MAX_BODY:
            self._reply(413, {"error": f"the body is limited to {MAX_BODY} bytes"})
            return
        try:
            req = json.loads(self.rfile.read(length))
            code = req["code"]
            timeout = req.get("timeout")
            session = req.get("session")
            if (
                not isinstance(code, str)
                or not (timeout is None or isinstance(timeout, (int, float)))
                or not (session is None or isinstance(session, str))
            ):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            self._reply(
                400,
                {"error": 'send {"code": "<python source>", "timeout": <seconds>, "session": "<name>"} '
                          "(timeout and session optional)"},
            )
            return
        self._reply(*self.server.interpreter.run(code, timeout, session))

    def _reply(self, status: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.verbose:
            super().log_message(format, *args)


class ApiServer(http.server.ThreadingHTTPServer):
    """The API on one address. It remembers the request lines it served
    (:meth:`requests`), so that one can check who reached it."""

    daemon_threads = True

    def __init__(self, address: Tuple[str, int], interpreter: Interpreter, *, verbose: bool = False) -> None:
        # The socket's family by the address: IPv6 with a ':'.
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.interpreter = interpreter
        self.verbose = verbose
        self._lock = threading.Lock()
        self._seen: List[Tuple[str, str]] = []
        super().__init__(address, Handler)

    def server_bind(self) -> None:
        # http.server would look the host's name up (getfqdn), which can
        # wait on DNS; the address is name enough.
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])

    def seen(self, handler: Handler) -> None:
        with self._lock:
            if len(self._seen) < 10000:
                self._seen.append((handler.client_address[0], handler.requestline))

    def requests(self) -> List[Tuple[str, str]]:
        """``(client address, request line)`` of every request so far."""
        with self._lock:
            return list(self._seen)


def make_server(
    interpreter: Interpreter, host: str = "127.0.0.1", port: int = 8000, *, verbose: bool = False
) -> ApiServer:
    """The API listening on ``host:port`` (``port=0``: a free one; see
    ``server.server_address``). Serve it with ``serve_forever()``."""
    return ApiServer((host, port), interpreter, verbose=verbose)


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description="A code-interpreter API that runs code in runsbx sandboxes.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--allow-host", action="append", dest="hosts", metavar="NAME[:PORT]",
                   help="a package index host the code may reach (default: pypi.org, files.pythonhosted.org)")
    p.add_argument("--proxy-resolve", action="append", default=[], metavar="NAME=IP")
    p.add_argument("--proxy-allow-address", action="append", default=[], metavar="IP:PORT")
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv[1:])
    resolve = dict(item.split("=", 1) for item in args.proxy_resolve)
    interpreter = Interpreter(
        index_hosts=args.hosts or PYPI,
        proxy_resolve=resolve,
        proxy_allow_addresses=args.proxy_allow_address,
        timeout=args.timeout,
    )
    server = make_server(interpreter, args.host, args.port, verbose=True)
    print(f"code interpreter on http://{args.host}:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        interpreter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
