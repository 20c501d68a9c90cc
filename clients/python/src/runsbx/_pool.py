"""A warm pool: :class:`Pool` keeps sandboxes ready in a ``runsbx serve``
child and runs calls in them."""

from __future__ import annotations

import base64
import itertools
import json
import math
import os
import select
import subprocess
import threading
import time
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Type

from ._binary import PathArg, find_binary, not_runnable
from ._call import OVERRUN_GRACE, TERM_GRACE, Command, Invocation, Size, Strings, _said, _sandbox_options
from .errors import BadInput, CallError, ProtocolError, RunsbxError, error_class
from .result import CallResult

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._session import CallOptions

__all__ = ["Pool"]


class _Pending:
    """A request waiting for its reply (both fields under the pool's lock)."""

    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = False
        self.reply: Optional[Dict[str, Any]] = None


class Pool:
    """Sandboxes built ahead of time, so that a call costs milliseconds.

    The pool is a ``runsbx serve`` child that keeps ``size`` sandboxes
    ready, each built from the pool's settings (image, limits, profile,
    egress) up to the point where only the command is missing. Each
    sandbox runs one call and is then torn down and replaced in the
    background: no call ever sees another's processes or files.

    :meth:`run` takes the arguments of :func:`runsbx.run` and returns the
    same :class:`CallResult`; the pool's settings are its defaults. A call
    whose settings differ from the pool's (another image, memory limit,
    egress, a session ...) runs cold, as :func:`runsbx.run` would run it.
    :meth:`run` may be called from several threads at once::

        with runsbx.Pool(size=2) as pool:
            r = pool.run(["python3", "-c", "print(6*7)"])
            assert r.stdout_text == "42\\n"
    """

    def __init__(
        self,
        size: int = 2,
        *,
        image: Optional[str] = None,
        rootfs: Optional[PathArg] = None,
        timeout: Optional[float] = None,
        memory: Optional[Size] = None,
        pids: Optional[int] = None,
        profile: Optional[str] = None,
        allow_hosts: Optional[Strings] = None,
        allow: Optional[Strings] = None,
        proxy_resolve: Optional[Mapping[str, str]] = None,
        proxy_allow_addresses: Optional[Strings] = None,
        binary: Optional[PathArg] = None,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 64:
            raise ValueError(f"size must be an int from 1 to 64, not {size!r}")
        self._defaults: Dict[str, Any] = {
            "image": image,
            "timeout": timeout,
            "memory": memory,
            "pids": pids,
            "profile": profile,
            "allow_hosts": allow_hosts,
            "allow": allow,
            "proxy_resolve": proxy_resolve,
            "proxy_allow_addresses": proxy_allow_addresses,
        }
        opts = _sandbox_options(**self._defaults)
        if rootfs is not None:
            opts.append(f"--rootfs={os.fspath(rootfs)}")
            self._defaults["rootfs"] = rootfs
        self._binary = find_binary(binary)
        self._ids = itertools.count(1)
        self._pending: Dict[int, _Pending] = {}
        self._lock = threading.Lock()
        # Replies are read by the callers' own threads, not by a thread of
        # the pool's: one waiting caller at a time reads serve's stdout and
        # hands each reply to its request (see _await).
        self._replies = threading.Condition(self._lock)
        self._reading = False
        self._partial = b""
        self._write_lock = threading.Lock()
        self._closed = False
        self._ended: Optional[str] = None
        #: Calls run in a ready sandbox, and calls run cold (their options
        #: did not fit the pool's).
        self.warm_calls = 0
        self.cold_calls = 0
        try:
            self._proc = subprocess.Popen(
                [self._binary, "serve", f"--size={size}", *opts],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as e:
            raise not_runnable(self._binary, e) from None
        self._stderr: List[bytes] = []
        assert self._proc.stdout is not None
        self._out = self._proc.stdout.fileno()
        self._err_reader = threading.Thread(target=self._read_stderr, name="runsbx-pool-stderr", daemon=True)
        self._err_reader.start()

    def run(self, cmd: Command, **options: Unpack[CallOptions]) -> CallResult:
        """Runs ``cmd`` in a ready sandbox (or cold, if its options do not
        fit the pool's) and returns its result once it has ended.

        Takes the arguments of :func:`runsbx.run` but ``binary``; those not
        given are the pool's.

        Raises:
            As :func:`runsbx.run`; ``ProtocolError`` if the pool has ended.
            Settings a cold call refuses (an unknown image, say) end the
            pool before its first sandbox: then every call raises the
            error :func:`runsbx.run` would (``ImageNotFound``...).
        """
        if "binary" in options:
            raise TypeError("binary is the pool's: give it to Pool()")
        args: Dict[str, Any] = {**self._defaults, **options}
        inv = Invocation(cmd, streaming=False, binary=self._binary, **args)
        try:
            if inv.child_env is not None:
                # The call runs in `runsbx serve`, whose environment was
                # set when the pool started.
                raise BadInput("a pool's calls take a secret from file= or env=, not value=")
            # The request is runsbx call's own arguments: `call` and after.
            argv = inv.argv[2:]
            data = None if inv.input is None else base64.b64encode(inv.input).decode("ascii")
            pending = _Pending()
            with self._lock:
                if self._closed:
                    raise ProtocolError(f"the pool has ended{self._why()}")
                rid = next(self._ids)
                ended = self._ended is not None
                if not ended:
                    self._pending[rid] = pending
            if ended:
                raise self._ended_error("the pool has ended")
            line = json.dumps({"id": rid, "argv": argv, "stdin": data}) + "\n"
            try:
                with self._write_lock:
                    stdin = self._stdin()
                    stdin.write(line.encode("utf-8"))
                    stdin.flush()
            except OSError:
                with self._lock:
                    self._pending.pop(rid, None)
                raise self._ended_error("the pool has ended") from None
            try:
                done = self._await(lambda: pending.done, inv.wall_timeout)
            except BaseException:
                # KeyboardInterrupt and the like: the call is cancelled (its
                # sandbox killed), as run() stops runsbx.
                self._cancel(rid)
                raise
            if not done:
                self._cancel(rid)
                inv.overran = True
                return inv.finish(-1, None, b"")
            reply = pending.reply
            if reply is None:
                raise self._ended_error("the pool ended before the call's result came")
            if "error" in reply:
                raise ProtocolError(f"runsbx serve: {reply['error']}")
            with self._lock:
                if reply.get("warm") is True:
                    self.warm_calls += 1
                else:
                    self.cold_calls += 1
            code = reply.get("exit_code")
            stderr = str(reply.get("stderr") or "").encode("utf-8")
            return inv.finish_parsed(code if isinstance(code, int) else -1, reply.get("result"), stderr)
        finally:
            inv.cleanup()

    def _cancel(self, rid: int) -> None:
        """Forgets request ``rid`` and has the pool send SIGTERM to its call."""
        with self._lock:
            self._pending.pop(rid, None)
        try:
            with self._write_lock:
                stdin = self._stdin()
                stdin.write((json.dumps({"cancel": rid}) + "\n").encode("utf-8"))
                stdin.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        """Ends the pool: its unused sandboxes are let go, and ``runsbx
        serve`` waited for. Calls still running get their results first."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            with self._write_lock:
                self._stdin().close()
        except OSError:
            pass
        # Calls still running get their replies (read here if no caller is
        # reading); serve ends once it has written the last.
        deadline = time.monotonic() + OVERRUN_GRACE
        try:
            self._await(lambda: self._ended is not None, OVERRUN_GRACE)
            self._proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=TERM_GRACE)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._err_reader.join()
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    @property
    def pid(self) -> int:
        """The pid of the ``runsbx serve`` process."""
        return self._proc.pid

    def __enter__(self) -> Pool:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None and not getattr(self, "_closed", True):
            # Unclosed: closing its stdin ends it (its sandboxes go).
            try:
                self._stdin().close()
            except (OSError, ValueError):
                pass

    def _stdin(self) -> IO[bytes]:
        assert self._proc.stdin is not None
        return self._proc.stdin

    def _why(self) -> str:
        tail = b"".join(self._stderr).decode("utf-8", errors="replace").strip().splitlines()
        return f": {tail[-1]}" if tail else ""

    def _ended_error(self, what: str) -> RunsbxError:
        """Why a call cannot run in a pool that ended without being closed:
        ``runsbx serve``'s own error when it ended with one of ``runsbx
        call``'s codes (settings a cold call refuses, an unknown image for
        one, end it before its first sandbox with exit code 125), as
        :func:`runsbx.run` would raise it; else a ``ProtocolError`` saying
        ``what``."""
        try:
            # Its output has ended: it is exiting.
            code = self._proc.wait(timeout=TERM_GRACE)
        except subprocess.TimeoutExpired:
            code = None
        # Its last line is read once the pipe ends (no worker is left to
        # hold it when serve ends this way).
        self._err_reader.join(timeout=1.0)
        stderr = b"".join(self._stderr).decode("utf-8", errors="replace")
        said = _said(stderr)
        if code is not None and code > 0 and said:
            cls = error_class(None, said, code)
            if cls is not CallError:
                return cls(said, returncode=code, stderr=stderr)
        return ProtocolError(f"{what}{self._why()}", returncode=code, stderr=stderr)

    def _await(self, ready: Callable[[], bool], timeout: Optional[float]) -> bool:
        """Waits until ``ready()`` (checked under the lock), at most
        ``timeout`` seconds (``None``: no limit); False if it was not.

        The waiting thread reads the replies itself if no other does:
        handing a reply from a reader thread to the caller's would wake a
        second thread for every call (about 0.1 ms of a warm call's 2). The
        reader hands the other callers their replies and, when its own has
        come, wakes them so that one of them reads on."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._replies:
            while not ready():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                if not self._reading:
                    self._reading = True
                    break
                self._replies.wait(left)
            else:
                return True
        try:
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._read_replies(left)
                with self._lock:
                    if ready():
                        return True
        finally:
            with self._replies:
                self._reading = False
                self._replies.notify_all()

    def _read_replies(self, timeout: Optional[float]) -> None:
        """Reads what serve has written, waiting at most ``timeout``
        seconds for it, and hands each whole reply to the request waiting
        for it. At the end of serve's output, the pool has ended."""
        poll = select.poll()
        poll.register(self._out, select.POLLIN)
        if not poll.poll(None if timeout is None else math.ceil(timeout * 1000)):
            return
        chunk = os.read(self._out, 1 << 16)
        if not chunk:
            with self._replies:
                if self._ended is None:
                    self._ended = "ended"
                for pending in self._pending.values():
                    pending.done = True
                self._pending.clear()
                self._replies.notify_all()
            return
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        replies = []
        for raw in lines:
            try:
                reply = json.loads(raw)
            except ValueError:
                continue
            if isinstance(reply, dict) and isinstance(reply.get("id"), int):
                replies.append(reply)
        if not replies:
            return
        with self._replies:
            for reply in replies:
                pending = self._pending.pop(reply["id"], None)
                if pending is not None:
                    pending.reply = reply
                    pending.done = True
            self._replies.notify_all()

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            self._stderr.append(raw)
            del self._stderr[:-20]
