"""What the tests share: the package from this checkout, the runsbx binary,
a busybox rootfs, skips that fail under CI=true.

The tests drive the real runsbx (``RUNSBX_BIN``, else ``runsbx`` on PATH);
run them from the repository's root, as root or as an unprivileged user::

    RUNSBX_BIN=target/x86_64-unknown-linux-gnu/release/runsbx python3 -m pytest -v clients/python/tests
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(HERE)  # clients/python
SRC = os.path.join(PROJECT, "src")

# The package from this checkout, not an installed one.
if SRC not in sys.path:
    sys.path.insert(0, SRC)

import runsbx  # noqa: E402

CI = os.environ.get("CI") == "true"

#: The applets of busybox the tests' commands use.
APPLETS = [
    "sh", "echo", "cat", "ls", "printf", "read", "sleep", "true", "false",
    "head", "dd", "mkdir", "ln", "env", "wc", "tr", "yes", "seq", "kill",
    "wget", "find", "test", "[", "rm",
]


def skip(test: unittest.TestCase, reason: str) -> None:
    """Skips ``test`` with ``SKIP <reason>`` on stdout; under CI=true the
    test fails instead."""
    print(f"SKIP {reason}", flush=True)
    if CI:
        test.fail(f"SKIP under CI=true: {reason}")
    raise unittest.SkipTest(reason)


def binary() -> Optional[str]:
    """The runsbx binary the tests drive, or None."""
    env = os.environ.get("RUNSBX_BIN")
    if env:
        return os.path.abspath(env) if os.sep in env else shutil.which(env)
    return shutil.which("runsbx")


def need_binary(test: unittest.TestCase) -> str:
    found = binary()
    if found is None or not os.access(found, os.X_OK):
        skip(test, "no runsbx binary: set RUNSBX_BIN=/path/to/runsbx (or put runsbx on PATH)")
    assert found is not None
    return found


def images(bin_path: str) -> List[str]:
    """The names `runsbx image ls` lists."""
    out = subprocess.run(
        [bin_path, "image", "ls", "--json"], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        return []
    try:
        return [i["name"] for i in json.loads(out.stdout)]
    except (ValueError, KeyError, TypeError):
        return []


class Rootfs:
    """A busybox-static root filesystem in a private temporary directory:
    ``/bin/busybox`` and its applets, the directories a sandbox needs, and
    ``/etc/passwd`` (a file that is not executable). Root-owned where the
    tests run as root, 0755: runsbx refuses a rootfs others may write to."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="runsbx-py-test-")
        os.chmod(self.tmp, 0o755)
        self.path = os.path.join(self.tmp, "rootfs")
        busybox = shutil.which("busybox") or "/bin/busybox"
        if not os.path.exists(busybox):
            raise FileNotFoundError(
                "busybox is missing: apt-get install busybox-static"
            )
        for d in ("bin", "tmp", "workspace", "proc", "dev", "etc", "sys"):
            os.makedirs(os.path.join(self.path, d), mode=0o755)
        shutil.copy(busybox, os.path.join(self.path, "bin", "busybox"))
        os.chmod(os.path.join(self.path, "bin", "busybox"), 0o755)
        for applet in APPLETS:
            os.symlink("busybox", os.path.join(self.path, "bin", applet))
        with open(os.path.join(self.path, "etc", "passwd"), "w") as f:
            f.write("root:x:0:0:root:/tmp:/bin/sh\n")
        os.chmod(os.path.join(self.path, "etc", "passwd"), 0o644)
        for root, dirs, files in os.walk(self.path):
            for name in dirs + [""]:
                p = os.path.join(root, name)
                os.chmod(p, 0o755)
        self._check()

    def _check(self) -> None:
        for root, dirs, _ in os.walk(self.path):
            for name in dirs:
                mode = os.stat(os.path.join(root, name)).st_mode
                assert not mode & (stat.S_IWGRP | stat.S_IWOTH), (root, name)

    def remove(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


class RunsbxTestCase(unittest.TestCase):
    """A test case with the binary (``self.bin``) and a busybox rootfs
    (``self.rootfs``), made once per class."""

    bin: str
    rootfs: str
    _rootfs: Optional[Rootfs] = None

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        found = binary()
        if found is None or not os.access(found, os.X_OK):
            return  # each test skips (or fails under CI) in setUp
        cls.bin = found
        cls._rootfs = Rootfs()
        cls.rootfs = cls._rootfs.path

    @classmethod
    def tearDownClass(cls) -> None:
        if cls._rootfs is not None:
            cls._rootfs.remove()
            cls._rootfs = None
        super().tearDownClass()

    def setUp(self) -> None:
        super().setUp()
        need_binary(self)

    def need_python_image(self) -> None:
        """Skips the test unless `runsbx image ls` lists `python`."""
        if "python" not in images(self.bin):
            skip(
                self,
                "no `python` image: build it with `sudo runsbx image build python`",
            )
