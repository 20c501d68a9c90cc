"""The asyncio API: :func:`run` and :func:`stream`, with asyncio
subprocesses; the same arguments, results and errors as
:func:`runsbx.run` and :func:`runsbx.stream`.

::

    import runsbx.aio

    result = await runsbx.aio.run(["python3", "-c", "print(6*7)"])

    async with runsbx.aio.stream(["sh", "-c", "make test"]) as s:
        async for chunk in s:
            print(chunk.text, end="")
    print(s.result.exit_code)

Cancelling a task that awaits a call stops the call (runsbx kills the
sandbox and cleans up) before the cancellation goes on.

:class:`Session` is :class:`runsbx.Session` with coroutines::

    async with runsbx.aio.Session() as s:
        await s.write_file("x.txt", "1")
        r = await s.run_python("print(open('x.txt').read())")
"""

from __future__ import annotations

import asyncio
import os
import signal
from types import TracebackType
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Type, TypeVar, Union

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

__all__ = ["run", "stream", "AsyncCallStream", "Session", "sessions"]

T = TypeVar("T")

_READ = 64 * 1024


async def run(
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
    """Runs ``cmd`` in a fresh sandbox and returns its result; see
    :func:`runsbx.run` for the arguments, the result and the errors."""
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
    return await _run(inv)


async def _run(inv: Invocation) -> CallResult:
    """Runs a prepared call to its end."""
    try:
        proc = await _start(inv)
        assert proc.stdout is not None and proc.stderr is not None
        stderr = StderrTail()
        tasks: List[asyncio.Future[object]] = [
            asyncio.ensure_future(proc.stdout.read()),
            asyncio.ensure_future(_drain(proc.stderr, stderr)),
        ]
        if inv.input is not None:
            tasks.append(asyncio.ensure_future(_feed(proc.stdin, inv.input)))
        try:
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), inv.wall_timeout)
            except asyncio.TimeoutError:
                inv.overran = True
                await _stop(proc)
            out = await tasks[0]
            await asyncio.gather(*tasks[1:])
        except BaseException:
            # Cancelled (or interrupted): stop the call before going on.
            await asyncio.shield(_stop(proc))
            await _cancel(tasks)
            raise
        assert isinstance(out, bytes) and proc.returncode is not None
        lines = [line for line in out.splitlines() if line.strip()]
        return inv.finish(proc.returncode, lines[-1] if lines else None, stderr.value())
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
) -> AsyncCallStream:
    """A call whose output is read as it arrives: an async iterator of
    :class:`~runsbx.Chunk` and an async context manager; see
    :func:`runsbx.stream`. The call starts at ``async with`` or at the first
    ``async for`` step; leaving the ``async with`` block early stops it::

        async with runsbx.aio.stream(cmd, stdin=runsbx.PIPE) as s:
            async for chunk in s:
                ...
        result = s.result
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
    return AsyncCallStream(inv)


async def _start(inv: Invocation) -> asyncio.subprocess.Process:
    piped = inv.input is not None or inv.pipe_stdin
    try:
        return await asyncio.create_subprocess_exec(
            *inv.argv,
            stdin=asyncio.subprocess.PIPE if piped else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            close_fds=True,
            env=inv.child_env,
        )
    except OSError as e:
        inv.cleanup()
        raise not_runnable(inv.binary, e) from e


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM (runsbx kills the sandbox and cleans up), then SIGKILL if it
    does not end in time. The caller keeps reading its output."""
    if proc.returncode is None:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), TERM_GRACE)
    except asyncio.TimeoutError:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
        await proc.wait()


async def _cancel(tasks: Sequence[asyncio.Future[Any]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _drain(reader: asyncio.StreamReader, tail: StderrTail) -> None:
    while True:
        data = await reader.read(_READ)
        if not data:
            return
        tail.add(data)


async def _feed(writer: Optional[asyncio.StreamWriter], data: bytes) -> None:
    assert writer is not None
    try:
        writer.write(data)
        await writer.drain()
    except (BrokenPipeError, ConnectionResetError, OSError):
        pass
    finally:
        writer.close()


class AsyncCallStream(AsyncIterator[Chunk]):
    """A running call's output, chunk by chunk (see :func:`stream`)."""

    def __init__(self, inv: Invocation) -> None:
        self._inv = inv
        self._protocol = StreamProtocol()
        self._stderr = StderrTail()
        self._proc: Optional[asyncio.subprocess.Process] = None
        self._tasks: List[asyncio.Future[object]] = []
        self._timer: Optional[asyncio.TimerHandle] = None
        self._buf = bytearray()
        self._scanned = 0
        self._result: Optional[CallResult] = None
        self._error: Optional[BaseException] = None
        self._finished = False

    async def start(self) -> AsyncCallStream:
        """Starts the call (done by ``async with`` and the first step of
        ``async for``)."""
        if self._proc is None and not self._finished:
            try:
                self._proc = await _start(self._inv)
            except BaseException:
                self._finished = True
                self._inv.cleanup()
                raise
            assert self._proc.stderr is not None
            self._tasks.append(asyncio.ensure_future(_drain(self._proc.stderr, self._stderr)))
            if self._inv.input is not None:
                self._tasks.append(asyncio.ensure_future(_feed(self._proc.stdin, self._inv.input)))
            if self._inv.wall_timeout is not None:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(self._inv.wall_timeout, self._overrun)
        return self

    # -- the iterator ----------------------------------------------------------

    def __aiter__(self) -> AsyncCallStream:
        return self

    async def __anext__(self) -> Chunk:
        if self._finished:
            raise StopAsyncIteration
        await self.start()
        try:
            while True:
                line = await self._readline()
                if not line:
                    break
                chunk = self._protocol.line(line)
                if chunk is not None:
                    return chunk
        except BaseException:
            await asyncio.shield(self.aclose())
            raise
        await self._end()
        raise StopAsyncIteration

    async def _readline(self) -> bytes:
        """The next line of runsbx's stdout, however long (a result holds
        up to ``max_output`` bytes of output), or ``b""`` at its end."""
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            i = self._buf.find(b"\n", self._scanned)
            if i >= 0:
                line = bytes(self._buf[: i + 1])
                del self._buf[: i + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buf)
            data = await self._proc.stdout.read(_READ)
            if not data:
                line = bytes(self._buf)
                self._buf.clear()
                self._scanned = 0
                return line
            self._buf += data

    async def _end(self) -> None:
        if self._finished:
            return
        self._finished = True
        assert self._proc is not None
        try:
            returncode = await self._proc.wait()
            await self._join()
            self._result = self._inv.finish(
                returncode, self._protocol.result_line, self._stderr.value()
            )
        except RunsbxError as e:
            self._error = e
            raise
        finally:
            self._inv.cleanup()

    # -- what it knows ---------------------------------------------------------

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
            raise RuntimeError("the call is still running: iterate to the end first, or await wait()")
        return self._result

    @property
    def capped(self) -> Dict[str, Capped]:
        """The streams whose head is full, with how many bytes of each were
        streamed."""
        return dict(self._protocol.capped)

    @property
    def running(self) -> bool:
        """Whether runsbx (and so the call) is still running."""
        return self._proc is not None and self._proc.returncode is None

    async def wait(self) -> CallResult:
        """Reads the rest of the output (dropping it) and returns the
        result (or raises as the iteration would)."""
        async for _ in self:
            pass
        return self.result

    # -- stdin -----------------------------------------------------------------

    async def write_stdin(self, data: Union[bytes, str]) -> None:
        """Writes to the command's stdin (``stdin=PIPE``)."""
        await self.start()
        assert self._proc is not None
        if not self._inv.pipe_stdin or self._proc.stdin is None:
            raise RuntimeError("write_stdin() needs stream(..., stdin=runsbx.PIPE)")
        self._proc.stdin.write(data.encode("utf-8") if isinstance(data, str) else data)
        await self._proc.stdin.drain()

    def close_stdin(self) -> None:
        """Closes the command's stdin (it reads end of file)."""
        if self._inv.pipe_stdin and self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()

    # -- stopping --------------------------------------------------------------

    async def aclose(self) -> None:
        """Stops the call if it is still running (runsbx kills the sandbox
        and cleans up). Never raises for the call's outcome."""
        if self._finished:
            return
        self._finished = True
        try:
            if self._proc is None:
                return
            self.close_stdin()
            # runsbx may be blocked writing a line: read on while it ends.
            drain = asyncio.ensure_future(self._drain_stdout())
            await _stop(self._proc)
            try:
                await asyncio.wait_for(drain, TERM_GRACE)
            except asyncio.TimeoutError:
                pass
            await self._join()
            assert self._proc.returncode is not None
            try:
                self._inv.check = False
                self._result = self._inv.finish(
                    self._proc.returncode, self._protocol.result_line, self._stderr.value()
                )
            except RunsbxError:
                pass
        finally:
            self._inv.cleanup()

    async def __aenter__(self) -> AsyncCallStream:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await asyncio.shield(self.aclose())

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and not getattr(self, "_finished", True) and proc.returncode is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except OSError:
                pass

    # -- helpers -----------------------------------------------------------------

    async def _join(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        try:
            await asyncio.wait_for(asyncio.gather(*self._tasks), TERM_GRACE)
        except (asyncio.TimeoutError, OSError):
            await _cancel(self._tasks)
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()

    def _overrun(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._inv.overran = True
            try:
                self._proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    async def _drain_stdout(self) -> None:
        while True:
            line = await self._readline()
            if not line:
                return
            try:
                self._protocol.line(line)
            except RunsbxError:
                pass


# -- sessions ------------------------------------------------------------------


async def _run_subcommand(cmd: Subcommand[T]) -> T:
    """Runs a ``runsbx session`` command to its end; cancelled, it stops
    runsbx first (SIGTERM: runsbx undoes what it began)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            close_fds=True,
        )
    except OSError as e:
        raise not_runnable(cmd.binary, e) from e
    communicate = asyncio.ensure_future(proc.communicate())
    try:
        out, err = await asyncio.wait_for(asyncio.shield(communicate), SUBCOMMAND_TIMEOUT)
    except asyncio.TimeoutError:
        await asyncio.shield(_stop(proc))
        await _cancel([communicate])
        raise Failure(
            f"runsbx {' '.join(cmd.argv[1:3])} did not end within {SUBCOMMAND_TIMEOUT:.0f} s and was stopped"
        ) from None
    except BaseException:
        await asyncio.shield(_stop(proc))
        await _cancel([communicate])
        raise
    assert proc.returncode is not None
    return cmd.finish(proc.returncode, out, err)


async def sessions(*, binary: Optional[PathArg] = None) -> List[SessionInfo]:
    """The persistent sessions of this user; see :func:`runsbx.sessions`."""
    return await _run_subcommand(session_list(binary))


class Session(_session.SessionCore):
    """:class:`runsbx.Session` for asyncio: the same arguments and methods,
    as coroutines. The session is made by ``async with`` (or ``await
    session.create()``); leaving the block removes it unless ``keep``::

        async with runsbx.aio.Session(image="python") as s:
            await s.run(["pip", "install", "--user", "rich"])
            r = await s.run_python("import rich; print(rich.__name__)")
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
        super().__init__(None, binary, keep)
        # Checked now, run at create().
        self._create: Optional[Subcommand[SessionInfo]] = session_create(
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

    async def create(self) -> Session:
        """Makes the session (done by ``async with``; once).

        Raises:
            SessionExists: A session of that name exists (use
                :meth:`attach`).
            ImageNotFound, BadInput, Failure: runsbx could not make it.
        """
        if self._create is not None:
            self._info = await _run_subcommand(self._create)
            self._create = None
        return self

    @classmethod
    async def attach(cls, name: str, *, binary: Optional[PathArg] = None, keep: bool = True) -> Session:
        """A handle on the existing session ``name``; see
        :meth:`runsbx.Session.attach`."""
        for info in await sessions(binary=binary):
            if info.name == name:
                session = cls.__new__(cls)
                _session.SessionCore.__init__(session, info, binary, keep)
                session._create = None
                return session
        raise SessionNotFound(f"session {name!r} does not exist (runsbx session ls lists them)")

    async def run(self, cmd: Command, **options: Unpack[CallOptions]) -> CallResult:
        """Runs ``cmd`` in a fresh sandbox of the session; see
        :meth:`runsbx.Session.run`."""
        return await _run(Invocation(cmd, streaming=False, **self._call_args(options)))

    def stream(self, cmd: Command, **options: Unpack[CallOptions]) -> AsyncCallStream:
        """A call into the session whose output is read as it arrives; see
        :func:`stream`."""
        return AsyncCallStream(Invocation(cmd, streaming=True, **self._call_args(options)))

    async def run_python(self, code: str, **options: Unpack[CallOptions]) -> CallResult:
        """Runs Python source ``code``; see :meth:`runsbx.Session.run_python`."""
        return await self.run(_session.python_command(code), **options)

    async def _op(self, op: _session.FileOp[T]) -> T:
        return op.finish(await _run(Invocation(op.cmd, streaming=False, **self._call_args(op.options))))

    async def write_file(self, path: Union[str, os.PathLike[str]], data: Union[bytes, str]) -> None:
        """See :meth:`runsbx.Session.write_file`."""
        await self._op(_session.write_file(path, data))

    async def read_file(self, path: Union[str, os.PathLike[str]]) -> bytes:
        """See :meth:`runsbx.Session.read_file`."""
        return await self._op(_session.read_file(path))

    async def list_files(self, path: Union[str, os.PathLike[str]] = ".") -> List[str]:
        """See :meth:`runsbx.Session.list_files`."""
        return await self._op(_session.list_files(path))

    async def close(self) -> None:
        """Removes the session unless ``keep``; see
        :meth:`runsbx.Session.close`."""
        if self.closed:
            return
        if self._info is not None and not self.keep:
            await _run_subcommand(session_remove([self.name], self._binary))
        self.closed = True

    async def __aenter__(self) -> Session:
        return await self.create()

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await asyncio.shield(self.close())
