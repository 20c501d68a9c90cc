"""What the example tests share: the client and the examples importable,
the runsbx binary and its ``python`` image, skips that fail under CI=true.

The tests drive the real runsbx (``RUNSBX_BIN``, else ``runsbx`` on PATH)
on the ``python`` image; from the repository's root, as root or as an
unprivileged user::

    RUNSBX_BIN=target/x86_64-unknown-linux-gnu/release/runsbx python3 -m pytest -v examples/tests

(``hack/examples-test.sh`` runs them as both.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import NoReturn

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.dirname(HERE)
# The client from this checkout (clients/python/src beside examples/), or
# the one RUNSBX_CLIENT_SRC names, before any installed one.
SRC = os.environ.get("RUNSBX_CLIENT_SRC") or os.path.join(os.path.dirname(EXAMPLES), "clients", "python", "src")
for path in (EXAMPLES, SRC):
    if path not in sys.path:
        sys.path.insert(0, path)

CI = os.environ.get("CI") == "true"


def skip(reason: str) -> NoReturn:
    """Skips the test with ``SKIP <reason>`` on stdout; under CI=true the
    test fails instead."""
    print(f"SKIP {reason}", flush=True)
    if CI:
        pytest.fail(f"SKIP under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def runsbx_bin() -> str:
    """The runsbx binary, with the ``python`` image the examples run on."""
    env = os.environ.get("RUNSBX_BIN")
    found = (os.path.abspath(env) if os.sep in env else shutil.which(env)) if env else shutil.which("runsbx")
    if found is None or not os.access(found, os.X_OK):
        skip("no runsbx binary: set RUNSBX_BIN=/path/to/runsbx (or put runsbx on PATH)")
    out = subprocess.run([found, "image", "ls", "--json"], capture_output=True, text=True, timeout=60)
    try:
        names = [i["name"] for i in json.loads(out.stdout)]
    except (ValueError, KeyError, TypeError):
        names = []
    if "python" not in names:
        skip("no `python` image: build it with `sudo runsbx image build python`")
    os.environ["RUNSBX_BIN"] = found
    return found
