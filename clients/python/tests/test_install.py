"""The package installs with pip into a fresh virtual environment and works
from there (not from this checkout)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from typing import Dict, Optional

import _support

APT = "apt-get install -y python3-venv"


class InstallTest(unittest.TestCase):
    tmp: Optional[str] = None
    python: Optional[str] = None
    problem: Optional[str] = None

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix="runsbx-py-venv-")
        os.chmod(cls.tmp, 0o755)
        try:
            cls._install()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _install(cls) -> None:
        assert cls.tmp is not None
        venv = os.path.join(cls.tmp, "venv")
        made = subprocess.run(
            [sys.executable, "-m", "venv", venv], capture_output=True, text=True, timeout=300
        )
        if made.returncode != 0:
            said = (made.stdout + made.stderr).strip()
            if "ensurepip" in said or "No module named venv" in said:
                cls.problem = f"python3 -m venv does not work here ({APT}): {said[-300:]}"
            else:
                raise AssertionError(f"python3 -m venv failed: {said}")
            return
        cls.python = os.path.join(venv, "bin", "python")
        # A copy of the project: pip builds in the source tree it is given.
        src = os.path.join(cls.tmp, "runsbx-python")
        shutil.copytree(
            _support.PROJECT,
            src,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", "tests"),
        )
        # As the README says (pip fetches the build backend, setuptools).
        pip = subprocess.run(
            [cls.python, "-m", "pip", "install", "--disable-pip-version-check", src],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if pip.returncode != 0:
            raise AssertionError(f"pip install failed:\n{pip.stdout}\n{pip.stderr}")

    @classmethod
    def tearDownClass(cls) -> None:
        if cls.tmp is not None:
            shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    def venv_python(self, code: str, env: Optional[Dict[str, str]] = None) -> str:
        if self.problem is not None:
            _support.skip(self, self.problem)
        assert self.python is not None and self.tmp is not None
        clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        clean.update(env or {})
        out = subprocess.run(
            [self.python, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            cwd=self.tmp,
            env=clean,
            timeout=120,
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout

    def test_imports_from_the_venv(self) -> None:
        out = self.venv_python(
            """
            import os, sys, runsbx, runsbx.aio
            assert runsbx.__file__.startswith(sys.prefix), (runsbx.__file__, sys.prefix)
            here = os.path.dirname(runsbx.__file__)
            assert os.path.exists(os.path.join(here, "py.typed"))
            assert issubclass(runsbx.ImageNotFound, runsbx.RunsbxError)
            print("ok", runsbx.__version__)
            """
        )
        self.assertEqual(out.split()[0], "ok")

    def test_installed_package_runs_a_call(self) -> None:
        binary = _support.need_binary(self)
        rootfs = _support.Rootfs()
        try:
            out = self.venv_python(
                f"""
                import runsbx
                r = runsbx.run(["sh", "-c", "cat; echo $X"], rootfs={rootfs.path!r},
                               stdin="from the venv ", env={{"X": "ok"}}, check=True)
                print(r.stdout_text, end="")
                """,
                env={"RUNSBX_BIN": binary},
            )
        finally:
            rootfs.remove()
        self.assertEqual(out, "from the venv ok\n")


if __name__ == "__main__":
    unittest.main()
