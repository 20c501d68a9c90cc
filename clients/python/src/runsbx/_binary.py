"""Finding the runsbx binary."""

from __future__ import annotations

import os
import shutil
from typing import Optional, Union

from .errors import BinaryNotFound

#: The environment variable that names the runsbx binary.
ENV_VAR = "RUNSBX_BIN"

_HOW = (
    "install runsbx (from its repository, as root: `hack/quickstart.sh`, or "
    "`cargo build --release && "
    "install target/x86_64-unknown-linux-gnu/release/runsbx /usr/local/bin/`), "
    "or point to the binary with binary='/path/to/runsbx' or the environment "
    f"variable {ENV_VAR}=/path/to/runsbx"
)

PathArg = Union[str, "os.PathLike[str]"]


def find_binary(binary: Optional[PathArg] = None) -> str:
    """The path of the runsbx binary to run.

    In this order: ``binary`` if given; the environment variable
    ``RUNSBX_BIN`` if set and not empty; ``runsbx`` on ``PATH``. A name
    without a slash is looked up on ``PATH``.

    Raises:
        BinaryNotFound: There is none, or it is not an executable file; the
            message says how to install runsbx or point to it.
    """
    if binary is not None:
        candidate, origin = os.fspath(binary), "binary="
    elif os.environ.get(ENV_VAR):
        candidate, origin = os.environ[ENV_VAR], f"${ENV_VAR}"
    else:
        found = shutil.which("runsbx")
        if found is None:
            raise BinaryNotFound(f"the runsbx binary is not on PATH: {_HOW}")
        return found
    if not candidate:
        raise BinaryNotFound(f"{origin} is empty: {_HOW}")
    if os.sep not in candidate:
        found = shutil.which(candidate)
        if found is None:
            raise BinaryNotFound(f"{origin} {candidate!r} is not on PATH: {_HOW}")
        return found
    if not os.path.isfile(candidate):
        raise BinaryNotFound(f"{origin} {candidate!r} does not exist (or is not a file): {_HOW}")
    if not os.access(candidate, os.X_OK):
        raise BinaryNotFound(f"{origin} {candidate!r} is not executable: {_HOW}")
    return candidate


def not_runnable(binary: str, error: OSError) -> BinaryNotFound:
    """The error for a binary that was found but could not be started."""
    return BinaryNotFound(f"cannot run the runsbx binary {binary!r}: {error}; {_HOW}")
