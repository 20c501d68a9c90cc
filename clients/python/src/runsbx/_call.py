"""What the synchronous and the asyncio API share: the command line of one
call, the private directory of its files, the protocol of ``--stream`` and
how runsbx's output becomes a result or an exception."""

from __future__ import annotations

import json
import math
import os
import posixpath
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Dict,
    Generic,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Type,
    TypeVar,
    Union,
)

from ._binary import PathArg, find_binary
from .errors import (
    BadInput,
    CallError,
    Failure,
    ImageNotFound,
    ProtocolError,
    RunsbxError,
    SessionExists,
    SessionInUse,
    SessionNotFound,
    error_class,
)
from .result import Capped, CallResult, Chunk, SessionInfo, parse_event, parse_result, parse_session

T = TypeVar("T")


class _Pipe:
    """The type of :data:`PIPE`."""

    _instance: Optional[_Pipe] = None

    def __new__(cls) -> _Pipe:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "runsbx.PIPE"

    def __reduce__(self) -> str:
        return "PIPE"


#: ``stdin=PIPE`` for a stream: the command's stdin is a pipe the caller
#: writes to with ``write_stdin()`` and closes with ``close_stdin()``.
PIPE = _Pipe()

Command = Union[str, Sequence[str]]
Strings = Union[str, Iterable[str]]
Stdin = Union[bytes, str, None]
FileContent = Union[bytes, str, "os.PathLike[str]"]
Size = Union[int, str]

#: How long runsbx may run past the call's deadline (making the sandbox,
#: copying outputs) before the client stops it.
OVERRUN_GRACE = 60.0
#: The longest deadline runsbx takes: a week.
MAX_TIMEOUT = 7 * 24 * 3600.0
#: How long runsbx gets to clean up after SIGTERM before SIGKILL (its
#: watchdog then cleans up).
TERM_GRACE = 15.0
#: How much of runsbx's own stderr (its diagnostics) is kept.
STDERR_KEEP = 64 * 1024
#: How long a ``runsbx session`` command (create, ls, rm) may run before
#: the client stops it.
SUBCOMMAND_TIMEOUT = 300.0


def _no_nul(what: str, value: str) -> str:
    if "\0" in value:
        raise BadInput(f"{what} {value!r}: holds a NUL character, which no command line can carry")
    return value


def _strings(what: str, value: Union[str, Iterable[str], None]) -> List[str]:
    """A list of strings from one string or an iterable of them."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be a string or a sequence of strings, not {type(value).__name__}")
    out = []
    for v in value:
        if not isinstance(v, str):
            raise TypeError(f"{what} must hold strings, not {type(v).__name__}: {v!r}")
        out.append(v)
    return out


#: Where a call's files are put and read.
WORKSPACE = "/workspace"


def workspace_path(what: str, path: Union[str, "os.PathLike[str]"]) -> str:
    """``path`` relative to /workspace (it may be relative to it already,
    or absolute below it), normalised; ``.`` for /workspace itself.

    Raises:
        BadInput: It is not below /workspace.
    """
    p = os.fspath(path)
    if not isinstance(p, str):
        raise TypeError(f"{what}: the path must be a str, not {type(p).__name__}")
    if "\0" in p:
        raise BadInput(f"{what} {p!r}: holds a NUL character")
    if posixpath.isabs(p):
        rel = posixpath.relpath(posixpath.normpath(p), WORKSPACE)
    else:
        rel = posixpath.normpath(p)
    if rel == ".." or rel.startswith("../"):
        raise BadInput(
            f"{what} {p!r}: a call's files are below {WORKSPACE}; "
            "give a path relative to it, or absolute below it"
        )
    return rel


def _size(what: str, value: Optional[Size]) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{what} must be bytes (an int) or a size such as '256M', not {value!r}")
    return str(value)


def _duration(timeout: Optional[float]) -> Optional[str]:
    """``--timeout`` for a timeout in seconds (runsbx checks it)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, not {timeout!r}")
    # runsbx refuses these too, but would name its own --timeout and the
    # milliseconds the client made of them; a deadline past a week would
    # also overflow the client's own wait for runsbx.
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT):
        raise BadInput(
            f"timeout {timeout!r}: give a positive number of seconds, at most a week "
            f"({MAX_TIMEOUT:.0f})"
        )
    return f"{float(timeout) * 1000.0:.3f}ms"


def _str(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}: {value!r}")
    return value


def _sandbox_options(
    *,
    image: Optional[str],
    timeout: Optional[float],
    memory: Optional[Size],
    pids: Optional[int],
    profile: Optional[str],
    allow_hosts: Optional[Strings],
    allow: Optional[Strings],
    proxy_resolve: Optional[Mapping[str, str]],
    proxy_allow_addresses: Optional[Strings],
) -> List[str]:
    """The options that ``runsbx call`` and ``runsbx session create`` share:
    the image, the limits, the profile and egress."""
    opts: List[str] = []
    if image is not None:
        opts.append(f"--image={_no_nul('image', _str('image', image))}")
    duration = _duration(timeout)
    if duration is not None:
        opts.append(f"--timeout={duration}")
    if profile is not None:
        opts.append(f"--profile={_no_nul('profile', _str('profile', profile))}")
    limit = _size("memory", memory)
    if limit is not None:
        opts.append(f"--memory={_no_nul('memory', limit)}")
    if pids is not None:
        if isinstance(pids, bool) or not isinstance(pids, int):
            raise TypeError(f"pids must be an int, not {pids!r}")
        opts.append(f"--pids={pids}")
    for host in _strings("allow_hosts", allow_hosts):
        opts.append(f"--allow-host={_no_nul('allow_hosts', host)}")
    for rule in _strings("allow", allow):
        opts.append(f"--allow={_no_nul('allow', rule)}")
    if proxy_resolve is not None and not isinstance(proxy_resolve, Mapping):
        raise TypeError(f"proxy_resolve must map a name to an IP address, not {proxy_resolve!r}")
    for name, ip in (proxy_resolve or {}).items():
        if not isinstance(name, str) or not isinstance(ip, str):
            raise TypeError(f"proxy_resolve must map str to str, not {name!r}: {ip!r}")
        if "=" in name:
            # runsbx splits NAME=IP at the first '='.
            raise BadInput(f"proxy_resolve name {name!r}: a host name holds no '='")
        opts.append(f"--proxy-resolve={_no_nul('proxy_resolve', name)}={_no_nul('proxy_resolve', ip)}")
    for address in _strings("proxy_allow_addresses", proxy_allow_addresses):
        opts.append(f"--proxy-allow-address={_no_nul('proxy_allow_addresses', address)}")
    return opts


@dataclass(frozen=True)
class Secret:
    """A credential the command may use but never see (``secrets``).

    The command gets ``RUNSBX_SECRET_<NAME>``, a sentinel; runsbx's egress
    proxy puts the value in place of it in ``header`` (default
    ``Authorization``) of the requests to ``host`` it can read (plain
    HTTP, or HTTPS it inspects), and refuses it sent anywhere else. The
    value never enters the sandbox, its output or the result.

    Give the value in exactly one way: ``value`` (passed to runsbx in its
    own environment, never the sandbox's), ``file`` (a file others cannot
    read) or ``env`` (a variable of this process's environment).
    """

    host: str
    # Never in a repr, a log line or a traceback.
    value: Optional[str] = field(default=None, repr=False)
    file: Optional[PathArg] = None
    env: Optional[str] = None
    header: Optional[str] = None


#: The variable a ``Secret(value=...)`` reaches runsbx in (its own
#: environment), followed by the secret's name.
SECRET_ENV_PREFIX = "RUNSBX_CLIENT_SECRET_"


def _secret_option(name: object, secret: object, child_env: Dict[str, str]) -> str:
    """The ``--secret`` option of one secret; a ``value`` goes into
    ``child_env``."""
    if not isinstance(name, str):
        raise TypeError(f"secrets must be keyed by a name (str), not {name!r}")
    if not isinstance(secret, Secret):
        raise TypeError(f"secrets[{name!r}] must be a runsbx.Secret, not {type(secret).__name__}")
    if not name or "=" in name or "," in name:
        raise BadInput(f"secrets name {name!r}: use upper-case letters, digits and _")
    given = [k for k in ("value", "file", "env") if getattr(secret, k) is not None]
    if len(given) != 1:
        raise TypeError(f"secrets[{name!r}]: give exactly one of value, file or env, not {given}")
    if given == ["value"]:
        value = secret.value
        if not isinstance(value, str):
            # The message never holds the value.
            raise TypeError(f"secrets[{name!r}].value must be a str, not {type(value).__name__}")
        if not value or "\0" in value:
            raise BadInput(f"secrets[{name!r}]: the value is empty or holds NUL")
        var = SECRET_ENV_PREFIX + name
        child_env[var] = value
        source = f"env:{var}"
    elif given == ["file"]:
        path = os.fspath(secret.file)  # type: ignore[arg-type]
        if not isinstance(path, str):
            raise TypeError(f"secrets[{name!r}].file must be a str path, not bytes")
        source = f"file:{path}"
    else:
        source = f"env:{_str(f'secrets[{name!r}].env', secret.env)}"
    parts = [f"{name}={source}", f"host={_str(f'secrets[{name!r}].host', secret.host)}"]
    if secret.header is not None:
        parts.append(f"header={_str(f'secrets[{name!r}].header', secret.header)}")
    for part in parts:
        # runsbx splits the option at each ','.
        if "," in part:
            raise BadInput(f"secrets[{name!r}]: {part!r} holds ',', which --secret cannot carry")
        _no_nul("secrets", part)
    return "--secret=" + ",".join(parts)


class Invocation:
    """One call, prepared: its command line, its stdin, its private
    directory (``files`` in, ``outputs`` out). :meth:`finish` turns what
    runsbx printed into a result or an exception; :meth:`cleanup` removes
    the directory."""

    def __init__(
        self,
        cmd: Command,
        *,
        streaming: bool,
        image: Optional[str] = None,
        rootfs: Optional[PathArg] = None,
        timeout: Optional[float] = None,
        stdin: Union[Stdin, _Pipe] = None,
        env: Optional[Mapping[str, str]] = None,
        files: Optional[Mapping[str, FileContent]] = None,
        outputs: Optional[Strings] = None,
        allow_hosts: Optional[Strings] = None,
        allow: Optional[Strings] = None,
        proxy_resolve: Optional[Mapping[str, str]] = None,
        proxy_allow_addresses: Optional[Strings] = None,
        memory: Optional[Size] = None,
        pids: Optional[int] = None,
        profile: Optional[str] = None,
        max_output: Optional[Size] = None,
        session: Optional[str] = None,
        secrets: Optional[Mapping[str, Secret]] = None,
        learn: bool = False,
        binary: Optional[PathArg] = None,
        check: bool = False,
    ) -> None:
        self.check = check
        #: runsbx's environment, when a secret's value travels in it
        #: (``None``: this process's, unchanged).
        self.child_env: Optional[Dict[str, str]] = None
        self.tmpdir: Optional[str] = None
        self.output_dir: Optional[str] = None
        self.overran = False

        # Everything is checked before anything is made.
        if isinstance(cmd, str):
            command = ["sh", "-c", cmd]
        else:
            command = _strings("cmd", cmd)
        if not command:
            raise BadInput("cmd is empty: give the command to run and its arguments")
        for arg in command:
            _no_nul("cmd", arg)

        self.pipe_stdin = isinstance(stdin, _Pipe)
        if self.pipe_stdin and not streaming:
            raise TypeError("stdin=PIPE is for stream(); give run() the bytes or str to send")
        self.input: Optional[bytes]
        if stdin is None or isinstance(stdin, _Pipe):
            self.input = None
        elif isinstance(stdin, str):
            self.input = stdin.encode("utf-8")
        elif isinstance(stdin, (bytes, bytearray, memoryview)):
            self.input = bytes(stdin)
        else:
            raise TypeError(f"stdin must be bytes, str or None, not {type(stdin).__name__}")

        opts = _sandbox_options(
            image=image,
            timeout=timeout,
            memory=memory,
            pids=pids,
            profile=profile,
            allow_hosts=allow_hosts,
            allow=allow,
            proxy_resolve=proxy_resolve,
            proxy_allow_addresses=proxy_allow_addresses,
        )
        if session is not None:
            opts.append(f"--session={_no_nul('session', _str('session', session))}")
        if secrets is not None and not isinstance(secrets, Mapping):
            raise TypeError(f"secrets must map a name to a runsbx.Secret, not {secrets!r}")
        child_env: Dict[str, str] = {}
        for name, secret in (secrets or {}).items():
            opts.append(_secret_option(name, secret, child_env))
        if child_env:
            self.child_env = {**os.environ, **child_env}
        if not isinstance(learn, bool):
            raise TypeError(f"learn must be a bool, not {learn!r}")
        if learn:
            opts.append("--learn")
        if rootfs is not None:
            opts.append(f"--rootfs={_no_nul('rootfs', os.fspath(rootfs))}")
        max_kept = _size("max_output", max_output)
        if max_kept is not None:
            opts.append(f"--max-output={_no_nul('max-output', max_kept)}")
        if self.input is not None or self.pipe_stdin:
            opts.append("--stdin=-")
        for key, value in (env or {}).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError(f"env must map str to str, not {key!r}: {value!r}")
            if "=" in key:
                # runsbx would split KEY=VALUE at the first '=', and set
                # another variable than the caller asked for.
                raise BadInput(f"env key {key!r}: use a KEY of letters, digits and _ (no '=')")
            opts.append(f"--env={_no_nul('env', key)}={_no_nul('env', value)}")
        globs = _strings("outputs", outputs)
        for glob in globs:
            opts.append(f"--output={_no_nul('outputs', glob)}")

        inputs: Dict[str, FileContent] = {}
        for dest, content in (files or {}).items():
            if not isinstance(dest, str):
                raise TypeError(f"files must be keyed by a path (str), not {dest!r}")
            # Checked here so that a refusal names the key, not the
            # --input the client makes of it.
            rel = workspace_path("files key", dest)
            if rel == ".":
                raise BadInput(f"files key {dest!r}: names {WORKSPACE} itself; give a file's path")
            if isinstance(content, os.PathLike):
                host = os.fspath(content)
                if not isinstance(host, str):
                    raise TypeError(f"files[{dest!r}]: a host path must be a str path, not bytes")
                if ":" in host:
                    raise BadInput(
                        f"files[{dest!r}]: the host path {host!r} holds ':', "
                        "which runsbx's --input HOST:SANDBOX cannot carry"
                    )
                _no_nul("files", host)
            elif not isinstance(content, (bytes, bytearray, memoryview, str)):
                raise TypeError(
                    f"files[{dest!r}] must be bytes, str or a host path (os.PathLike), "
                    f"not {type(content).__name__}"
                )
            inputs[rel] = content

        self.binary = find_binary(binary)
        self.wall_timeout: Optional[float] = None
        if session is not None:
            # runsbx serialises the calls into a session: this one may
            # first wait for another for as long as that one runs, so no
            # deadline of the client's can tell a hung runsbx from a
            # patient one. runsbx's own deadline and watchdog end the call.
            pass
        elif isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0:
            self.wall_timeout = float(timeout) + OVERRUN_GRACE
        elif timeout is None:
            self.wall_timeout = 30.0 + OVERRUN_GRACE

        if inputs or globs:
            self.tmpdir = tempfile.mkdtemp(prefix="runsbx-call-")
        try:
            if inputs:
                opts.extend(self._write_inputs(inputs))
            if globs:
                assert self.tmpdir is not None
                self.output_dir = os.path.join(self.tmpdir, "outputs")
                os.mkdir(self.output_dir, 0o700)
                opts.append(f"--output-dir={self.output_dir}")
        except BaseException:
            self.cleanup()
            raise
        mode = "--stream" if streaming else "--json"
        self.argv: List[str] = [self.binary, "call", mode, *opts, "--", *command]

    def _write_inputs(self, inputs: Mapping[str, FileContent]) -> List[str]:
        """Writes the contents of ``files`` into the private directory (a
        file per entry, named by its index: no host path to escape) and
        returns their ``--input`` options."""
        assert self.tmpdir is not None
        if ":" in self.tmpdir:
            raise BadInput(
                f"the temporary directory {self.tmpdir!r} holds ':', which runsbx's "
                "--input HOST:SANDBOX cannot carry; set TMPDIR to another directory"
            )
        indir = os.path.join(self.tmpdir, "inputs")
        os.mkdir(indir, 0o700)
        opts = []
        for i, (dest, content) in enumerate(inputs.items()):
            if isinstance(content, os.PathLike):
                host = os.fspath(content)
            else:
                host = os.path.join(indir, str(i))
                data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
                fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            opts.append(f"--input={host}:{dest}")
        return opts

    def cleanup(self) -> None:
        """Removes the call's private directory (inputs and outputs)."""
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def finish(self, returncode: int, result_line: Optional[bytes], stderr: bytes) -> CallResult:
        """The result of the call from runsbx's exit code, the JSON result
        it printed (``None`` if it printed none) and its stderr.

        Raises:
            CallError: The call did not run its command (by error kind).
            TimedOut, NonZeroExit: With ``check``, see
                :meth:`CallResult.check`.
            ProtocolError: runsbx printed no result this client can read.
        """
        err = stderr.decode("utf-8", errors="replace")
        if result_line is None or not result_line.strip():
            raise self._no_result(returncode, err)
        try:
            obj = json.loads(result_line)
        except ValueError as e:
            raise ProtocolError(
                f"runsbx (exit code {returncode}) printed a result that is not JSON ({e}): "
                f"{result_line[:200]!r}",
                returncode=returncode,
                stderr=err,
            ) from None
        return self.finish_parsed(returncode, obj, stderr)

    def finish_parsed(self, returncode: int, obj: Any, stderr: bytes) -> CallResult:
        """As :meth:`finish`, from the result already parsed from JSON (a
        pool's reply carries it)."""
        err = stderr.decode("utf-8", errors="replace")
        if obj is None:
            raise self._no_result(returncode, err)
        try:
            result = parse_result(obj, self.output_dir)
        except RunsbxError as e:
            e.returncode, e.stderr = returncode, err
            raise
        if self.overran:
            raise Failure(
                f"runsbx did not end within {OVERRUN_GRACE:.0f} s after the call's deadline "
                "and was stopped",
                result=result,
                returncode=returncode,
                stderr=err,
            )
        if result.status == "error":
            message = result.error.message if result.error else "the call failed"
            kind = result.error.kind if result.error else None
            cls = error_class(kind, message, returncode)
            raise cls(message, result=result, returncode=returncode, stderr=err)
        if self.check:
            result.check()
        return result

    def _no_result(self, returncode: int, stderr: str) -> RunsbxError:
        """The error when runsbx printed no result."""
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        said = lines[0] if lines else ""
        if said.startswith("error: "):
            said = said[len("error: ") :]
        if self.overran:
            return Failure(
                f"runsbx did not end within {OVERRUN_GRACE:.0f} s after the call's deadline "
                "and was stopped",
                returncode=returncode,
                stderr=stderr,
            )
        if returncode < 0:
            try:
                name = signal.Signals(-returncode).name
            except ValueError:
                name = f"signal {-returncode}"
            return Failure(
                f"runsbx was killed by {name} before it printed a result",
                returncode=returncode,
                stderr=stderr,
            )
        cls = error_class(None, said, returncode)
        if cls is CallError:
            return ProtocolError(
                f"runsbx exited with {returncode} without printing a result"
                + (f": {said}" if said else ""),
                returncode=returncode,
                stderr=stderr,
            )
        return cls(said or f"runsbx exited with {returncode}", returncode=returncode, stderr=stderr)


class StreamProtocol:
    """The lines of ``runsbx call --stream``: chunks, ``capped`` events and,
    last, the result (the one line without a ``"type"``)."""

    def __init__(self) -> None:
        self.capped: Dict[str, Capped] = {}
        self.result_line: Optional[bytes] = None

    def line(self, line: bytes) -> Optional[Chunk]:
        """The chunk a line carries, if any (a ``capped`` event is recorded
        in :attr:`capped`, the result in :attr:`result_line`)."""
        line = line.strip()
        if not line:
            return None
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise ProtocolError(f"runsbx --stream printed a line that is not JSON ({e}): {line[:200]!r}") from None
        if not isinstance(obj, dict):
            raise ProtocolError(f"runsbx --stream printed a line that is not an object: {line[:200]!r}")
        if "type" not in obj:
            self.result_line = line
            return None
        event = parse_event(obj)
        if isinstance(event, Capped):
            self.capped[event.stream] = event
            return None
        return event


class StderrTail:
    """The last :data:`STDERR_KEEP` bytes of runsbx's own stderr."""

    def __init__(self) -> None:
        self.data = bytearray()

    def add(self, data: bytes) -> None:
        self.data += data
        if len(self.data) > STDERR_KEEP:
            del self.data[: len(self.data) - STDERR_KEEP]

    def value(self) -> bytes:
        return bytes(self.data)


def _said(stderr: str) -> str:
    """The message of runsbx's stderr: its ``runsbx: error:`` line (the
    whole chain of causes), else its first line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        for prefix in ("runsbx: error: ", "error: "):
            if line.startswith(prefix):
                return line[len(prefix) :]
    return lines[0] if lines else ""


class Subcommand(Generic[T]):
    """One short runsbx command (``runsbx session create|ls|rm``): its
    command line, and what its exit code and output mean. The sync and the
    asyncio API run :attr:`argv` and hand what it printed to
    :meth:`finish`."""

    def __init__(
        self,
        argv: List[str],
        parse: Callable[[bytes], T],
        errors: Mapping[int, Type[CallError]],
    ) -> None:
        self.argv = argv
        self.binary = argv[0]
        self._parse = parse
        self._errors = errors

    def finish(self, returncode: int, stdout: bytes, stderr: bytes) -> T:
        """The command's value, or its error.

        Raises:
            CallError: By runsbx's exit code (see :mod:`runsbx.errors`).
            ProtocolError: runsbx printed nothing this client can read.
        """
        err = stderr.decode("utf-8", errors="replace")
        if returncode == 0:
            try:
                return self._parse(stdout)
            except RunsbxError as e:
                e.returncode, e.stderr = returncode, err
                raise
        said = _said(err)
        what = " ".join(self.argv[1:3])
        if returncode < 0:
            try:
                name = signal.Signals(-returncode).name
            except ValueError:
                name = f"signal {-returncode}"
            raise Failure(f"runsbx {what} was killed by {name}", returncode=returncode, stderr=err)
        cls = self._errors.get(returncode)
        if cls is None:
            raise ProtocolError(
                f"runsbx {what} exited with {returncode}, which it does not document"
                + (f": {said}" if said else ""),
                returncode=returncode,
                stderr=err,
            )
        raise cls(said or f"runsbx {what} exited with {returncode}", returncode=returncode, stderr=err)


# The exit codes of `runsbx session` (see runsbx's README, "Exit codes").
_SESSION_ERRORS: Dict[int, Type[CallError]] = {1: Failure, 2: BadInput, 3: BadInput}


def _json(stdout: bytes) -> object:
    try:
        return json.loads(stdout)
    except ValueError as e:
        raise ProtocolError(f"runsbx printed output that is not JSON ({e}): {stdout[:200]!r}") from None


def session_create(
    name: Optional[str],
    *,
    image: Optional[str] = None,
    disk: Optional[Size] = None,
    memory: Optional[Size] = None,
    pids: Optional[int] = None,
    timeout: Optional[float] = None,
    allow_hosts: Optional[Strings] = None,
    allow: Optional[Strings] = None,
    proxy_resolve: Optional[Mapping[str, str]] = None,
    proxy_allow_addresses: Optional[Strings] = None,
    profile: Optional[str] = None,
    binary: Optional[PathArg] = None,
) -> Subcommand[SessionInfo]:
    """``runsbx session create --json [NAME]`` with these options."""
    opts = _sandbox_options(
        image=image,
        timeout=timeout,
        memory=memory,
        pids=pids,
        profile=profile,
        allow_hosts=allow_hosts,
        allow=allow,
        proxy_resolve=proxy_resolve,
        proxy_allow_addresses=proxy_allow_addresses,
    )
    size = _size("disk", disk)
    if size is not None:
        opts.append(f"--disk={_no_nul('disk', size)}")
    # `--` ends the options: a name can never be read as one.
    names = [] if name is None else ["--", _no_nul("name", _str("name", name))]
    argv = [find_binary(binary), "session", "create", "--json", *opts, *names]
    errors = {**_SESSION_ERRORS, 4: ImageNotFound, 5: SessionExists}
    return Subcommand(argv, lambda out: parse_session(_json(out)), errors)


def _sessions(out: bytes) -> List[SessionInfo]:
    obj = _json(out)
    if not isinstance(obj, list):
        raise ProtocolError(f"runsbx session ls --json printed {obj!r:.200}, not a JSON array")
    return [parse_session(o) for o in obj]


def session_list(binary: Optional[PathArg] = None) -> Subcommand[List[SessionInfo]]:
    """``runsbx session ls --json``."""
    return Subcommand([find_binary(binary), "session", "ls", "--json"], _sessions, _SESSION_ERRORS)


def session_remove(names: Sequence[str], binary: Optional[PathArg] = None) -> Subcommand[None]:
    """``runsbx session rm NAME...``."""
    checked = [_no_nul("name", _str("name", n)) for n in names]
    if not checked:
        raise BadInput("session rm: name at least one session")
    argv = [find_binary(binary), "session", "rm", "--", *checked]
    errors = {**_SESSION_ERRORS, 4: SessionNotFound, 5: SessionInUse}
    return Subcommand(argv, lambda out: None, errors)


__all__ = [
    "PIPE",
    "Invocation",
    "StreamProtocol",
    "StderrTail",
    "Subcommand",
    "session_create",
    "session_list",
    "session_remove",
]
