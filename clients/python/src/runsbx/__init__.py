"""A Python client for runsbx, a hardened sandbox runtime for AI agents'
tool calls.

It drives the ``runsbx`` binary (``runsbx call``): each call runs one
command in a fresh sandbox and returns a :class:`CallResult`::

    import runsbx

    r = runsbx.run(["python3", "-c", "print(6*7)"])
    assert r.ok and r.stdout_text == "42\\n"

    with runsbx.stream("for i in 1 2 3; do echo $i; sleep 1; done") as s:
        for chunk in s:
            print(chunk.stream, chunk.text, end="")
    print(s.result.exit_code)

:mod:`runsbx.aio` has the same with asyncio. The binary is ``binary=``, or
the environment variable ``RUNSBX_BIN``, or ``runsbx`` on ``PATH``.
"""

from __future__ import annotations

from . import aio
from ._binary import ENV_VAR, find_binary
from ._call import PIPE
from ._sync import CallStream, run, stream
from .errors import (
    BadInput,
    BinaryNotFound,
    CallError,
    CommandNotFound,
    Failure,
    ImageNotFound,
    NonZeroExit,
    NotExecutable,
    NotFound,
    ProtocolError,
    Refused,
    RunsbxError,
    TimedOut,
)
from .result import (
    SCHEMA,
    CallResult,
    Capped,
    Chunk,
    DenyEvent,
    Egress,
    ErrorInfo,
    Layer,
    Limits,
    OutputFile,
    ProxyStats,
    Stream,
)

__version__ = "0.1.0"

__all__ = [
    "run",
    "stream",
    "aio",
    "PIPE",
    "CallStream",
    "find_binary",
    "ENV_VAR",
    "SCHEMA",
    # results
    "CallResult",
    "Stream",
    "Limits",
    "OutputFile",
    "Layer",
    "Egress",
    "DenyEvent",
    "ProxyStats",
    "ErrorInfo",
    "Chunk",
    "Capped",
    # errors
    "RunsbxError",
    "BinaryNotFound",
    "ProtocolError",
    "CallError",
    "BadInput",
    "Refused",
    "NotFound",
    "ImageNotFound",
    "CommandNotFound",
    "NotExecutable",
    "Failure",
    "TimedOut",
    "NonZeroExit",
]
