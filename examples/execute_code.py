#!/usr/bin/env python3
"""An execute_code tool whose code cannot see the agent's API keys.

The pattern it replaces: an agent (hermes-agent's ``execute_code`` tool
is one) keeps its provider API keys in ``~/.hermes/.env``, loads them into
its own environment at startup, and runs the model's code as a child
process -- which inherits that environment and can read the file. Any
prompt injection that gets code run ("print os.environ", "cat
~/.hermes/.env") gets the keys.

Here the tool runs the code in a fresh runsbx sandbox. runsbx never passes
its own environment on: the code gets the image's environment, ``HOME=/tmp``
and only the variables this tool names (``env_passthrough``, none of
which may look like a secret). The sandbox's filesystem is the image, a
fresh /workspace and /tmp: the host's home directories are not in it, by
any path. There is no network unless the tool allows hosts.

The tool returns a JSON string, as agents' tools do::

    {"status": "success", "output": "...", "error": "", "exit_code": 0,
     "duration_seconds": 0.07}

Run it::

    python3 examples/execute_code.py 'import os; print(sorted(os.environ))'

It needs the runsbx client (``pip install ./clients/python``, or
``PYTHONPATH=clients/python/src``), the ``runsbx`` binary and its
``python`` image (``sudo runsbx image build python``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys
from typing import Dict, Iterable, List, Optional

import runsbx

#: The tool's schema, for a model's tool list (OpenAI function format).
TOOL_SCHEMA = {
    "name": "execute_code",
    "description": (
        "Run a Python 3 script in an isolated sandbox and return what it printed. "
        "Each call starts fresh: no files from earlier calls, no network."
    ),
    "parameters": {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python source to run."}},
        "required": ["code"],
    },
}

# A variable whose name says it holds a credential is never passed on,
# even when asked for.
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION", re.I)


def hermes_home() -> pathlib.Path:
    """The agent's directory: ``$HERMES_HOME``, else ``~/.hermes``."""
    return pathlib.Path(os.environ.get("HERMES_HOME") or pathlib.Path.home() / ".hermes")


def load_env_file(path: pathlib.Path) -> Dict[str, str]:
    """Reads ``KEY=VALUE`` lines (``#`` comments, optional ``export`` and
    quotes) into ``os.environ`` without replacing what is set, as an
    agent does with its ``.env`` at startup; returns what it read."""
    read: Dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return read
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.strip()
        if key.startswith("export "):
            key = key[len("export ") :].strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        read[key] = value
        os.environ.setdefault(key, value)
    return read


class ExecuteCode:
    """The tool: ``ExecuteCode()(code)`` runs ``code`` and returns the
    JSON string for the model.

    Args:
        timeout: Seconds the script may run.
        memory: Its memory limit (at most the operator profile's, 512M by default).
        env_passthrough: Names of variables of this process to give the
            script (a name that looks like a credential is refused).
        allow_hosts: Hosts the script may reach through runsbx's egress
            proxy (none by default).
        image: The runsbx image (default ``python``).
        binary: The runsbx binary.
    """

    def __init__(
        self,
        *,
        timeout: float = 60.0,
        memory: str = "512M",
        env_passthrough: Iterable[str] = ("LANG", "TZ"),
        allow_hosts: Iterable[str] = (),
        image: Optional[str] = None,
        binary: Optional[str] = None,
    ) -> None:
        self.env_passthrough: List[str] = []
        for name in env_passthrough:
            if _SECRET_NAME.search(name):
                raise ValueError(f"env_passthrough {name!r}: looks like a credential; never pass it to model code")
            self.env_passthrough.append(name)
        self.timeout = timeout
        self.memory = memory
        self.allow_hosts = list(allow_hosts)
        self.image = image
        self.binary = binary

    def __call__(self, code: str) -> str:
        env = {k: os.environ[k] for k in self.env_passthrough if k in os.environ}
        try:
            r = runsbx.run(
                ["python3", "script.py"],
                files={"script.py": code},
                env=env,
                timeout=self.timeout,
                memory=self.memory,
                allow_hosts=self.allow_hosts,
                image=self.image,
                max_output="512K",
                binary=self.binary,
            )
        except runsbx.BinaryNotFound:
            raise
        except runsbx.CallError as e:
            return json.dumps({"status": "error", "output": "", "error": f"{type(e).__name__}: {e}"})
        if r.timed_out:
            status = "timeout"
        elif r.ok:
            status = "success"
        else:
            status = "error"
        return json.dumps(
            {
                "status": status,
                "output": r.stdout_text,
                "error": r.stderr_text,
                "exit_code": r.exit_code,
                "duration_seconds": round(r.duration_ms / 1000, 3),
            }
        )


def main(argv: List[str]) -> int:
    load_env_file(hermes_home() / ".env")
    code = argv[1] if len(argv) > 1 else sys.stdin.read()
    print(ExecuteCode()(code))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
