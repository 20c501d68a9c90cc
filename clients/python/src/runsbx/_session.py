"""What the synchronous and the asyncio ``Session`` share: the options a
call into a session takes, and the file operations as calls (the command,
its options, and how its result becomes a value or an error). Only the
running of a call differs between the two; it is in ``_sync.py`` and
``aio.py``."""

from __future__ import annotations

import errno
import os
import posixpath
from typing import Any, Callable, Dict, Generic, List, Mapping, Optional, TypedDict, TypeVar, Union

from ._binary import PathArg
from ._call import WORKSPACE, FileContent, Secret, Size, Stdin, Strings, _Pipe, workspace_path
from .errors import CallError, Failure, Refused
from .result import CallResult, SessionInfo

T = TypeVar("T")


class CallOptions(TypedDict, total=False):
    """The options of a call into a session: those of :func:`runsbx.run`
    but ``session`` and ``binary``, which are the session's. ``timeout``
    defaults to the session's own; ``image``, ``memory``, ``pids``,
    ``timeout`` and ``allow_hosts`` may only tighten the session's."""

    image: Optional[str]
    rootfs: Optional[PathArg]
    timeout: Optional[float]
    stdin: Union[Stdin, _Pipe]
    env: Optional[Mapping[str, str]]
    files: Optional[Mapping[str, FileContent]]
    outputs: Optional[Strings]
    allow_hosts: Optional[Strings]
    allow: Optional[Strings]
    proxy_resolve: Optional[Mapping[str, str]]
    proxy_allow_addresses: Optional[Strings]
    memory: Optional[Size]
    pids: Optional[int]
    profile: Optional[str]
    max_output: Optional[Size]
    secrets: Optional[Mapping[str, Secret]]
    learn: bool
    check: bool


_OWN = ("session", "binary")


class SessionCore:
    """The state of a session handle, and how it turns a call's options
    into the arguments of an invocation."""

    def __init__(self, info: Optional[SessionInfo], binary: Optional[PathArg], keep: bool) -> None:
        self._info = info
        self._binary = binary
        self.keep = keep
        self.closed = False

    @property
    def info(self) -> SessionInfo:
        """The session as runsbx described it when it was created or
        attached (``in_use`` is as of then)."""
        if self._info is None:
            raise RuntimeError("the session is not created yet: use `async with` or `await create()`")
        return self._info

    @property
    def name(self) -> str:
        """The session's name."""
        return self.info.name

    def _call_args(self, options: Mapping[str, Any]) -> Dict[str, Any]:
        """The keyword arguments of the ``Invocation`` of a call with
        ``options``."""
        if self.closed:
            raise RuntimeError(f"session {self.name!r} is closed")
        for key in _OWN:
            if key in options:
                raise TypeError(f"{key}= is the session's own; do not pass it to a call")
        args: Dict[str, Any] = {"timeout": None}
        args.update(options)
        args["session"] = self.name
        args["binary"] = self._binary
        return args

    def __repr__(self) -> str:
        name = self._info.name if self._info is not None else None
        state = "closed" if self.closed else "open"
        return f"<{type(self).__name__} {name!r} {state}{' keep' if self.keep else ''}>"


class FileOp(Generic[T]):
    """A file operation as one call: the command and options to run it
    with, and :meth:`finish` to read its result."""

    def __init__(self, cmd: List[str], options: Dict[str, Any], finish: Callable[[CallResult], T]) -> None:
        self.cmd = cmd
        self.options = options
        self.finish = finish


def _ran(result: CallResult, what: str) -> CallResult:
    """``result`` of a helper command that must exit 0 or 3-5 (its own
    codes); anything else means the image lacks what it needs."""
    if result.status != "exited" or result.exit_code not in (0, 3, 4, 5):
        raise Failure(
            f"{what}: the helper command ended with {result.status} {result.exit_code}: "
            f"{result.stderr_text.strip()[:500]}",
            result=result,
        )
    return result


# Prints what the path is; runs in the sandbox with `sh` (any image's).
_WHAT_IS = (
    'if [ -L "$1" ]; then echo link; elif [ -d "$1" ]; then echo dir; '
    'elif [ -f "$1" ]; then echo file; elif [ -e "$1" ]; then echo other; else echo none; fi'
)


def read_file(path: Union[str, os.PathLike[str]]) -> FileOp[bytes]:
    """Reads a file below /workspace, copied out by ``--output``."""
    rel = workspace_path("read_file", path)
    if rel == ".":
        raise IsADirectoryError(errno.EISDIR, f"{WORKSPACE} is a directory", os.fspath(path))
    # --output takes globs of `*`, `?` and `**` and no escapes: a `?` for
    # each of those characters matches the file (and maybe others, whose
    # copies are ignored).
    glob = rel.replace("*", "?")

    def finish(result: CallResult) -> bytes:
        what = _ran(result, f"read_file {rel!r}").stdout_text.strip()
        shown = f"{WORKSPACE}/{rel}"
        if what == "none":
            raise FileNotFoundError(errno.ENOENT, "no such file in the session", shown)
        if what == "dir":
            raise IsADirectoryError(errno.EISDIR, "is a directory", shown)
        for o in result.outputs:
            if posixpath.normpath(o.path) == rel:
                if o.data is not None:
                    return o.data
                message = f"read_file {shown!r}: {o.error}"
                if what == "link":
                    raise Refused(message, result=result)
                raise CallError(message, result=result)
        raise CallError(f"read_file {shown!r} ({what}): runsbx copied nothing out", result=result)

    return FileOp(["sh", "-c", _WHAT_IS, "sh", rel], {"outputs": [glob]}, finish)


def write_file(path: Union[str, os.PathLike[str]], data: Union[bytes, str]) -> FileOp[None]:
    """Writes ``data`` (str as UTF-8) to a file below /workspace, copied in
    by ``--input`` (parent directories are made; an existing file is
    replaced)."""
    rel = workspace_path("write_file", path)
    if not isinstance(data, (bytes, bytearray, memoryview, str)):
        raise TypeError(f"write_file: data must be bytes or str, not {type(data).__name__}")

    def finish(result: CallResult) -> None:
        if not result.ok:
            raise Failure(f"write_file {rel!r}: `true` ended with {result.status} {result.exit_code}", result=result)

    return FileOp(["true"], {"files": {rel: data}}, finish)


# Prints the names in directory $1, each ended by NUL (a name may hold a
# newline); hidden ones too, not `.` and `..`.
_LIST = (
    '[ -e "$1" ] || [ -L "$1" ] || exit 3; [ -d "$1" ] || exit 4; cd -- "$1" || exit 5; '
    'for f in * .[!.]* ..?*; do if [ -e "$f" ] || [ -L "$f" ]; then printf "%s\\0" "$f"; fi; done'
)


def list_files(path: Union[str, os.PathLike[str]]) -> FileOp[List[str]]:
    """The names in a directory below /workspace, sorted."""
    rel = workspace_path("list_files", path)

    def finish(result: CallResult) -> List[str]:
        _ran(result, f"list_files {rel!r}")
        shown = f"{WORKSPACE}/{rel}" if rel != "." else WORKSPACE
        if result.exit_code == 3:
            raise FileNotFoundError(errno.ENOENT, "no such directory in the session", shown)
        if result.exit_code == 4:
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", shown)
        if result.exit_code == 5:
            raise PermissionError(errno.EACCES, result.stderr_text.strip(), shown)
        if result.stdout.truncated:
            raise CallError(f"list_files {shown!r}: the listing is longer than runsbx kept", result=result)
        names = [os.fsdecode(n) for n in result.stdout.data.split(b"\0") if n]
        return sorted(names)

    return FileOp(["sh", "-c", _LIST, "sh", rel], {"max_output": "16M"}, finish)


def python_command(code: str) -> List[str]:
    """The command that runs ``code`` with the image's ``python3``."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, not {type(code).__name__}")
    return ["python3", "-c", code]


__all__ = [
    "CallOptions",
    "SessionCore",
    "FileOp",
    "read_file",
    "write_file",
    "list_files",
    "python_command",
    "workspace_path",
]
