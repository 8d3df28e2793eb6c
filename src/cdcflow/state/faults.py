"""Crash injection for recovery tests: ``CDCFLOW_CRASH_AT=<point>[@<batch_id>]``.

When the variable names the point being passed (and, if given, the batch id), the process exits
at once with ``os._exit(CRASH_EXIT_CODE)`` — no cleanup, no flush, like a killed process.
Points, in micro-batch order: ``after_offsets``, ``after_bronze``, ``after_quarantine``,
``after_silver``, ``after_audit``, ``before_commit``. Points of ``replay --apply``
(:data:`REPLAY_CRASH_POINTS`, the number after ``@`` is the replay id), in order:
``replay_before_write``, ``replay_after_tombstones``, ``replay_after_silver``,
``replay_after_mode``, ``replay_after_log``.
"""

from __future__ import annotations

import os

CRASH_POINTS = (
    "after_offsets",
    "after_bronze",
    "after_quarantine",
    "after_silver",
    "after_audit",
    "before_commit",
)
REPLAY_CRASH_POINTS = (
    "replay_before_write",
    "replay_after_tombstones",
    "replay_after_silver",
    "replay_after_mode",
    "replay_after_log",
)
CRASH_EXIT_CODE = 86
ENV_VAR = "CDCFLOW_CRASH_AT"


def crash_point(point: str, batch_id: int) -> None:
    """Exit the process immediately if ``CDCFLOW_CRASH_AT`` selects this point and batch."""
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return
    name, _, batch = spec.partition("@")
    if name == point and (not batch or int(batch) == batch_id):
        os._exit(CRASH_EXIT_CODE)
