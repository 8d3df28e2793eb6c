"""Exception tree of cdcflow.

Every error raised on purpose by cdcflow derives from :class:`CdcflowError`, so callers (and the
CLI) can catch one type. Bad *records* are never exceptions: they are data and go to the
quarantine table with a reason code (see :mod:`cdcflow.plan.rules`).
"""

from __future__ import annotations

from typing import Any


class CdcflowError(Exception):
    """Root of every cdcflow error.

    Attributes:
        exit_code: the ``cdcflow`` command's exit code when this error ends it: 2 for a usage
            or configuration error (:class:`UsageError`, :class:`ConfigError`,
            :class:`MissingDependencyError`), 1 for every other failure (a service that does
            not answer, another run holding the checkpoint, a lakehouse or checkpoint in a
            state the command refuses).
    """

    exit_code: int = 1


class UsageError(CdcflowError):
    """A command was called wrongly: an option's value, a missing or conflicting option, a
    command for a lakehouse it does not apply to or before the run it needs. Exit code 2."""

    exit_code = 2


class ConfigError(CdcflowError):
    """A configuration file or override is invalid.

    The message names the offending key and the file it came from. Exit code 2.
    """

    exit_code = 2


class CheckpointError(CdcflowError):
    """The checkpoint folder is unreadable, inconsistent or locked by another run."""


class TableError(CdcflowError):
    """A Delta table is missing, has an unexpected schema or could not be written."""


class MissingDependencyError(CdcflowError):
    """An optional dependency is not installed; the message says how to install it. Exit
    code 2 (the installation is part of the set-up)."""

    exit_code = 2


class LandingFileChangedError(CheckpointError):
    """A landing file no longer holds the bytes a recorded micro-batch took from it.

    Raised before anything of the batch is written, so the batch is never run on other content
    than its first attempt. The message names the file, the batch, the recorded size and
    SHA-256, and what to do.

    Attributes:
        path: the landing file.
        batch_id: the micro-batch whose offsets name it (None when unknown).
    """

    def __init__(self, file: Any, batch_id: int | None, problem: str) -> None:
        self.path = str(file.path)
        self.batch_id = batch_id
        batch = "a micro-batch" if batch_id is None else f"micro-batch {batch_id}"
        digest = f", sha256 {file.sha256}" if file.sha256 else ""
        super().__init__(
            f"landing file {self.path} {problem}, but {batch} took its first {file.size} bytes"
            f"{digest}; restore that content under this name and run again "
            "(nothing of the batch was written by this attempt)"
        )
