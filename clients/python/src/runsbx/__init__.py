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

:class:`Session` keeps files between calls (``runsbx session``): each
call is still a fresh sandbox, but ``/workspace``, ``$HOME`` and what is
installed persist::

    with runsbx.Session() as s:
        s.run(["python3", "-c", "open('n.txt', 'w').write('1')"])
        assert s.read_file("n.txt") == b"1"

:class:`Pool` keeps sandboxes ready (``runsbx serve``), so that a call
costs milliseconds; each sandbox still runs one call only::

    with runsbx.Pool(size=2) as pool:
        r = pool.run(["python3", "-c", "print(6*7)"])

:mod:`runsbx.aio` has the same with asyncio (but ``Pool``). The binary is ``binary=``, or
the environment variable ``RUNSBX_BIN``, or ``runsbx`` on ``PATH``.
"""

from __future__ import annotations

from . import aio
from ._binary import ENV_VAR, find_binary
from ._call import PIPE, Secret
from ._pool import Pool
from ._session import CallOptions
from ._sync import CallStream, Session, run, sessions, stream
from .errors import (
    BadInput,
    BinaryNotFound,
    CallError,
    CommandNotFound,
    Conflict,
    Failure,
    ImageNotFound,
    NonZeroExit,
    NotExecutable,
    NotFound,
    ProtocolError,
    Refused,
    RunsbxError,
    SessionExists,
    SessionInUse,
    SessionNotFound,
    TimedOut,
)
from .result import (
    SCHEMA,
    SESSION_SCHEMA,
    CallResult,
    CallSession,
    Capped,
    Chunk,
    DenyEvent,
    Disk,
    Egress,
    ErrorInfo,
    Hint,
    Hints,
    Layer,
    Learned,
    LearnedRequest,
    Limits,
    OutputFile,
    ProxyStats,
    Seccomp,
    SessionInfo,
    Stream,
    SyscallDenial,
)

__version__ = "0.1.0"

__all__ = [
    "run",
    "stream",
    "Session",
    "sessions",
    "Pool",
    "aio",
    "PIPE",
    "CallStream",
    "CallOptions",
    "Secret",
    "find_binary",
    "ENV_VAR",
    "SCHEMA",
    "SESSION_SCHEMA",
    # results
    "CallResult",
    "Stream",
    "Limits",
    "OutputFile",
    "Layer",
    "Egress",
    "DenyEvent",
    "Seccomp",
    "SyscallDenial",
    "Hint",
    "Hints",
    "Learned",
    "LearnedRequest",
    "ProxyStats",
    "ErrorInfo",
    "Chunk",
    "Capped",
    "SessionInfo",
    "CallSession",
    "Disk",
    # errors
    "RunsbxError",
    "BinaryNotFound",
    "ProtocolError",
    "CallError",
    "BadInput",
    "Refused",
    "NotFound",
    "ImageNotFound",
    "SessionNotFound",
    "CommandNotFound",
    "NotExecutable",
    "Conflict",
    "SessionExists",
    "SessionInUse",
    "Failure",
    "TimedOut",
    "NonZeroExit",
]
