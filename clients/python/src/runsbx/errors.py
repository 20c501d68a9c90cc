"""The exceptions of the runsbx client.

Every exception is a :class:`RunsbxError`. What raises and what returns:

- A command that ran and exited, whatever its exit code, is a
  :class:`~runsbx.CallResult`, not an exception (unless ``check=True``:
  then :class:`NonZeroExit`).
- A command that ran into its deadline is a result with ``timed_out=True``
  (unless ``check=True``: then :class:`TimedOut`).
- A call that could not run its command (``"status": "error"`` in the
  result, runsbx's exit codes 123, 125, 126 and 127) raises a
  :class:`CallError` subclass chosen by the result's ``error.kind``; a
  ``runsbx session`` command that fails raises one chosen by its exit code.
- No runsbx binary: :class:`BinaryNotFound`; output from runsbx this client
  cannot read: :class:`ProtocolError`.

::

    RunsbxError
    ├── BinaryNotFound
    ├── ProtocolError
    ├── CallError                 the call did not run its command (or a
    │   │                         session command failed)
    │   ├── BadInput              error.kind "bad_input" (exit 125; session: 3)
    │   │   ├── ImageNotFound     (also a NotFound)
    │   │   └── SessionNotFound   (also a NotFound; session rm: exit 4)
    │   ├── Refused               error.kind "refused" (exit 125)
    │   ├── NotFound              an image, a session or a command is missing
    │   │   ├── ImageNotFound
    │   │   ├── SessionNotFound
    │   │   └── CommandNotFound   error.kind "not_found" (exit 127)
    │   ├── NotExecutable         error.kind "not_executable" (exit 126)
    │   ├── Conflict              a session command's exit 5
    │   │   ├── SessionExists     session create: the name is taken
    │   │   └── SessionInUse      session rm: a running call uses it
    │   └── Failure               error.kind "failure" (exit 123; session: 1)
    ├── TimedOut                  check=True and the deadline passed
    └── NonZeroExit               check=True and the command did not exit 0
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Dict, Optional, Type

if TYPE_CHECKING:
    from .result import CallResult

__all__ = [
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


class RunsbxError(Exception):
    """The base class of every error of this package.

    Attributes:
        message: What went wrong, as runsbx (or this client) said it.
        result: The call's result, when runsbx printed one.
        returncode: runsbx's own exit code, when it ran.
        stderr: What runsbx wrote on its stderr (its diagnostics; never the
            command's output, which is in the result), possibly cut to its
            last kilobytes.
    """

    def __init__(
        self,
        message: str,
        *,
        result: Optional[CallResult] = None,
        returncode: Optional[int] = None,
        stderr: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.result = result
        self.returncode = returncode
        self.stderr = stderr

    @property
    def kind(self) -> Optional[str]:
        """The result's ``error.kind`` (``"bad_input"``, ...), if any."""
        if self.result is not None and self.result.error is not None:
            return self.result.error.kind
        return None

    def __str__(self) -> str:
        return self.message


class BinaryNotFound(RunsbxError):
    """The runsbx binary could not be found or executed."""


class ProtocolError(RunsbxError):
    """runsbx printed something this client cannot read (a different
    version of runsbx, or runsbx died mid-way)."""


class CallError(RunsbxError):
    """The call did not run its command to an end: it was refused or failed
    before (or while) the sandbox was made. ``result.status`` is
    ``"error"`` when runsbx printed a result. A ``runsbx session`` command
    that fails raises a subclass too (``result`` is then ``None``)."""


class BadInput(CallError):
    """An option runsbx refused: a bad ``env`` key, an input path, a
    duration, a rootfs, a profile that is not selectable, a missing image
    (see :class:`ImageNotFound`)... ``error.kind`` ``"bad_input"``, exit 125
    (or 2, runsbx's command line parser)."""


class Refused(CallError):
    """The sandbox policy refused what the call asks for; the message names
    the profile key that would allow it. ``error.kind`` ``"refused"``."""


class NotFound(CallError):
    """Something the call needs does not exist: the image or the command."""


class ImageNotFound(BadInput, NotFound):
    """No image of that name (``runsbx image ls`` lists them). runsbx
    reports it as ``bad_input`` (exit 125), so this is a :class:`BadInput`
    too."""


class SessionNotFound(BadInput, NotFound):
    """No session of that name (``runsbx.sessions()`` lists them): a call
    into it (runsbx reports ``bad_input``, exit 125, so this is a
    :class:`BadInput` too) or ``runsbx session rm`` of it (exit 4)."""


class CommandNotFound(NotFound):
    """The command is not in the image (searched in the image's ``PATH``).
    ``error.kind`` ``"not_found"``, exit 127."""


class NotExecutable(CallError):
    """The command exists in the image but is not executable.
    ``error.kind`` ``"not_executable"``, exit 126."""


class Conflict(CallError):
    """The request conflicts with the state of a session (``runsbx
    session``'s exit code 5)."""


class SessionExists(Conflict):
    """``runsbx session create``: a session of that name exists already
    (attach to it with ``Session.attach(name)``)."""


class SessionInUse(Conflict):
    """``runsbx session rm``: a running call uses the session; remove it
    once the call has ended."""


class Failure(CallError):
    """runsbx failed on the host while running the call (the message says
    which step). ``error.kind`` ``"failure"``, exit 123."""


class TimedOut(RunsbxError):
    """Raised with ``check=True`` when the call's deadline passed and the
    sandbox was killed; ``result`` is the call's result (``timed_out`` is
    true, the output up to the deadline is in it). Without ``check`` a
    timeout is a result, not an exception."""


class NonZeroExit(RunsbxError):
    """Raised with ``check=True`` when the command exited with a code other
    than 0 (or was ended by a signal). ``result`` is the call's result and
    ``exit_code`` its code."""

    @property
    def exit_code(self) -> Optional[int]:
        """The command's exit code (128 + N for signal N)."""
        return self.result.exit_code if self.result is not None else None


_BY_KIND: Dict[str, Type[CallError]] = {
    "bad_input": BadInput,
    "refused": Refused,
    "not_found": CommandNotFound,
    "not_executable": NotExecutable,
    "failure": Failure,
}

# runsbx call's exit codes for a call that did not run its command.
_BY_EXIT: Dict[int, Type[CallError]] = {
    2: BadInput,  # the command line parser refused an option
    123: Failure,
    125: BadInput,
    126: NotExecutable,
    127: CommandNotFound,
}

# A missing image is reported as bad_input: `image `NAME` not found (...)`,
# a missing session as `session "NAME" does not exist ...`.
_IMAGE_NOT_FOUND = re.compile(r"^image `[^`]*` not found")
_SESSION_NOT_FOUND = re.compile(r"^session [`\"][^`\"]*[`\"] does not exist")


def error_class(kind: Optional[str], message: str, returncode: Optional[int]) -> Type[CallError]:
    """The exception class for an error ``kind`` of the result (or, for a
    kind this client does not know, for runsbx's exit code)."""
    cls = _BY_KIND.get(kind or "")
    if cls is None and returncode is not None:
        cls = _BY_EXIT.get(returncode)
    if cls is None:
        cls = CallError
    if cls is BadInput and _IMAGE_NOT_FOUND.match(message):
        cls = ImageNotFound
    elif cls is BadInput and _SESSION_NOT_FOUND.match(message):
        cls = SessionNotFound
    return cls
