"""Crash injection for recovery tests: ``CDCFLOW_CRASH_AT=<point>[@<batch_id>]``.

When the variable names the point being passed (and, if given, the batch id), the process sends
itself ``SIGKILL``: no cleanup, no flush, no ``finally`` block, no atexit handler — exactly what
``kill -9`` or the OOM killer does. A parent sees the return code :data:`CRASH_EXIT_CODE`
(``-9``, as :mod:`subprocess` reports a death by signal 9).

Points of a micro-batch (:data:`CRASH_POINTS`), in the order a micro-batch passes them; each
follows one commit of the batch (a checkpoint file or a Delta commit), so a crash at a point
leaves exactly the commits before it:

* ``after_offsets`` — ``<checkpoint>/offsets/<batch>.json`` written (the write-ahead record).
* ``after_bronze`` — Bronze append.
* ``after_quarantine`` — quarantine append.
* ``after_silver_merge`` — Silver MERGE; in hard mode before the tombstone MERGE (in soft mode
  there is no tombstone commit: the same state as ``after_silver``).
* ``after_silver`` — hard mode: tombstone MERGE and tombstone purge.
* ``after_history`` — ``silver/customer_history`` MERGE.
* ``after_gold_active_customers``, ``after_gold_active_customers_by_geo``,
  ``after_gold_status_distribution``, ``after_gold_daily_customer_metrics`` — each Gold table's
  overwrite (a refresh after a micro-batch; a manual ``gold refresh`` passes none).
* ``after_outcomes`` — ``audit/event_outcomes`` append, before the ``audit/batch_log`` append.
* ``after_audit`` — ``audit/batch_log`` append.
* ``before_commit`` — every table written, commit marker not yet (the local engine writes
  nothing between ``after_audit`` and this point; the Spark engine releases its caches).
* ``after_commit`` — ``<checkpoint>/commits/<batch>.json`` written, before the source is
  acknowledged (PostgreSQL: the replication slot not advanced yet; Spark: its own streaming
  commit log not written yet).

The inline Snowflake sync (``snowflake.mode: inline``) has no point: it is not a commit of the
micro-batch (a failed or repeated sync is caught up by the next one).

Points of a staging source (:data:`SOURCE_CRASH_POINTS`, Kafka; the number after ``@`` is the
id of the micro-batch the staged file is named after): ``after_source_plan`` — the write-ahead
source state holds the planned ranges, no record read yet; ``after_source_staged`` — the staged
landing file written, before the micro-batch's offsets.

Points of ``replay --apply`` (:data:`REPLAY_CRASH_POINTS`, the number after ``@`` is the replay
id), in order: ``replay_before_write``, ``replay_after_tombstones``, ``replay_after_silver``,
``replay_after_mode``, ``replay_after_log``.
"""

from __future__ import annotations

import os
import signal

CRASH_POINTS = (
    "after_offsets",
    "after_bronze",
    "after_quarantine",
    "after_silver_merge",
    "after_silver",
    "after_history",
    "after_gold_active_customers",
    "after_gold_active_customers_by_geo",
    "after_gold_status_distribution",
    "after_gold_daily_customer_metrics",
    "after_outcomes",
    "after_audit",
    "before_commit",
    "after_commit",
)
REPLAY_CRASH_POINTS = (
    "replay_before_write",
    "replay_after_tombstones",
    "replay_after_silver",
    "replay_after_mode",
    "replay_after_log",
)
SOURCE_CRASH_POINTS = ("after_source_plan", "after_source_staged")
#: Return code of a process killed by a crash point, as :mod:`subprocess` reports it.
CRASH_EXIT_CODE = -signal.SIGKILL
ENV_VAR = "CDCFLOW_CRASH_AT"


def gold_point(table: str) -> str:
    """The crash point after the commit of Gold table ``table`` (e.g. ``gold/status_distribution``
    gives ``after_gold_status_distribution``)."""
    return "after_" + table.replace("/", "_")


def crash_point(point: str, batch_id: int) -> None:
    """Kill this process with ``SIGKILL`` if ``CDCFLOW_CRASH_AT`` selects this point and batch.

    Args:
        point: the point being passed (one of :data:`CRASH_POINTS` or
            :data:`REPLAY_CRASH_POINTS`).
        batch_id: the micro-batch id (the replay id for a replay point).
    """
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return
    name, _, batch = spec.partition("@")
    if name == point and (not batch or int(batch) == batch_id):
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(128 + signal.SIGKILL)  # not reached: SIGKILL cannot be caught
