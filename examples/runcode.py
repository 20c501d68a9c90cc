#!/usr/bin/env python3
"""A RunCode action that runs model-written Python in a runsbx sandbox.

The pattern it replaces: an agent framework's "run code" action (MetaGPT's
``RunCode`` is the well-known one) that hands the model's code to
``exec()`` in the agent's own process and returns ``(output, error)`` as
strings. Code run that way reads and writes whatever the agent can, sees
its API keys, can kill it, and an endless loop hangs it.

Here the same interface -- an async ``run_text(code) -> (stdout, stderr)``
and ``run_script(working_directory, command) -> (stdout, stderr)``, always
strings -- runs each piece of code with ``python3`` in a fresh runsbx
sandbox: no host files, no network, none of the agent's environment, its
own processes, a deadline and memory limit. The model still gets what it
needs to fix its code: what it printed, and the traceback text.

Run it::

    python3 examples/runcode.py 'print(sum(range(10)))'
    echo '1/0' | python3 examples/runcode.py

It needs the runsbx client (``pip install ./clients/python``, or
``PYTHONPATH=clients/python/src``), the ``runsbx`` binary and its
``python`` image (``sudo runsbx image build python``).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
from typing import Dict, List, Mapping, Optional, Tuple, Union

import runsbx
import runsbx.aio

#: The file the code is written to in the sandbox's /workspace (its name
#: appears in tracebacks).
SCRIPT = "main.py"


class RunCode:
    """Runs Python in a fresh sandbox per call and reports it as text.

    Args:
        timeout: Seconds the code may run; then the sandbox is killed.
        memory: Its memory limit (``"512M"``).
        image: The runsbx image (default ``python``).
        max_output: Bytes kept of each of stdout and stderr (the first and
            last halves of longer output).
        binary: The runsbx binary (default ``$RUNSBX_BIN`` or ``PATH``).
    """

    def __init__(
        self,
        *,
        timeout: float = 30.0,
        memory: Optional[str] = "512M",
        image: Optional[str] = None,
        max_output: str = "256K",
        binary: Optional[str] = None,
    ) -> None:
        self.timeout = timeout
        self.memory = memory
        self.image = image
        self.max_output = max_output
        self.binary = binary

    async def run_text(self, code: str) -> Tuple[str, str]:
        """Runs ``code`` (Python source) and returns ``(stdout, stderr)``:
        what it printed, and its stderr, which holds the traceback text
        when it raised. A timeout or a refusal is reported in the second
        string too, never raised: the caller hands both to the model.

        Raises:
            runsbx.BinaryNotFound: runsbx is not installed (the operator's
                problem, not the model's).
        """
        return await self._run(["python3", SCRIPT], files={SCRIPT: code})

    async def run_script(
        self, working_directory: Union[str, "os.PathLike[str]"], command: List[str]
    ) -> Tuple[str, str]:
        """Runs ``command`` (``["python3", "-m", "pytest", "-q"]``) in a
        sandbox whose /workspace is a copy of ``working_directory`` (the
        host directory itself is never touched) and returns ``(stdout,
        stderr)`` as :meth:`run_text` does."""
        if not os.path.isdir(working_directory):
            return "", f"NotADirectoryError: {os.fspath(working_directory)!r} is not a directory"
        # Each entry of the directory, copied into /workspace by runsbx.
        top = pathlib.Path(working_directory)
        files: Dict[str, Union[str, pathlib.Path]] = {p.name: p for p in top.iterdir()}
        return await self._run(list(command), files=files)

    async def _run(self, cmd: List[str], *, files: Mapping[str, Union[str, pathlib.Path]]) -> Tuple[str, str]:
        try:
            r = await runsbx.aio.run(
                cmd,
                files=files,
                timeout=self.timeout,
                memory=self.memory,
                image=self.image,
                max_output=self.max_output,
                binary=self.binary,
            )
        except runsbx.BinaryNotFound:
            raise
        except runsbx.CallError as e:
            # The code never ran: a missing image, a refused option.
            return "", f"{type(e).__name__}: {e}"
        return r.stdout_text, _stderr_text(r)


def _stderr_text(r: runsbx.CallResult) -> str:
    """The command's stderr, with a line for what the model cannot see in
    it: a deadline, a signal, output that was cut."""
    text = r.stderr_text
    notes = []
    if r.timed_out:
        ms = r.limits.timeout_ms
        notes.append(f"TimeoutError: the code ran longer than {ms / 1000:g} s and was stopped" if ms else
                     "TimeoutError: the code ran past its deadline and was stopped")
    elif r.signal is not None:
        hit = " (out of memory)" if r.limits.memory_hit else ""
        notes.append(f"the code was killed by {r.signal}{hit}")
    if r.truncated:
        notes.append(
            f"[output cut: {r.stdout.omitted_bytes + r.stderr.omitted_bytes} bytes left out of the middle]"
        )
    if notes:
        text += ("" if not text or text.endswith("\n") else "\n") + "\n".join(notes) + "\n"
    return text


def main(argv: List[str]) -> int:
    code = argv[1] if len(argv) > 1 else sys.stdin.read()
    out, err = asyncio.run(RunCode(timeout=30).run_text(code))
    sys.stdout.write(out)
    sys.stderr.write(err)
    return 1 if err else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
