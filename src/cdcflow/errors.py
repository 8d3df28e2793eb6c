"""Exception tree of cdcflow.

Every error raised on purpose by cdcflow derives from :class:`CdcflowError`, so callers (and the
CLI) can catch one type. Bad *records* are never exceptions: they are data and go to the
quarantine table with a reason code (see :mod:`cdcflow.plan.rules`).
"""

from __future__ import annotations


class CdcflowError(Exception):
    """Root of every cdcflow error."""


class ConfigError(CdcflowError):
    """A configuration file or override is invalid.

    The message names the offending key and the file it came from.
    """


class CheckpointError(CdcflowError):
    """The checkpoint folder is unreadable, inconsistent or locked by another run."""


class TableError(CdcflowError):
    """A Delta table is missing, has an unexpected schema or could not be written."""


class MissingDependencyError(CdcflowError):
    """An optional dependency is not installed; the message says how to install it."""
