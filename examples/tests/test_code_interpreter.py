"""examples/code_interpreter.py: code submitted to the API reaches the
package index through runsbx's egress proxy, and cannot reach the API
itself by any spelling of its address.

Everything is real and on this host: the "package index" is a stdlib HTTP
server on a loopback port, known to the sandbox only as ``pypi.test``
(``proxy_resolve``) and let through the proxy's refusal of loopback for
its one address and port (``proxy_allow_addresses``). The API listens on
the same port on 127.0.0.1, ::1 and each of the host's own non-loopback
addresses; from the host, every spelling reaches it (the control). The
code, submitted through the API, tries each spelling directly and through
the proxy (GET and CONNECT); each attempt must end in an observed refusal,
and the API's request log must show none of the probe's requests."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import urllib.error
import urllib.request
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import code_interpreter
import runsbx
from conftest import skip

INDEX_NAME = "pypi.test"
MODULE = 'def hello():\n    return "hello from the index"\n'


class IndexHandler(http.server.BaseHTTPRequestHandler):
    """A package index: a simple-API page for ``greet`` and its file."""

    server: "IndexServer"

    def do_GET(self) -> None:  # noqa: N802
        self.server.log.append(self.requestline)
        if self.path == "/simple/greet/":
            body, kind = b'<a href="/files/greet.py">greet.py</a>\n', "text/html"
        elif self.path == "/files/greet.py":
            body, kind = MODULE.encode(), "text/x-python"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class IndexServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.log: List[str] = []
        super().__init__(("127.0.0.1", 0), IndexHandler)


def host_addresses() -> List[str]:
    """The host's own non-loopback addresses (global scope), from `ip`."""
    try:
        out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        skip(f"cannot list the host's addresses with `ip -j addr show` ({e}): apt-get install iproute2")
    found = []
    for link in json.loads(out.stdout):
        for a in link.get("addr_info", []):
            if a.get("scope") == "global" and a.get("local"):
                found.append(a["local"])
    return found


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def listen_everywhere(interpreter: code_interpreter.Interpreter, addresses: List[str]) -> List[code_interpreter.ApiServer]:
    """The API on one port at each of ``addresses``."""
    for _ in range(50):
        first = code_interpreter.make_server(interpreter, addresses[0], 0)
        port = first.server_address[1]
        servers = [first]
        try:
            for a in addresses[1:]:
                servers.append(code_interpreter.make_server(interpreter, a, port))
        except OSError:
            for s in servers:
                s.server_close()
            continue
        return servers
    raise RuntimeError(f"no port free on all of {addresses}")


@pytest.fixture
def setup(runsbx_bin: str) -> Iterator[Dict[str, Any]]:
    index = IndexServer()
    index_port = index.server_address[1]
    interpreter = code_interpreter.Interpreter(
        index_hosts=[f"{INDEX_NAME}:{index_port}"],
        proxy_resolve={INDEX_NAME: "127.0.0.1"},
        proxy_allow_addresses=[f"127.0.0.1:{index_port}"],
        timeout=120,
    )
    own = host_addresses()
    if not own:
        skip("this host has no non-loopback address to try")
    servers = listen_everywhere(interpreter, ["127.0.0.1", "::1", *own])
    port = servers[0].server_address[1]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in [index, *servers]]
    for t in threads:
        t.start()
    try:
        yield {"port": port, "index": index, "index_port": index_port, "servers": servers, "own": own}
    finally:
        for s in [index, *servers]:
            s.shutdown()
            s.server_close()
        interpreter.close()


def spellings(own: List[str]) -> List[str]:
    """Ways to write the host's address in a URL."""
    return [
        "127.0.0.1", "localhost", "0.0.0.0", "[::1]", "127.1", "2130706433",
        "0x7f000001", "0177.0.0.1", "017700000001", "[::ffff:127.0.0.1]", "[::]",
        "[0:0:0:0:0:0:0:1]",
        *(url_host(a) for a in own),
    ]


def http_get(url: str) -> Tuple[int, bytes]:
    """GET without any proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as r:
        return r.status, r.read()


def request(port: int, method: str, path: str, body: Optional[Dict[str, Any]] = None, wait: float = 120) -> Tuple[int, Dict[str, Any]]:
    """An API request; its status and JSON reply, whatever the status."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method=method,
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=wait) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def post(port: int, code: str, timeout: float = 60, session: Optional[str] = None) -> Dict[str, Any]:
    body: Dict[str, Any] = {"code": code, "timeout": timeout}
    if session is not None:
        body["session"] = session
    status, reply = request(port, "POST", "/run", body, wait=timeout + 60)
    assert status == 200, reply
    return reply


# The code submitted to the API. Each target is tried directly (every
# address the name resolves to in the sandbox) and through the proxy, by
# GET and by CONNECT, with a mark in the path that the API's log would
# show if one got through.
PROBE = r'''
import errno, json, os, re, socket, sys, urllib.parse

proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
PROXY = (proxy.hostname, proxy.port)

def direct(host, port):
    name = host.strip("[]")
    try:
        infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return ["gaierror"]
    outcomes = []
    for family, kind, proto, _, address in infos:
        s = socket.socket(family, kind, proto)
        s.settimeout(5)
        try:
            s.connect(address)
            s.sendall(f"GET /health?probe={MARK} HTTP/1.0\r\n\r\n".encode())
            outcomes.append("CONNECTED " + repr(s.recv(100)))
        except OSError as e:
            outcomes.append(errno.errorcode.get(e.errno, type(e).__name__))
        finally:
            s.close()
    return outcomes

def via_proxy(method, hostport):
    s = socket.create_connection(PROXY, timeout=10)
    if method == "CONNECT":
        req = f"CONNECT {hostport} HTTP/1.1\r\nHost: {hostport}\r\n\r\n"
    else:
        req = f"GET http://{hostport}/health?probe={MARK} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n"
    s.sendall(req.encode())
    data = b""
    try:
        while True:
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if m is None or len(body) >= int(m.group(1)):
                    break
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        pass
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0].decode(errors="replace")
    return {"status": status, "body": body[:300].decode(errors="replace")}

report = {"direct": {}, "get": {}, "connect": {}}
for host, port in TARGETS:
    key = f"{host}:{port}"
    report["direct"][key] = direct(host, port)
    report["get"][key] = via_proxy("GET", key)
    report["connect"][key] = via_proxy("CONNECT", key)
print(json.dumps(report))
'''


def test_index_is_reachable_and_the_api_is_not(setup: Dict[str, Any]) -> None:
    port, index_port = setup["port"], setup["index_port"]
    targets = [(h, port) for h in spellings(setup["own"])]

    # The control: from the host, every spelling reaches the API.
    for host, p in targets:
        status, body = http_get(f"http://{host}:{p}/health")
        assert (status, json.loads(body)) == (200, {"ok": True}), host

    # The index, through the proxy under its made-up name, the way code
    # installs a package: the simple page, then the file, then import.
    install = (
        "import os, re, sys, urllib.request\n"
        f"base = 'http://{INDEX_NAME}:{index_port}'\n"
        "page = urllib.request.urlopen(base + '/simple/greet/', timeout=10).read().decode()\n"
        "href = re.search(r'href=\"([^\"]+)\"', page).group(1)\n"
        "open('greet.py', 'wb').write(urllib.request.urlopen(base + href, timeout=10).read())\n"
        "sys.path.insert(0, os.getcwd())\n"
        "import greet\n"
        "print(greet.hello())\n"
    )
    reply = post(port, install)
    assert (reply["status"], reply["exit_code"]) == ("exited", 0), reply
    assert reply["stdout"] == "hello from the index\n"
    assert setup["index"].log == ["GET /simple/greet/ HTTP/1.1", "GET /files/greet.py HTTP/1.1"]

    # Every spelling of the API, and the index's allowed name on the API's
    # port, from code the API runs.
    mark = "probe-" + os.urandom(8).hex()
    probe_targets = targets + [(INDEX_NAME, port)]
    before = sum(len(s.requests()) for s in setup["servers"])
    reply = post(port, f"MARK = {mark!r}\nTARGETS = {probe_targets!r}\n" + PROBE, timeout=120)
    assert (reply["status"], reply["exit_code"]) == ("exited", 0), reply
    report = json.loads(reply["stdout"])

    refused = {"ECONNREFUSED", "ENETUNREACH", "EHOSTUNREACH", "EADDRNOTAVAIL", "EAFNOSUPPORT", "gaierror"}
    for host, p in probe_targets:
        key = f"{host}:{p}"
        direct = report["direct"][key]
        assert direct and set(direct) <= refused, (key, direct)
        for how in ("get", "connect"):
            answer = report[how][key]
            assert answer["status"].startswith("HTTP/1.1 403"), (how, key, answer)
            assert "blocked by policy" in answer["body"], (how, key, answer)

    # The API saw nothing of it: only the two /run requests since.
    seen = [line for s in setup["servers"] for line in s.requests()]
    assert not [line for line in seen if mark in line], seen
    assert sum(len(s.requests()) for s in setup["servers"]) == before + 1
    # runsbx's report of the refusals came back with the reply.
    codes = {d["code"] for d in reply["egress_denied"]}
    assert {"ip_literal", "not_allowed"} <= codes, codes
    # And the index is reachable only through the proxy.
    direct_index = post(port, f"MARK = {mark!r}\nTARGETS = [('127.0.0.1', {index_port})]\n" + PROBE)
    assert json.loads(direct_index["stdout"])["direct"][f"127.0.0.1:{index_port}"] == ["ECONNREFUSED"]


def test_api_errors(setup: Dict[str, Any]) -> None:
    port = setup["port"]
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for body in (b"not json", b'{"no": "code"}', b'{"code": 1}'):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/run", data=body)
        with pytest.raises(urllib.error.HTTPError) as e:
            opener.open(req, timeout=30)
        assert e.value.code == 400
    reply = post(port, "import time\nprint('x', flush=True)\ntime.sleep(60)", timeout=1)
    assert (reply["status"], reply["timed_out"], reply["stdout"]) == ("timed_out", True, "x\n")


def test_sessions_keep_files_and_are_the_apis_own(setup: Dict[str, Any]) -> None:
    port, index_port = setup["port"], setup["index_port"]
    status, made = request(port, "POST", "/sessions")
    assert status == 201, made
    name = made["session"]
    assert name in {s.name for s in runsbx.sessions()}
    post(port, "open('notes.txt', 'w').write('cell 1')\nopen('/tmp/scratch', 'w').write('x')", session=name)
    reply = post(port, "import os\nprint(open('notes.txt').read(), os.path.exists('/tmp/scratch'))", session=name)
    assert reply["stdout"] == "cell 1 False\n", reply
    # The session has the interpreter's egress: the index, by its name.
    reply = post(
        port,
        f"import urllib.request\nprint(urllib.request.urlopen('http://{INDEX_NAME}:{index_port}/simple/greet/').status)",
        session=name,
    )
    assert reply["stdout"] == "200\n", reply
    # Sessions the API did not make cannot be named, even existing ones.
    with runsbx.Session() as foreign:
        foreign.write_file("theirs.txt", "not yours")
        for other in (foreign.name, "s-000000000000", "../x"):
            status, reply = request(port, "POST", "/run", {"code": "print(open('theirs.txt').read())", "session": other})
            assert status == 404, (other, reply)
    status, reply = request(port, "DELETE", f"/sessions/{name}")
    assert (status, reply) == (200, {"closed": name})
    assert name not in {s.name for s in runsbx.sessions()}
    assert request(port, "DELETE", f"/sessions/{name}")[0] == 404
    assert request(port, "POST", "/run", {"code": "print(1)", "session": name})[0] == 404
