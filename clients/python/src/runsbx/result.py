"""The result of a call (the JSON schema ``runsbx.call/v1``) and the events
of a stream, as frozen dataclasses.

Parsing is lenient about what it does not know: fields added by a later
runsbx are ignored (they stay readable in :attr:`CallResult.raw`), and
fields missing from a short result (a call refused before it ran) take
their empty values.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import os
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Tuple, Union

from .errors import NonZeroExit, ProtocolError, TimedOut

__all__ = [
    "SCHEMA",
    "CallResult",
    "Stream",
    "Limits",
    "OutputFile",
    "Layer",
    "Egress",
    "DenyEvent",
    "Seccomp",
    "SyscallDenial",
    "ProxyStats",
    "ErrorInfo",
    "Chunk",
    "Capped",
    "Disk",
    "CallSession",
    "SessionInfo",
    "SESSION_SCHEMA",
]

#: The schema this client reads (``"schema"`` of the result).
SCHEMA = "runsbx.call/v1"
#: The schema of a session object (``runsbx session create|ls --json``).
SESSION_SCHEMA = "runsbx.session/v1"


@dataclass(frozen=True)
class Stream:
    """What the command wrote on stdout or stderr, as runsbx kept it: the
    whole stream, or, past ``max_output``, its first and last halves.

    Attributes:
        data: The bytes kept (head, then tail when ``truncated``).
        encoding: How runsbx sent them: ``"utf-8"`` or ``"base64"`` (output
            that is not UTF-8); ``data`` is decoded either way.
        bytes: How many bytes the command wrote in all.
        truncated: Whether bytes were left out between head and tail.
        omitted_bytes: How many bytes were left out.
        head_bytes: How many bytes of ``data`` are the head.
    """

    data: builtins.bytes
    encoding: str
    bytes: int
    truncated: bool
    omitted_bytes: int
    head_bytes: int

    @classmethod
    def empty(cls) -> Stream:
        """A stream with nothing in it (a call that did not run)."""
        return cls(b"", "utf-8", 0, False, 0, 0)

    @property
    def text(self) -> str:
        """``data`` as text (UTF-8; undecodable bytes become U+FFFD)."""
        return self.data.decode("utf-8", errors="replace")

    @property
    def head(self) -> builtins.bytes:
        """The first bytes the command wrote."""
        return self.data[: self.head_bytes]

    @property
    def tail(self) -> builtins.bytes:
        """The last bytes the command wrote, when ``truncated`` (empty
        otherwise: everything is in the head)."""
        return self.data[self.head_bytes :]


@dataclass(frozen=True)
class Limits:
    """The limits the sandbox ran under; ``None`` where not applied or, for
    the ``*_hit`` flags, where the host cannot tell (rootless on cgroup v1).
    """

    timeout_ms: Optional[int]
    memory_bytes: Optional[int]
    memory_hit: Optional[bool]
    pids: Optional[int]
    pids_hit: Optional[bool]


@dataclass(frozen=True)
class OutputFile:
    """One file of ``outputs`` (a match of one of its globs).

    Attributes:
        path: Relative to ``/workspace``; the glob itself when nothing
            matched it.
        bytes: Its size, when it was copied out.
        data: Its content, when it was copied out.
        error: Why it was not (no match, a symbolic link, too large...).
    """

    path: str
    bytes: Optional[int]
    data: Optional[builtins.bytes] = field(repr=False)
    error: Optional[str]

    @property
    def ok(self) -> bool:
        """Whether the file was copied out."""
        return self.error is None and self.data is not None


@dataclass(frozen=True)
class Layer:
    """One isolation layer of the attestation: what was in force."""

    layer: str
    in_force: bool
    detail: str


@dataclass(frozen=True)
class DenyEvent:
    """A request of the sandbox that the egress proxy refused (with 403).

    ``reason`` is runsbx's reason object; its ``"code"`` (also
    :attr:`code`) is one of ``not_allowed``, ``ip_literal``,
    ``address_class``, ``resolve_failed``, ``bad_request``,
    ``limit_reached``, ``request_not_allowed`` (then ``reason["rules"]``
    lists the method and path rules the request matched none of).
    ``path`` is the request's path and query when the proxy read it
    (plain HTTP), else ``""``.
    """

    time: str
    client: str
    method: str
    host: str
    port: int
    reason: Mapping[str, Any]
    message: str
    path: str = ""

    @property
    def code(self) -> str:
        """The reason's code, e.g. ``"not_allowed"``."""
        return str(self.reason.get("code", ""))


@dataclass(frozen=True)
class SyscallDenial:
    """A syscall the sandbox's seccomp filter refused (with EPERM), as
    often as ``count`` for this process name."""

    syscall: str
    process: str
    args: Tuple[int, ...]
    count: int


@dataclass(frozen=True)
class Seccomp:
    """The seccomp part of a result: what was refused (distinct
    syscall and process pairs, the first kept) and how many more were
    only counted."""

    denied: Tuple[SyscallDenial, ...]
    dropped: int


@dataclass(frozen=True)
class Hint:
    """A connect the sandbox's own network refused, explained.

    ``kind`` is ``"loopback_is_own"`` (nothing listens on that port inside
    the sandbox; the host's loopback is not its own), ``"no_route"`` (its
    only network is its loopback) or ``"no_dns"`` (either, to port 53).
    """

    kind: str
    destination: str
    protocol: str
    errno: str
    process: str
    count: int
    message: str


@dataclass(frozen=True)
class Hints:
    """The ``hints`` part of a result: refused connects (distinct
    destination and process, the first kept) and how many more were only
    counted."""

    connects: Tuple[Hint, ...]
    dropped: int


@dataclass(frozen=True)
class LearnedRequest:
    """A request the egress proxy let through in learn mode, as often as
    ``count``: ``method`` ``"CONNECT"`` and ``path`` ``None`` for a tunnel
    it could not read."""

    method: str
    host: str
    port: int
    path: Optional[str]
    tls: bool
    count: int


@dataclass(frozen=True)
class Learned:
    """What learn mode saw (``learn=True``), for ``runsbx profile
    suggest``: the requests (distinct, the first 1000) and how many more
    were only counted, with the resolver overrides and exempt addresses
    the call had."""

    requests: Tuple[LearnedRequest, ...]
    dropped: int
    resolve: Mapping[str, str]
    allow_addresses: Tuple[str, ...]


@dataclass(frozen=True)
class ProxyStats:
    """The egress proxy's counters for the call."""

    connections: int
    active: int
    denied: int
    upstream_errors: int
    bytes_up: int
    bytes_down: int


@dataclass(frozen=True)
class Egress:
    """The egress part of a result (a call with ``allow_hosts``)."""

    allow: Tuple[str, ...]
    proxy: str
    denied: Tuple[DenyEvent, ...]
    dropped_events: int
    stats: ProxyStats


@dataclass(frozen=True)
class ErrorInfo:
    """Why a call did not run its command (``"error"`` of the result).

    ``kind`` is one of ``bad_input``, ``not_found``, ``not_executable``,
    ``refused``, ``failure``.
    """

    kind: str
    message: str


@dataclass(frozen=True)
class Disk:
    """A session's disk: the size its files may take.

    Attributes:
        limit_bytes: The limit (``None`` if runsbx did not say).
        enforced: Whether runsbx enforces it; ``None`` if it did not say.
        reason: Why it is not enforced (e.g. rootless), when it is not.
    """

    limit_bytes: Optional[int]
    enforced: Optional[bool]
    reason: Optional[str]


@dataclass(frozen=True)
class CallSession:
    """The session a call ran in (``"session"`` of a result)."""

    name: str
    disk: Disk


@dataclass(frozen=True)
class SessionInfo:
    """A persistent session, schema ``runsbx.session/v1`` (``runsbx session
    create --json`` and ``runsbx session ls --json``).

    Attributes:
        name: Its name (``s-`` and 12 hex digits when runsbx chose it).
        image: The image its calls run on.
        created: When it was made (RFC 3339, UTC).
        disk: The size its files may take.
        memory_bytes, pids, timeout_ms: Its calls' defaults (a call may
            only lower them); ``None`` where the profile's apply.
        allow_hosts: The hosts its calls may reach (a call may only
            narrow them).
        proxy_resolve, proxy_allow_addresses: Its egress proxy's resolver
            overrides and exempt destinations.
        profile: The profile its calls run under (``None``: the default).
        in_use: Whether a call is running in it.
        raw: The object as runsbx printed it.
    """

    schema: str
    name: str
    image: Optional[str]
    created: Optional[str]
    disk: Disk
    memory_bytes: Optional[int]
    pids: Optional[int]
    timeout_ms: Optional[int]
    allow_hosts: Tuple[str, ...]
    proxy_resolve: Mapping[str, str]
    proxy_allow_addresses: Tuple[str, ...]
    profile: Optional[str]
    in_use: bool
    raw: Mapping[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class CallResult:
    """The result of one call, schema ``runsbx.call/v1`` (see runsbx's
    README, "Tool calls").

    Attributes:
        schema: ``"runsbx.call/v1"``.
        id: The call's id (``call-...``); ``None`` when refused before one
            was made.
        image: The image it ran on (``None`` with ``rootfs``).
        command: The command as run.
        status: ``"exited"``, ``"signaled"``, ``"timed_out"``,
            ``"interrupted"`` (runsbx was told to stop) or ``"error"``.
        exit_code: The command's exit code, 128 + N when signal N ended it;
            ``None`` on a timeout or an error.
        signal: The signal's name (``"SIGKILL"``) when one ended it.
        timed_out: Whether the deadline passed and the sandbox was killed.
        duration_ms: How long the call took, in milliseconds.
        limits: The limits it ran under, and whether they were hit.
        stdout: The command's stdout (empty when it did not run).
        stderr: The command's stderr (empty when it did not run).
        outputs: The files of ``outputs``, with their content.
        egress: The egress proxy's report; ``None`` without egress.
        seccomp: The syscalls the sandbox was refused; ``None`` when the
            call had no listener for them.
        hints: The connects the sandbox's network refused, each with the
            reason; ``None`` when the call had no listener for them.
        learned: With ``learn=True``, the requests the proxy let through;
            ``None`` otherwise.
        attestation: The isolation layers in force; ``None`` when the
            sandbox was not made.
        error: Why the command did not run; ``None`` when it did.
        session: The session it ran in; ``None`` for a call of its own.
        raw: The result as runsbx printed it (parsed JSON), including any
            field this client does not know.
    """

    schema: str
    id: Optional[str]
    image: Optional[str]
    command: Tuple[str, ...]
    status: str
    exit_code: Optional[int]
    signal: Optional[str]
    timed_out: bool
    duration_ms: float
    limits: Limits
    stdout: Stream
    stderr: Stream
    outputs: Tuple[OutputFile, ...]
    egress: Optional[Egress]
    attestation: Optional[Tuple[Layer, ...]]
    error: Optional[ErrorInfo]
    session: Optional[CallSession]
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    seccomp: Optional[Seccomp] = None
    hints: Optional[Hints] = None
    learned: Optional[Learned] = None

    @property
    def ok(self) -> bool:
        """Whether the command ran and exited with 0."""
        return self.status == "exited" and self.exit_code == 0

    @property
    def stdout_text(self) -> str:
        """The command's stdout as text (see :attr:`Stream.text`)."""
        return self.stdout.text

    @property
    def stderr_text(self) -> str:
        """The command's stderr as text (see :attr:`Stream.text`)."""
        return self.stderr.text

    @property
    def truncated(self) -> bool:
        """Whether stdout or stderr was cut to ``max_output``."""
        return self.stdout.truncated or self.stderr.truncated

    def output(self, path: str) -> builtins.bytes:
        """The content of output file ``path`` (relative to /workspace).

        Raises:
            KeyError: No such output, or it was not copied out (the message
                says why).
        """
        for o in self.outputs:
            if o.path == path:
                if o.data is None:
                    raise KeyError(f"output {path!r}: {o.error or 'not copied out'}")
                return o.data
        raise KeyError(f"output {path!r}: not among the outputs")

    def check(self) -> CallResult:
        """Returns this result if the command exited with 0.

        Raises:
            TimedOut: The deadline passed.
            NonZeroExit: The command exited with another code or was ended
                by a signal (or runsbx was interrupted).
        """
        if self.timed_out or self.status == "timed_out":
            ms = self.limits.timeout_ms
            after = f" after {ms} ms" if ms is not None else ""
            raise TimedOut(f"the call timed out{after}; the sandbox was killed", result=self)
        if not self.ok:
            if self.signal is not None:
                what = f"was ended by {self.signal} (status {self.status})"
            else:
                what = f"exited with {self.exit_code}"
            raise NonZeroExit(
                f"command {list(self.command)!r} {what}", result=self
            )
        return self


@dataclass(frozen=True)
class Chunk:
    """Output of the command as it arrived, from a stream.

    Attributes:
        stream: ``"stdout"`` or ``"stderr"``.
        data: The bytes.
        t_ms: When, in milliseconds since the command started.
    """

    stream: str
    data: bytes
    t_ms: float

    @property
    def text(self) -> str:
        """``data`` as text (runsbx never splits a UTF-8 character between
        chunks; undecodable bytes become U+FFFD)."""
        return self.data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Capped:
    """A stream reached its head's size (half of ``max_output``): nothing
    more of it is streamed; the result holds its tail.

    Attributes:
        stream: ``"stdout"`` or ``"stderr"``.
        kept_bytes: How many bytes of it were streamed.
        t_ms: When, in milliseconds since the command started.
    """

    stream: str
    kept_bytes: int
    t_ms: float


# -- parsing ---------------------------------------------------------------


def _bad(what: str, value: Any) -> ProtocolError:
    return ProtocolError(f"runsbx's result: {what} is {value!r}, not what runsbx.call/v1 says")


def _str(obj: Mapping[str, Any], key: str, default: str = "") -> str:
    v = obj.get(key)
    if v is None:
        return default
    if not isinstance(v, str):
        raise _bad(key, v)
    return v


def _opt_str(obj: Mapping[str, Any], key: str) -> Optional[str]:
    v = obj.get(key)
    if v is not None and not isinstance(v, str):
        raise _bad(key, v)
    return v


def _opt_int(obj: Mapping[str, Any], key: str) -> Optional[int]:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(key, v)
    return v


def _int(obj: Mapping[str, Any], key: str) -> int:
    v = _opt_int(obj, key)
    return 0 if v is None else v


def _float(obj: Mapping[str, Any], key: str) -> float:
    v = obj.get(key)
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _bad(key, v)
    return float(v)


def _opt_bool(obj: Mapping[str, Any], key: str) -> Optional[bool]:
    v = obj.get(key)
    if v is not None and not isinstance(v, bool):
        raise _bad(key, v)
    return v


def _bool(obj: Mapping[str, Any], key: str) -> bool:
    return bool(_opt_bool(obj, key))


def _obj(obj: Mapping[str, Any], key: str) -> Optional[Mapping[str, Any]]:
    v = obj.get(key)
    if v is not None and not isinstance(v, dict):
        raise _bad(key, v)
    return v


def _list(obj: Mapping[str, Any], key: str) -> Optional[List[Any]]:
    v = obj.get(key)
    if v is not None and not isinstance(v, list):
        raise _bad(key, v)
    return v


def _dicts(obj: Mapping[str, Any], key: str) -> Optional[Tuple[Mapping[str, Any], ...]]:
    items = _list(obj, key)
    if items is None:
        return None
    for item in items:
        if not isinstance(item, dict):
            raise _bad(key, item)
    return tuple(items)


def decode_data(data: str, encoding: str) -> bytes:
    """The bytes of a ``data``/``encoding`` pair of runsbx's JSON."""
    if encoding == "base64":
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ProtocolError(f"runsbx sent data that is not base64: {e}") from None
    if encoding in ("utf-8", "utf8", ""):
        return data.encode("utf-8", errors="surrogateescape")
    raise ProtocolError(f"runsbx sent data in an encoding this client does not know: {encoding!r}")


def parse_stream(obj: Optional[Mapping[str, Any]]) -> Stream:
    """A :class:`Stream` from runsbx's ``stdout``/``stderr`` object."""
    if obj is None:
        return Stream.empty()
    encoding = _str(obj, "encoding", "utf-8")
    data = decode_data(_str(obj, "data"), encoding)
    total = _opt_int(obj, "bytes")
    head = _opt_int(obj, "head_bytes")
    return Stream(
        data=data,
        encoding=encoding,
        bytes=len(data) if total is None else total,
        truncated=_bool(obj, "truncated"),
        omitted_bytes=_int(obj, "omitted_bytes"),
        head_bytes=len(data) if head is None else head,
    )


def _read_output(output_dir: Optional[str], rel: str) -> Tuple[Optional[bytes], Optional[str]]:
    """The content of output ``rel`` that runsbx copied into ``output_dir``;
    or why it cannot be read."""
    if output_dir is None:
        return None, "no output directory"
    base = os.path.realpath(output_dir)
    path = os.path.realpath(os.path.join(base, rel))
    if os.path.commonpath([base, path]) != base or path == base:
        return None, "the copy is outside the output directory: refused"
    try:
        with open(path, "rb") as f:
            return f.read(), None
    except OSError as e:
        return None, f"cannot read the copy runsbx made: {e}"


def parse_output(obj: Mapping[str, Any], output_dir: Optional[str]) -> OutputFile:
    """An :class:`OutputFile` from one of the result's ``outputs``, with its
    content read from ``output_dir`` (where runsbx copied it)."""
    path = _str(obj, "path")
    size = _opt_int(obj, "bytes")
    error = _opt_str(obj, "error")
    data: Optional[bytes] = None
    if error is None:
        data, error = _read_output(output_dir, path)
    return OutputFile(path=path, bytes=size, data=data, error=error)


def _parse_egress(obj: Optional[Mapping[str, Any]]) -> Optional[Egress]:
    if obj is None:
        return None
    stats = _obj(obj, "stats") or {}
    denied = tuple(
        DenyEvent(
            time=_str(d, "time"),
            client=_str(d, "client"),
            method=_str(d, "method"),
            host=_str(d, "host"),
            port=_int(d, "port"),
            reason=dict(_obj(d, "reason") or {}),
            message=_str(d, "message"),
            path=_opt_str(d, "path") or "",
        )
        for d in _dicts(obj, "denied") or ()
    )
    allow = _list(obj, "allow") or []
    return Egress(
        allow=tuple(str(a) for a in allow),
        proxy=_str(obj, "proxy"),
        denied=denied,
        dropped_events=_int(obj, "dropped_events"),
        stats=ProxyStats(
            connections=_int(stats, "connections"),
            active=_int(stats, "active"),
            denied=_int(stats, "denied"),
            upstream_errors=_int(stats, "upstream_errors"),
            bytes_up=_int(stats, "bytes_up"),
            bytes_down=_int(stats, "bytes_down"),
        ),
    )


def parse_result(obj: Any, output_dir: Optional[str] = None) -> CallResult:
    """A :class:`CallResult` from runsbx's JSON result (parsed).

    ``output_dir`` is the ``--output-dir`` of the call: the outputs' content
    is read from there.

    Raises:
        ProtocolError: ``obj`` is not a ``runsbx.call/v1`` result.
    """
    if not isinstance(obj, dict):
        raise ProtocolError(f"runsbx's result is not a JSON object: {obj!r:.200}")
    schema = _str(obj, "schema")
    # A later v1.x only adds fields; another major version is another schema.
    if schema != SCHEMA and not schema.startswith(SCHEMA + "."):
        raise ProtocolError(
            f"runsbx printed a result of schema {schema!r}; this client reads {SCHEMA!r}"
        )
    limits = _obj(obj, "limits") or {}
    error = _obj(obj, "error")
    layers = _dicts(obj, "attestation")
    command = _list(obj, "command") or []
    return CallResult(
        schema=schema,
        id=_opt_str(obj, "id"),
        image=_opt_str(obj, "image"),
        command=tuple(str(c) for c in command),
        status=_str(obj, "status", "error"),
        exit_code=_opt_int(obj, "exit_code"),
        signal=_opt_str(obj, "signal"),
        timed_out=_bool(obj, "timed_out"),
        duration_ms=_float(obj, "duration_ms"),
        limits=Limits(
            timeout_ms=_opt_int(limits, "timeout_ms"),
            memory_bytes=_opt_int(limits, "memory_bytes"),
            memory_hit=_opt_bool(limits, "memory_hit"),
            pids=_opt_int(limits, "pids"),
            pids_hit=_opt_bool(limits, "pids_hit"),
        ),
        stdout=parse_stream(_obj(obj, "stdout")),
        stderr=parse_stream(_obj(obj, "stderr")),
        outputs=tuple(parse_output(o, output_dir) for o in _dicts(obj, "outputs") or ()),
        egress=_parse_egress(_obj(obj, "egress")),
        attestation=None
        if layers is None
        else tuple(
            Layer(
                layer=_str(layer, "layer"),
                in_force=_bool(layer, "in_force"),
                detail=_str(layer, "detail"),
            )
            for layer in layers
        ),
        error=None
        if error is None
        else ErrorInfo(kind=_str(error, "kind"), message=_str(error, "message")),
        session=_parse_call_session(_obj(obj, "session")),
        raw=obj,
        seccomp=_parse_seccomp(_obj(obj, "seccomp")),
        hints=_parse_hints(_obj(obj, "hints")),
        learned=_parse_learned(_obj(obj, "learned")),
    )


def _parse_learned(obj: Optional[Mapping[str, Any]]) -> Optional[Learned]:
    if obj is None:
        return None
    resolve = _obj(obj, "resolve") or {}
    return Learned(
        requests=tuple(
            LearnedRequest(
                method=_str(r, "method"),
                host=_str(r, "host"),
                port=_int(r, "port"),
                path=_opt_str(r, "path"),
                tls=_bool(r, "tls"),
                count=_int(r, "count"),
            )
            for r in _dicts(obj, "requests") or ()
        ),
        dropped=_int(obj, "dropped"),
        resolve={str(k): str(v) for k, v in resolve.items()},
        allow_addresses=tuple(str(a) for a in (_list(obj, "allow_addresses") or [])),
    )


def _parse_hints(obj: Optional[Mapping[str, Any]]) -> Optional[Hints]:
    if obj is None:
        return None
    return Hints(
        connects=tuple(
            Hint(
                kind=_str(h, "kind"),
                destination=_str(h, "destination"),
                protocol=_str(h, "protocol"),
                errno=_str(h, "errno"),
                process=_str(h, "process"),
                count=_int(h, "count"),
                message=_str(h, "message"),
            )
            for h in _dicts(obj, "connects") or ()
        ),
        dropped=_int(obj, "dropped"),
    )


def _parse_seccomp(obj: Optional[Mapping[str, Any]]) -> Optional[Seccomp]:
    if obj is None:
        return None
    return Seccomp(
        denied=tuple(
            SyscallDenial(
                syscall=_str(d, "syscall"),
                process=_str(d, "process"),
                args=tuple(int(a) for a in (_list(d, "args") or [])),
                count=_int(d, "count"),
            )
            for d in _dicts(obj, "denied") or ()
        ),
        dropped=_int(obj, "dropped"),
    )


def _parse_disk(obj: Optional[Mapping[str, Any]]) -> Disk:
    obj = obj or {}
    return Disk(
        limit_bytes=_opt_int(obj, "limit_bytes"),
        enforced=_opt_bool(obj, "enforced"),
        reason=_opt_str(obj, "reason"),
    )


def _parse_call_session(obj: Optional[Mapping[str, Any]]) -> Optional[CallSession]:
    if obj is None:
        return None
    return CallSession(name=_str(obj, "name"), disk=_parse_disk(_obj(obj, "disk")))


def parse_session(obj: Any) -> SessionInfo:
    """A :class:`SessionInfo` from a ``runsbx.session/v1`` object (parsed).

    Raises:
        ProtocolError: ``obj`` is not one.
    """
    if not isinstance(obj, dict):
        raise ProtocolError(f"runsbx printed a session that is not a JSON object: {obj!r:.200}")
    schema = _str(obj, "schema")
    if schema != SESSION_SCHEMA and not schema.startswith(SESSION_SCHEMA + "."):
        raise ProtocolError(
            f"runsbx printed a session of schema {schema!r}; this client reads {SESSION_SCHEMA!r}"
        )
    name = _str(obj, "name")
    if not name:
        raise _bad("a session's name", obj.get("name"))
    hosts = _list(obj, "allow_hosts") or []
    resolve = _obj(obj, "proxy_resolve") or {}
    exempt = _list(obj, "proxy_allow_addresses") or []
    return SessionInfo(
        schema=schema,
        name=name,
        image=_opt_str(obj, "image"),
        created=_opt_str(obj, "created"),
        disk=_parse_disk(_obj(obj, "disk")),
        memory_bytes=_opt_int(obj, "memory_bytes"),
        pids=_opt_int(obj, "pids"),
        timeout_ms=_opt_int(obj, "timeout_ms"),
        allow_hosts=tuple(str(h) for h in hosts),
        proxy_resolve={str(k): str(v) for k, v in resolve.items()},
        proxy_allow_addresses=tuple(str(a) for a in exempt),
        profile=_opt_str(obj, "profile"),
        in_use=_bool(obj, "in_use"),
        raw=obj,
    )


def parse_event(obj: Mapping[str, Any]) -> Optional[Union[Chunk, Capped]]:
    """A :class:`Chunk` or :class:`Capped` from a line of ``--stream`` that
    has a ``"type"``; ``None`` for a type this client does not know."""
    kind = obj.get("type")
    if kind in ("stdout", "stderr"):
        return Chunk(
            stream=kind,
            data=decode_data(_str(obj, "data"), _str(obj, "encoding", "utf-8")),
            t_ms=_float(obj, "t_ms"),
        )
    if kind == "capped":
        return Capped(
            stream=_str(obj, "stream"),
            kept_bytes=_int(obj, "kept_bytes"),
            t_ms=_float(obj, "t_ms"),
        )
    return None
