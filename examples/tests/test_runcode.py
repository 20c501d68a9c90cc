"""examples/runcode.py: the values a RunCode action returns, and what the
code it runs can no longer do to the agent (its files, its process, its
time)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from typing import Tuple

import pytest

from runcode import RunCode


def run_text(code: str, **kw: float) -> Tuple[str, str]:
    return asyncio.run(RunCode(**kw).run_text(code))  # type: ignore[arg-type]


def test_output_and_no_error(runsbx_bin: str) -> None:
    out, err = run_text("print(sum(range(10)))\nprint('é')")
    assert (out, err) == ("45\né\n", "")


def test_traceback_text(runsbx_bin: str) -> None:
    out, err = run_text("print('before')\ndef f():\n    return 1 / 0\nf()\n")
    assert out == "before\n"
    assert err.startswith("Traceback (most recent call last):")
    assert 'File "/workspace/main.py", line 3, in f' in err
    assert err.rstrip().endswith("ZeroDivisionError: division by zero")
    out, err = run_text("def broken(:\n")
    assert out == ""
    assert "SyntaxError" in err


def test_host_files_are_not_there(runsbx_bin: str) -> None:
    # A file the agent can read (this test's own source, and a file made
    # now in its home with a token in it) is absent in the sandbox: the code observes
    # FileNotFoundError, not a permission error it might get around.
    token = "runcode-host-file-" + os.urandom(8).hex()
    with tempfile.NamedTemporaryFile("w", dir=os.path.expanduser("~"), prefix=".runcode-test-", suffix=".txt") as f:
        f.write(token)
        f.flush()
        with open(f.name) as check:  # the agent itself can read it
            assert check.read() == token
        code = (
            "import os\n"
            f"for p in [{os.path.abspath(__file__)!r}, {f.name!r}]:\n"
            "    try:\n"
            "        open(p).read(); print('READ', p)\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__, p)\n"
        )
        out, err = run_text(code)
    assert err == ""
    assert out.splitlines() == [
        f"FileNotFoundError {os.path.abspath(__file__)}",
        f"FileNotFoundError {f.name}",
    ]
    assert token not in out


def test_the_agent_process_is_out_of_reach(runsbx_bin: str) -> None:
    # exec() would run this in the agent's own process; in the sandbox the
    # agent's pid does not exist (its own pid namespace).
    me = os.getpid()
    out, err = run_text(
        "import os, signal\n"
        f"try:\n    os.kill({me}, signal.SIGKILL)\n    print('KILLED')\n"
        "except ProcessLookupError:\n    print('ProcessLookupError')\n"
        "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
    )
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == "ProcessLookupError"
    assert lines[1] == "[1]", "the sandbox sees only its own process"
    assert os.getpid() == me  # and here we still are


def test_endless_code_is_stopped_and_said_so(runsbx_bin: str) -> None:
    start = time.monotonic()
    out, err = run_text("print('started', flush=True)\nwhile True:\n    pass\n", timeout=2)
    assert time.monotonic() - start < 30
    assert out == "started\n"
    assert "TimeoutError: the code ran longer than 2 s and was stopped" in err


def test_large_output_is_cut_and_said_so(runsbx_bin: str) -> None:
    out, err = run_text("print('x' * 1_000_000)")
    assert len(out) == 256 * 1024  # RunCode's max_output: its first and last 128 KiB
    assert "[output cut:" in err


def test_each_run_starts_fresh(runsbx_bin: str) -> None:
    async def main() -> Tuple[Tuple[str, str], Tuple[str, str]]:
        rc = RunCode()
        first = await rc.run_text("open('state.txt', 'w').write('1'); print('wrote')")
        second = await rc.run_text("import os; print(os.path.exists('state.txt'))")
        return first, second

    first, second = asyncio.run(main())
    assert first == ("wrote\n", "")
    assert second == ("False\n", "")


def test_runs_at_once(runsbx_bin: str) -> None:
    async def main() -> list:  # type: ignore[type-arg]
        rc = RunCode()
        return await asyncio.gather(*(rc.run_text(f"import time; time.sleep(1); print({i})") for i in range(3)))

    start = time.monotonic()
    results = asyncio.run(main())
    assert results == [("0\n", ""), ("1\n", ""), ("2\n", "")]
    assert time.monotonic() - start < 20


def test_run_script_on_a_copy(runsbx_bin: str) -> None:
    with tempfile.TemporaryDirectory() as wd:
        os.makedirs(os.path.join(wd, "pkg"))
        with open(os.path.join(wd, "pkg", "__init__.py"), "w") as f:
            f.write("def answer():\n    return 42\n")
        with open(os.path.join(wd, "check.py"), "w") as f:
            f.write("import pkg\nprint(pkg.answer())\nopen('pkg/__init__.py', 'w').write('')\n")
        out, err = asyncio.run(RunCode().run_script(wd, ["python3", "check.py"]))
        assert (out, err) == ("42\n", "")
        # The script emptied its copy of the package, not the host's.
        with open(os.path.join(wd, "pkg", "__init__.py")) as f:
            assert "answer" in f.read()
    out, err = asyncio.run(RunCode().run_script("/nonexistent-dir", ["python3", "x.py"]))
    assert out == "" and err.startswith("NotADirectoryError")


def test_a_refused_run_is_text_too(runsbx_bin: str) -> None:
    out, err = asyncio.run(RunCode(image="no-such-image-for-examples").run_text("print(1)"))
    assert out == ""
    assert err.startswith("ImageNotFound: ")


if __name__ == "__main__":
    pytest.main([__file__, "-v"])
