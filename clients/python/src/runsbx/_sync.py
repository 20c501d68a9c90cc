"""The synchronous API: :func:`run` and :func:`stream`."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from types import TracebackType
from typing import IO, TYPE_CHECKING, Dict, Iterator, List, Mapping, Optional, Tuple, Type, TypeVar, Union

from . import _session
from ._binary import PathArg, not_runnable
from ._call import (
    SUBCOMMAND_TIMEOUT,
    TERM_GRACE,
    Command,
    FileContent,
    Invocation,
    Secret,
    Size,
    Stdin,
    StderrTail,
    StreamProtocol,
    Strings,
    Subcommand,
    _Pipe,
    session_create,
    session_list,
    session_remove,
)
from .errors import Failure, RunsbxError, SessionNotFound
from .result import CallResult, Capped, Chunk, SessionInfo

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._session import CallOptions

__all__ = ["run", "stream", "CallStream", "Session", "sessions"]

T = TypeVar("T")


def run(
    cmd: Command,
    *,
    image: Optional[str] = None,
    rootfs: Optional[PathArg] = None,
    timeout: Optional[float] = None,
    stdin: Stdin = None,
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
) -> CallResult:
    """Runs ``cmd`` in a fresh sandbox (``runsbx call``) and returns its
    result once it has ended.

    Args:
        cmd: The command and its arguments; a string is run with ``sh -c``.
        image: The image to run on (runsbx's default: ``python``).
        rootfs: A root filesystem directory to run on instead of an image.
        timeout: The deadline in seconds: the whole sandbox is killed when
            it passes (the result says ``timed_out``). ``None`` (the
            default): runsbx's, 30 s, or the operator profile's deadline
            when that is shorter.
        stdin: The command's stdin (a str is sent as UTF-8); ``None``: empty.
        env: Environment variables for the command (the image's
            environment, ``HOME=/tmp``, then these; never this process's).
        files: Files to put in the fresh ``/workspace``: path relative to
            it -> content (bytes or str, written as a file of mode 0644),
            or an :class:`os.PathLike` host path (a file or a directory) to
            copy in.
        outputs: Globs relative to ``/workspace`` (``*``, ``?``, ``**``) of
            files to copy out after the command; their content is in
            :attr:`CallResult.outputs` (symbolic links are refused).
        allow_hosts: Hosts the command may reach through runsbx's egress
            proxy (``NAME``, ``NAME:PORT``, ``*.SUFFIX``); none by default.
        allow: Requests the command may make, no others of those hosts
            (``"GET,HEAD example.org/docs/**"``: methods, host, path glob
            with ``*`` within a segment and ``**`` across); HTTPS to them
            is inspected with a CA of the sandbox's own.
        proxy_resolve: Names the proxy resolves to these IP addresses
            instead of asking DNS (``{"pypi.internal": "10.0.0.7"}``; needs
            ``allow_hosts``).
        proxy_allow_addresses: Destinations (``"IP:PORT"``) exempt from the
            proxy's refusal of loopback, private and link-local addresses:
            a service you run on purpose (needs ``allow_hosts``; opens
            nothing by itself).
        memory: A memory limit (bytes, or ``"256M"``), no higher than the
            profile's.
        pids: A process limit, no higher than the profile's.
        profile: A profile the operator made selectable (as strict or
            stricter).
        max_output: Bytes kept of each of stdout and stderr (bytes, or
            ``"1M"``): the first and the last halves (runsbx's default 1M,
            at most 64M).
        session: Run in this persistent session (see :class:`Session`):
            its /workspace and what the command writes outside /tmp
            persist between calls; its limits are the defaults.
        secrets: Credentials the command may use but never see: name ->
            :class:`Secret` (the host it goes to, and its value). The
            command gets ``RUNSBX_SECRET_<NAME>``, a sentinel the egress
            proxy replaces in requests to that host; the host must be
            allowed (``allow_hosts`` or ``allow``).
        learn: Learn mode: the result's :attr:`CallResult.learned` lists
            every request the egress proxy let through, for
            ``runsbx profile suggest``; it allows nothing more.
        binary: The runsbx binary (default: ``$RUNSBX_BIN``, else
            ``runsbx`` on ``PATH``).
        check: Raise :class:`~runsbx.TimedOut` on a timeout and
            :class:`~runsbx.NonZeroExit` when the command does not exit 0,
            instead of returning the result.

    Returns:
        The call's result; a command that exits non-zero, or (without
        ``check``) runs into its deadline, is a result too.

    Raises:
        CallError: The call could not run its command: :class:`BadInput`
            (:class:`ImageNotFound`), :class:`Refused`,
            :class:`CommandNotFound`, :class:`NotExecutable`,
            :class:`Failure`.
        TimedOut, NonZeroExit: With ``check``.
        BinaryNotFound: No runsbx binary.
        TypeError: An argument of the wrong type.
    """
    inv = Invocation(
        cmd,
        streaming=False,
        image=image,
        rootfs=rootfs,
        timeout=timeout,
        stdin=stdin,
        env=env,
        files=files,
        outputs=outputs,
        allow_hosts=allow_hosts,
        allow=allow,
        proxy_resolve=proxy_resolve,
        proxy_allow_addresses=proxy_allow_addresses,
        memory=memory,
        pids=pids,
        profile=profile,
        max_output=max_output,
        session=session,
        secrets=secrets,
        learn=learn,
        binary=binary,
        check=check,
    )
    return _run(inv)


def _run(inv: Invocation) -> CallResult:
    """Runs a prepared call to its end."""
    try:
        proc = _start(inv)
        try:
            out, err = proc.communicate(inv.input, timeout=inv.wall_timeout)
        except subprocess.TimeoutExpired:
            inv.overran = True
            out, err = _stop(proc)
        except BaseException:
            # KeyboardInterrupt and the like: runsbx kills the sandbox and
            # cleans up on SIGTERM.
            _stop(proc)
            raise
        return inv.finish(proc.returncode, _last_line(out), err)
    finally:
        inv.cleanup()


def stream(
    cmd: Command,
    *,
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
) -> CallStream:
    """Starts ``cmd`` in a fresh sandbox (``runsbx call --stream``) and
    returns an iterator over its output as it arrives.

    Takes the arguments of :func:`run`; ``stdin`` may also be
    :data:`runsbx.PIPE`: the command's stdin is then a pipe written with
    :meth:`CallStream.write_stdin` and closed with
    :meth:`CallStream.close_stdin`.

    The iterator yields :class:`Chunk` objects, stdout and stderr in the
    order they arrived, up to ``max_output / 2`` bytes of each stream (then
    :attr:`CallStream.capped` records it and the rest of that stream is
    only in the result's tail). At its end, :attr:`CallStream.result` is
    the call's result; an error (the call could not run, or ``check``)
    is raised by the iteration itself, where the result would be.

    Use it as a context manager: leaving the block before the end stops
    the call (the sandbox is killed and cleaned up)::

        with runsbx.stream(["python3", "train.py"]) as s:
            for chunk in s:
                print(chunk.text, end="")
        print(s.result.exit_code)
    """
    inv = Invocation(
        cmd,
        streaming=True,
        image=image,
        rootfs=rootfs,
        timeout=timeout,
        stdin=stdin,
        env=env,
        files=files,
        outputs=outputs,
        allow_hosts=allow_hosts,
        allow=allow,
        proxy_resolve=proxy_resolve,
        proxy_allow_addresses=proxy_allow_addresses,
        memory=memory,
        pids=pids,
        profile=profile,
        max_output=max_output,
        session=session,
        secrets=secrets,
        learn=learn,
        binary=binary,
        check=check,
    )
    return _stream(inv)


def _stream(inv: Invocation) -> CallStream:
    try:
        return CallStream(inv)
    except BaseException:
        inv.cleanup()
        raise


def _start(inv: Invocation) -> subprocess.Popen[bytes]:
    piped = inv.input is not None or inv.pipe_stdin
    try:
        return subprocess.Popen(
            inv.argv,
            stdin=subprocess.PIPE if piped else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            env=inv.child_env,
        )
    except OSError as e:
        raise not_runnable(inv.binary, e) from e


def _stop(proc: subprocess.Popen[bytes]) -> Tuple[bytes, bytes]:
    """Stops runsbx (SIGTERM: it kills the sandbox and cleans up, then
    prints its result; SIGKILL if it does not end in time) and returns what
    it printed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.communicate(timeout=TERM_GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()
    except (OSError, ValueError):
        # The pipes were already in use or closed: just reap it.
        proc.kill()
        proc.wait()
        return b"", b""


def _last_line(out: bytes) -> Optional[bytes]:
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1] if lines else None


class CallStream(Iterator[Chunk]):
    """A running call's output, chunk by chunk (see :func:`stream`).

    Iterating yields :class:`Chunk` objects; after the last,
    :attr:`result` is the call's result. A context manager: leaving the
    block (or :meth:`close`) before the end stops the call.
    """

    def __init__(self, inv: Invocation) -> None:
        self._inv = inv
        self._protocol = StreamProtocol()
        self._stderr = StderrTail()
        self._result: Optional[CallResult] = None
        self._error: Optional[BaseException] = None
        self._finished = False
        self._lock = threading.Lock()
        self._proc = _start(inv)
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._stdout: IO[bytes] = self._proc.stdout
        self._threads = [
            threading.Thread(target=self._drain_stderr, name="runsbx-stderr", daemon=True)
        ]
        if inv.input is not None:
            self._threads.append(
                threading.Thread(target=self._feed, args=(inv.input,), name="runsbx-stdin", daemon=True)
            )
        for t in self._threads:
            t.start()
        self._timer: Optional[threading.Timer] = None
        if inv.wall_timeout is not None:
            self._timer = threading.Timer(inv.wall_timeout, self._overrun)
            self._timer.daemon = True
            self._timer.start()

    # -- the iterator ------------------------------------------------------

    def __iter__(self) -> CallStream:
        return self

    def __next__(self) -> Chunk:
        if self._finished:
            raise StopIteration
        try:
            while True:
                line = self._stdout.readline()
                if not line:
                    break
                chunk = self._protocol.line(line)
                if chunk is not None:
                    return chunk
        except BaseException:
            self.close()
            raise
        self._end()
        raise StopIteration

    def _end(self) -> None:
        """The output is over: reaps runsbx and makes the result (or the
        error, raised here and kept for :attr:`result`)."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
        try:
            returncode = self._proc.wait()
            self._join()
            self._result = self._inv.finish(
                returncode, self._protocol.result_line, self._stderr.value()
            )
        except RunsbxError as e:
            self._error = e
            raise
        finally:
            self._inv.cleanup()

    # -- what it knows -----------------------------------------------------

    @property
    def result(self) -> CallResult:
        """The call's result, once the iteration has ended.

        Raises:
            RuntimeError: The call is still running.
            RunsbxError: The error the iteration raised.
        """
        if self._error is not None:
            raise self._error
        if self._result is None:
            if self._finished:
                raise RuntimeError("the stream was closed before the call printed its result")
            raise RuntimeError("the call is still running: iterate to the end first, or use wait()")
        return self._result

    @property
    def capped(self) -> Dict[str, Capped]:
        """The streams (``"stdout"``, ``"stderr"``) whose head is full, with
        how many bytes of each were streamed."""
        return dict(self._protocol.capped)

    @property
    def running(self) -> bool:
        """Whether runsbx (and so the call) is still running."""
        return self._proc.poll() is None

    @property
    def pid(self) -> int:
        """runsbx's process id."""
        return self._proc.pid

    def wait(self) -> CallResult:
        """Reads the rest of the output (dropping it) and returns the
        result (or raises as the iteration would)."""
        for _ in self:
            pass
        return self.result

    # -- stdin ---------------------------------------------------------------

    def write_stdin(self, data: Union[bytes, str]) -> None:
        """Writes to the command's stdin (``stdin=PIPE``).

        Raises:
            BrokenPipeError: The command does not read it any more.
        """
        if not self._inv.pipe_stdin or self._proc.stdin is None:
            raise RuntimeError("write_stdin() needs stream(..., stdin=runsbx.PIPE)")
        self._proc.stdin.write(data.encode("utf-8") if isinstance(data, str) else data)
        self._proc.stdin.flush()

    def close_stdin(self) -> None:
        """Closes the command's stdin (it reads end of file)."""
        if self._inv.pipe_stdin and self._proc.stdin is not None and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass

    # -- stopping ------------------------------------------------------------

    def close(self) -> None:
        """Stops the call if it is still running (runsbx kills the sandbox
        and cleans up; the result, if it printed one, says
        ``"interrupted"``). Never raises for the call's outcome."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
        try:
            self.close_stdin()
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGTERM)
            # runsbx may be blocked writing a line: read on while it ends.
            drain = threading.Thread(target=self._drain_stdout, daemon=True)
            drain.start()
            try:
                returncode = self._proc.wait(timeout=TERM_GRACE)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                returncode = self._proc.wait()
            drain.join(TERM_GRACE)
            self._join()
            try:
                self._inv.check = False
                self._result = self._inv.finish(
                    returncode, self._protocol.result_line, self._stderr.value()
                )
            except RunsbxError:
                pass
        finally:
            self._inv.cleanup()

    def __enter__(self) -> CallStream:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # Left without close(): at least stop the call (runsbx cleans up).
        proc = getattr(self, "_proc", None)
        if proc is not None and not getattr(self, "_finished", True) and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except OSError:
                pass

    # -- helpers ------------------------------------------------------------

    def _join(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for t in self._threads:
            t.join(TERM_GRACE)
        for pipe in (self._proc.stdout, self._proc.stderr, self._proc.stdin):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass

    def _overrun(self) -> None:
        if self._proc.poll() is None:
            self._inv.overran = True
            self._proc.send_signal(signal.SIGTERM)

    def _drain_stdout(self) -> None:
        try:
            for line in iter(self._stdout.readline, b""):
                try:
                    self._protocol.line(line)
                except RunsbxError:
                    pass
        except (OSError, ValueError):
            pass

    def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        try:
            fd = self._proc.stderr.fileno()
            while True:
                data = os.read(fd, 65536)
                if not data:
                    return
                self._stderr.add(data)
        except (OSError, ValueError):
            pass

    def _feed(self, data: bytes) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            stdin.write(data)
        except (BrokenPipeError, OSError, ValueError):
            pass
        finally:
            try:
                stdin.close()
            except OSError:
                pass


# -- sessions ------------------------------------------------------------------


def _run_subcommand(cmd: Subcommand[T]) -> T:
    """Runs a ``runsbx session`` command to its end."""
    try:
        proc = subprocess.run(
            cmd.argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=SUBCOMMAND_TIMEOUT,
            close_fds=True,
        )
    except subprocess.TimeoutExpired as e:
        raise Failure(
            f"runsbx {' '.join(cmd.argv[1:3])} did not end within {SUBCOMMAND_TIMEOUT:.0f} s and was stopped",
            stderr=(e.stderr or b"").decode("utf-8", errors="replace"),
        ) from None
    except OSError as e:
        raise not_runnable(cmd.binary, e) from e
    return cmd.finish(proc.returncode, proc.stdout, proc.stderr)


def sessions(*, binary: Optional[PathArg] = None) -> List[SessionInfo]:
    """The persistent sessions of this user (``runsbx session ls``)."""
    return _run_subcommand(session_list(binary))


class Session(_session.SessionCore):
    """A persistent session: each call is a fresh sandbox (new processes,
    network, ``/tmp``), but ``/workspace``, ``$HOME`` and whatever the
    commands install persist from one call to the next, until the session
    is closed. Calls into one session run one at a time (runsbx makes a
    second wait for the first).

    Creating it makes the session (``runsbx session create``); as a context
    manager, leaving the block removes it (``runsbx session rm``) unless
    ``keep=True``::

        with runsbx.Session(disk="2G", allow_hosts=["pypi.org", "files.pythonhosted.org"]) as s:
            s.write_file("data.csv", "a,b\n1,2\n")
            s.run(["python3", "-c", "open('sum.txt', 'w').write('3')"], check=True)
            print(s.read_file("sum.txt"))            # b"3"
            print(s.list_files())                    # ["data.csv", "sum.txt"]

    Args:
        name: Its name (``[A-Za-z0-9][A-Za-z0-9_.-]{0,63}``); runsbx
            chooses one (``s-`` and 12 hex digits) when ``None``.
        image: The image its calls run on (default ``python``).
        disk: How much its files may take (bytes, or ``"1G"``, runsbx's
            default; enforced as root, see ``info.disk``).
        memory, pids, timeout, allow_hosts, allow, proxy_resolve,
        proxy_allow_addresses, profile: Its calls' defaults, as for
            :func:`runsbx.run`; a call may only tighten them.
        binary: The runsbx binary.
        keep: Leave the session in place on :meth:`close` (reattach with
            :meth:`attach`).

    Raises:
        SessionExists: A session of that name exists (use :meth:`attach`).
        ImageNotFound, BadInput, Failure: runsbx could not make it.
    """

    def __init__(
        self,
        name: Optional[str] = None,
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
        keep: bool = False,
    ) -> None:
        cmd = session_create(
            name,
            image=image,
            disk=disk,
            memory=memory,
            pids=pids,
            timeout=timeout,
            allow_hosts=allow_hosts,
            allow=allow,
            proxy_resolve=proxy_resolve,
            proxy_allow_addresses=proxy_allow_addresses,
            profile=profile,
            binary=binary,
        )
        super().__init__(_run_subcommand(cmd), binary, keep)

    @classmethod
    def attach(cls, name: str, *, binary: Optional[PathArg] = None, keep: bool = True) -> Session:
        """A handle on the existing session ``name``. By default
        :meth:`close` leaves it in place (``keep=False`` removes it).

        Raises:
            SessionNotFound: There is none of that name.
        """
        for info in sessions(binary=binary):
            if info.name == name:
                session = cls.__new__(cls)
                _session.SessionCore.__init__(session, info, binary, keep)
                return session
        raise SessionNotFound(f"session {name!r} does not exist (runsbx session ls lists them)")

    def run(self, cmd: Command, **options: Unpack[CallOptions]) -> CallResult:
        """Runs ``cmd`` in a fresh sandbox of the session; the arguments,
        result and errors of :func:`runsbx.run` (``timeout`` defaults to
        the session's)."""
        return _run(Invocation(cmd, streaming=False, **self._call_args(options)))

    def stream(self, cmd: Command, **options: Unpack[CallOptions]) -> CallStream:
        """Starts ``cmd`` in a fresh sandbox of the session and streams its
        output; see :func:`runsbx.stream`."""
        return _stream(Invocation(cmd, streaming=True, **self._call_args(options)))

    def run_python(self, code: str, **options: Unpack[CallOptions]) -> CallResult:
        """Runs Python source ``code`` with the image's ``python3 -c`` (up
        to 128 KiB of it); otherwise as :meth:`run`."""
        return self.run(_session.python_command(code), **options)

    def _op(self, op: _session.FileOp[T]) -> T:
        return op.finish(_run(Invocation(op.cmd, streaming=False, **self._call_args(op.options))))

    def write_file(self, path: Union[str, os.PathLike[str]], data: Union[bytes, str]) -> None:
        """Writes ``data`` (a str as UTF-8) to ``path``, relative to
        /workspace or absolute below it; makes its parent directories and
        replaces a file that is there."""
        self._op(_session.write_file(path, data))

    def read_file(self, path: Union[str, os.PathLike[str]]) -> bytes:
        """The content of file ``path`` below /workspace (copied out of the
        sandbox with ``--output``, never through a symbolic link; at most
        64 MiB).

        Raises:
            FileNotFoundError: There is none.
            IsADirectoryError: It is a directory.
            Refused: It is a symbolic link.
            CallError: runsbx did not copy it (the message says why).
        """
        return self._op(_session.read_file(path))

    def list_files(self, path: Union[str, os.PathLike[str]] = ".") -> List[str]:
        """The names in directory ``path`` below /workspace (hidden ones
        too), sorted.

        Raises:
            FileNotFoundError: There is no such directory.
            NotADirectoryError: It is not a directory.
        """
        return self._op(_session.list_files(path))

    def close(self) -> None:
        """Removes the session (``runsbx session rm``), unless ``keep``;
        either way this handle makes no more calls. Closing twice does
        nothing.

        Raises:
            SessionInUse: A call is running in it (it stays; close again
                once the call has ended).
        """
        if self.closed:
            return
        if not self.keep:
            _run_subcommand(session_remove([self.name], self._binary))
        self.closed = True

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()
