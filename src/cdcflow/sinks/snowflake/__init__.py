"""Snowflake sink: Silver → ``DIM_CUSTOMER_CURRENT``, Gold → ``AGG_*`` (exactly-once via MERGE
and ``CDC_SYNC_STATE``), inline or standalone, with reconciliation.

Needs the ``snowflake`` extra; importing :mod:`cdcflow.sinks.snowflake.connection` functions
raises :class:`~cdcflow.errors.MissingDependencyError` with an install hint when it is missing.
"""

from cdcflow.sinks.snowflake.reconcile import SnowflakeReconcileReport, reconcile_snowflake
from cdcflow.sinks.snowflake.sync import SyncReport, TableSyncReport, sync_snowflake

__all__ = [
    "SnowflakeReconcileReport",
    "SyncReport",
    "TableSyncReport",
    "reconcile_snowflake",
    "sync_snowflake",
]
