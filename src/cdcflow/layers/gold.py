"""Gold tables: customer analytics derived from ``silver/customer_history`` (see
:mod:`cdcflow.engines.local.gold` for how they are refreshed).

All four are recomputed as a whole (Delta overwrite) from the history table, whose current
versions equal Silver (plus, in hard mode, a DELETE version for every hard-deleted customer):

* ``gold/active_customers`` — one row per active customer_id (``is_active``: not deleted and
  status ``ACTIVE``), with the public Silver columns. Deleted customers never appear.
* ``gold/active_customers_by_geo`` — one row per (country, city) with at least one active
  customer: ``active_customers`` (count). Null country/city form their own group.
* ``gold/status_distribution`` — one row per status ``ACTIVE``, ``INACTIVE``, ``SUSPENDED``,
  ``DELETED`` (always present, 0 when none) plus a null-status row when some customer has no
  status yet: ``customers`` (count of customers whose current state has it) and ``share_pct``
  (customers / all customers, in percent; null when there are none). Hard-deleted customers
  count as ``DELETED``.
* ``gold/daily_customer_metrics`` — one row per UTC date on which some customer changed
  (``valid_from``), plus the days without changes that lie between two change dates at most
  ``MAX_FILLED_GAP_DAYS`` (31) days apart. A longer quiet period is left out (its days would
  only repeat the previous row's ``active_at_end_of_day``): the table grows with the number of
  change dates, not with the time span, so a single event with an outlying timestamp (an epoch
  value from 1900, say) adds one row, not a row for every day of 125 years.

  - ``new_registrations``: customers whose first INSERT (lowest sequence) falls on the date;
  - ``deletions``: DELETE versions whose previous version exists and is not deleted;
  - ``deactivations``: versions going from active (not deleted, ``ACTIVE``) to not deleted with
    status ``INACTIVE`` or ``SUSPENDED``;
  - ``reactivations``: versions going from not deleted ``INACTIVE`` / ``SUSPENDED`` to active;
  - ``active_at_end_of_day``: customers active in their state as of the end of the date (the
    version of highest sequence with ``valid_from`` before the next midnight UTC);
  - ``churn_pct``: customers active at the start of the date who are not active at its end
    (deleted, or a status other than ``ACTIVE``), in percent of the customers active at
    its start (= the previous row's ``active_at_end_of_day``, as nothing changed in between; 0
    on the first date); null when that is 0. It counts customers, not transitions: one
    deactivated and reactivated on the same date is not lost, one registered and deleted on the
    same date was not active at its start. So it lies between 0 and 100.

Every transition is counted on the date of the version's ``valid_from``.

Ratios are percentages, on one scale across the Gold tables (columns named ``*_pct``, from 0 to
100): ``100 * part / whole`` rounded half to even to two decimals (:data:`PCT_DECIMALS`), e.g.
1 of 3 → ``33.33``, 1 of 8 → ``12.5``, 1 of 800 → ``0.12``; the shares of
``status_distribution`` may so sum to a little more or less than 100 (at most 0.005 per row).
"""

from __future__ import annotations

import pyarrow as pa

from cdcflow.layers.tables import SILVER_FIELDS, TableSpec

_COUNT = pa.int64()
#: Quiet days are filled in ``daily_customer_metrics`` between change dates at most this many
#: days apart.
MAX_FILLED_GAP_DAYS = 31
#: Decimals of the percentages (``*_pct`` columns), rounded half to even.
PCT_DECIMALS = 2

ACTIVE_CUSTOMERS = TableSpec(
    "gold/active_customers",
    pa.schema([f for f in SILVER_FIELDS if not f.name.startswith("_cdc_")]),
)

ACTIVE_BY_GEO = TableSpec(
    "gold/active_customers_by_geo",
    pa.schema(
        [
            pa.field("country", pa.string()),
            pa.field("city", pa.string()),
            pa.field("active_customers", _COUNT, nullable=False),
        ]
    ),
)

STATUS_DISTRIBUTION = TableSpec(
    "gold/status_distribution",
    pa.schema(
        [
            pa.field("status", pa.string()),
            pa.field("customers", _COUNT, nullable=False),
            pa.field("share_pct", pa.float64()),
        ]
    ),
)

DAILY_METRICS = TableSpec(
    "gold/daily_customer_metrics",
    pa.schema(
        [
            pa.field("date", pa.date32(), nullable=False),
            pa.field("new_registrations", _COUNT, nullable=False),
            pa.field("deletions", _COUNT, nullable=False),
            pa.field("deactivations", _COUNT, nullable=False),
            pa.field("reactivations", _COUNT, nullable=False),
            pa.field("active_at_end_of_day", _COUNT, nullable=False),
            pa.field("churn_pct", pa.float64()),
        ]
    ),
)

GOLD_TABLES = (ACTIVE_CUSTOMERS, ACTIVE_BY_GEO, STATUS_DISTRIBUTION, DAILY_METRICS)

__all__ = [
    "ACTIVE_BY_GEO",
    "ACTIVE_CUSTOMERS",
    "DAILY_METRICS",
    "GOLD_TABLES",
    "MAX_FILLED_GAP_DAYS",
    "PCT_DECIMALS",
    "STATUS_DISTRIBUTION",
]
