"""examples/execute_code.py: an agent that holds API keys in its
environment and in ~/.hermes/.env runs the model's code with the tool, and
the code finds neither key: not in its environment, not in any
/proc/*/environ or cmdline, not at the file's path, not anywhere on the
filesystem it can read. The same probe, run the way the unsafe pattern
runs it (a child process of the agent), finds both: the probe works."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, Iterator, Tuple

import pytest

import execute_code

# The model's code. It gets the keys only reversed (its own source, on
# the sandbox's disk and in its command line, must not hold them), and
# looks for them everywhere it can. A canary it writes itself proves the
# filesystem search reads files.
PROBE = r'''
import glob, json, os, stat, sys

secrets = [s[::-1] for s in REVERSED]
needles = [s.encode() for s in secrets]
canary = ("canary-" + REVERSED_CANARY[::-1]).encode()
report = {}

report["env_names"] = sorted(os.environ)
report["env_hits"] = sorted(k for k, v in os.environ.items() if any(s in k + "=" + v for s in secrets))

proc_hits, proc_read = [], 0
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            proc_read += 1
            if any(n in data for n in needles):
                proc_hits.append(f"/proc/{pid}/{name}")
report["proc_read"], report["proc_hits"] = proc_read, proc_hits

paths = {HOST_ENV_FILE, "/root/.hermes/.env", os.path.expanduser("~/.hermes/.env")}
paths.update(glob.glob("/home/*/.hermes/.env"))
seen = {}
root_dev = os.stat("/").st_dev
for p in sorted(paths):
    try:
        with open(p, "rb") as f:
            data = f.read()
        seen[p] = {"outcome": "token" if any(n in data for n in needles) else "read"}
    except OSError as e:
        seen[p] = {"outcome": type(e).__name__}
    # The deepest directory of the path that exists here, and whether it
    # is part of the image's own filesystem (not something mounted).
    d = os.path.dirname(p)
    while True:
        try:
            st = os.lstat(d)
            break
        except OSError:
            d = os.path.dirname(d)
    seen[p].update(exists_up_to=d, on_image=st.st_dev == root_dev)
report["paths"] = seen

# What is mounted: (the mount's root within its source, where).
with open("/proc/self/mountinfo") as f:
    report["mounts"] = [line.split()[3:5] for line in f]

if WALK:
    with open("/tmp/canary.txt", "wb") as f:
        f.write(b"a file the search must find: " + canary)
    hits, canaries, files, size = [], [], 0, 0
    for root, dirs, names in os.walk("/", onerror=lambda e: None):
        if root == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
        for name in names:
            p = os.path.join(root, name)
            try:
                st = os.lstat(p)
                if not stat.S_ISREG(st.st_mode) or st.st_size > (64 << 20):
                    continue
                with open(p, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            files += 1
            size += len(data)
            if any(n in data for n in needles):
                hits.append(p)
            if canary in data:
                canaries.append(p)
    report.update(fs_hits=hits, canary_at=canaries, files_read=files, bytes_read=size)

print(json.dumps(report))
'''


def probe(secrets: Tuple[str, ...], canary: str, env_file: str, walk: bool) -> str:
    return (
        f"REVERSED = {[s[::-1] for s in secrets]!r}\n"
        f"REVERSED_CANARY = {canary[::-1]!r}\n"
        f"HOST_ENV_FILE = {env_file!r}\n"
        f"WALK = {walk!r}\n" + PROBE
    )


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[Dict[str, Any]]:
    """An agent process as it runs: a key in its environment, another in
    ~/.hermes/.env (a home of its own below the real one, so that the
    user's files are not touched), loaded at startup."""
    env_key = "sk-ant-" + os.urandom(16).hex()
    file_key = "sk-or-v1-" + os.urandom(16).hex()
    real_home = os.path.expanduser("~")
    home = tempfile.mkdtemp(prefix=".execute-code-test-", dir=real_home)
    try:
        monkeypatch.setenv("HOME", home)
        monkeypatch.delenv("HERMES_HOME", raising=False)
        monkeypatch.setenv("ANTHROPIC_API_KEY", env_key)
        monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
        env_file = pathlib.Path(home, ".hermes", ".env")
        env_file.parent.mkdir(mode=0o700)
        env_file.write_text(f"# hermes\nOPENROUTER_API_KEY={file_key}\nexport MODEL='x/y'\n")
        env_file.chmod(0o600)
        assert execute_code.hermes_home() == env_file.parent
        loaded = execute_code.load_env_file(env_file)
        assert loaded["OPENROUTER_API_KEY"] == file_key and os.environ["OPENROUTER_API_KEY"] == file_key
        yield {"secrets": (env_key, file_key), "env_file": str(env_file)}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_the_unsafe_pattern_leaks_both_keys(agent: Dict[str, Any]) -> None:
    # What the tool replaces: the model's code as a child of the agent.
    # The probe finds each key: in its environment and in the file.
    code = probe(agent["secrets"], "c" + os.urandom(8).hex(), agent["env_file"], walk=False)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    report = json.loads(out.stdout)
    assert report["env_hits"] == ["ANTHROPIC_API_KEY", "OPENROUTER_API_KEY"]
    assert report["paths"][agent["env_file"]]["outcome"] == "token"
    assert report["proc_hits"], "the child's own /proc/self/environ holds the keys"


def test_the_sandboxed_code_finds_neither_key(runsbx_bin: str, agent: Dict[str, Any]) -> None:
    secrets = agent["secrets"]
    canary = "c" + os.urandom(8).hex()
    tool = execute_code.ExecuteCode(timeout=300)
    answer = tool(probe(secrets, canary, agent["env_file"], walk=True))
    # Nothing the tool hands back to the model holds a key.
    for s in secrets:
        assert s not in answer
    reply = json.loads(answer)
    assert reply["status"] == "success", reply
    report = json.loads(reply["output"])

    # The environment: none of the agent's variables.
    assert report["env_hits"] == []
    for name in ("ANTHROPIC_API_KEY", "OPENROUTER_API_KEY", "HERMES_HOME"):
        assert name not in report["env_names"]
    assert "PATH" in report["env_names"]  # the image's environment is there
    # Every process's environment and command line, read and clean.
    assert report["proc_read"] >= 2 and report["proc_hits"] == []
    # The file, at its host path and where else a home could be: absent,
    # or behind a directory of the image itself (rootless, the image's
    # /root is 0700 and owned by an id the sandbox does not map).
    assert agent["env_file"] in report["paths"]
    for path, seen in report["paths"].items():
        assert seen["outcome"] in ("FileNotFoundError", "PermissionError"), (path, seen)
        if seen["outcome"] == "PermissionError":
            assert seen["on_image"], (path, seen)
    assert any(point == "/workspace" for _, point in report["mounts"]), report["mounts"]
    # Nothing of the host's homes is mounted: not at a home's place, and
    # no mount's source is the agent's home.
    home = os.path.dirname(os.path.dirname(agent["env_file"]))
    for mount_root, mount_point in report["mounts"]:
        for place in ("/root", "/home", home):
            assert not (mount_point == place or mount_point.startswith(place + "/")), report["mounts"]
        assert "hermes" not in mount_root and not mount_root.startswith(home), report["mounts"]
    # The whole filesystem: the canary written in the sandbox was found,
    # so files were read; the keys were not.
    assert report["canary_at"] == ["/tmp/canary.txt"]
    assert report["files_read"] > 1000, report["files_read"]
    assert report["fs_hits"] == []


def test_a_credential_is_never_passed_on() -> None:
    with pytest.raises(ValueError, match="credential"):
        execute_code.ExecuteCode(env_passthrough=["LANG", "OPENAI_API_KEY"])


def test_tool_reports_errors_and_timeouts(runsbx_bin: str) -> None:
    tool = execute_code.ExecuteCode(timeout=2)
    reply = json.loads(tool("raise ValueError('bad input')"))
    assert (reply["status"], reply["exit_code"]) == ("error", 1)
    assert "ValueError: bad input" in reply["error"]
    reply = json.loads(tool("import time\nprint('started', flush=True)\ntime.sleep(60)"))
    assert reply["status"] == "timeout"
    assert reply["output"] == "started\n"
    reply = json.loads(execute_code.ExecuteCode(image="no-such-image-for-examples")("print(1)"))
    assert reply["status"] == "error" and reply["error"].startswith("ImageNotFound")
