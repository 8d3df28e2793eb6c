"""Failure injection for the Snowflake sync's recovery tests.

``CDCFLOW_SNOWFLAKE_FAIL_AT=<point>`` (or the ``fail_at`` argument of the sync functions) makes
the sync raise :class:`InjectedSyncFailure` when it passes the point. Points, in order:

* ``after_put`` — bulk path: the attempt's Parquet files are in the Snowflake stage, not copied.
* ``after_copy`` — bulk path: the files are copied into the stage table (``COPY INTO``).
* ``after_load`` — changes are in the stage table, nothing merged.
* ``after_merge`` — the MERGE ran inside the open transaction, state not updated.
* ``after_state`` — MERGE and state update ran, transaction not committed.
* ``after_commit`` — committed; the stage rows of the attempt are not yet removed.

A failure before the commit rolls the transaction back (as Snowflake does for a session that
dies with an open transaction).
"""

from __future__ import annotations

import os

from cdcflow.errors import CdcflowError

SYNC_POINTS = ("after_load", "after_merge", "after_state", "after_commit")
#: The points of the bulk load only (``snowflake.load_method: bulk``), before ``after_load``.
BULK_POINTS = ("after_put", "after_copy")
ENV_VAR = "CDCFLOW_SNOWFLAKE_FAIL_AT"


class InjectedSyncFailure(CdcflowError):
    """A failure injected at a named point of the sync (tests only)."""


def fail_point(point: str, fail_at: str | None = None) -> None:
    """Raise :class:`InjectedSyncFailure` when ``fail_at`` (or the env variable) names ``point``."""
    selected = fail_at if fail_at is not None else os.environ.get(ENV_VAR)
    if selected == point:
        raise InjectedSyncFailure(f"injected Snowflake sync failure at {point}")
