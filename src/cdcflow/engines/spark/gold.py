"""Spark rendering of the Gold tables (:mod:`cdcflow.layers.gold`), the same definitions as the
local engine's (:mod:`cdcflow.engines.local.gold`), computed by the executors.

Every Gold table is recomputed from ``silver/customer_history`` and overwritten with delta-spark
under the app transaction ``<app_id>-gold`` (version = batch id), so a re-run of a committed
micro-batch skips the tables already written. Nothing proportional to the data reaches the
driver: the one-partition windows below run over the change dates (``daily_customer_metrics``)
or the five status rows (``status_distribution``), on an executor.

Steps of ``daily_customer_metrics`` (one row per UTC date), as the local rendering:

* per customer in sequence order, the previous version gives the transitions of a version
  (``deletions``, ``deactivations``, ``reactivations``), counted on its ``valid_from`` date;
* ``new_registrations``: the date of each customer's first INSERT by sequence;
* the state at the end of each date a customer changed is its version of highest sequence
  dated up to then (a running maximum of the sequence over its dates); ``active_at_end_of_day``
  is the running sum over dates of the customers turning active minus those turning inactive;
* the calendar holds every change date and the quiet days of gaps of at most
  ``MAX_FILLED_GAP_DAYS`` days.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdcflow.layers.gold import (
    ACTIVE_BY_GEO,
    ACTIVE_CUSTOMERS,
    DAILY_METRICS,
    MAX_FILLED_GAP_DAYS,
    PCT_DECIMALS,
    STATUS_DISTRIBUTION,
)
from cdcflow.model.events import STATUSES

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

_INACTIVE = ("INACTIVE", "SUSPENDED")


def percent(part: Column, whole: Column) -> Column:
    """``100 * part / whole`` rounded half to even to ``PCT_DECIMALS`` decimals; null when
    ``whole`` is 0 (the local engine's :func:`cdcflow.engines.local.gold.percent`: the scaled
    quotient rounded to an integer, then divided and rounded again)."""
    from pyspark.sql import functions as F

    scale = 10**PCT_DECIMALS
    scaled = part.cast("double") * float(100 * scale) / whole.cast("double")
    value = F.bround(F.bround(scaled, 0) / float(scale), PCT_DECIMALS)
    return F.when(whole > 0, value).otherwise(F.lit(None).cast("double"))


def active_customers(current: DataFrame) -> DataFrame:
    """``gold/active_customers``: one row per active customer_id, public Silver columns."""
    from pyspark.sql import functions as F

    return current.filter(F.col("is_active")).select(*ACTIVE_CUSTOMERS.schema.names)


def active_by_geo(current: DataFrame) -> DataFrame:
    """``gold/active_customers_by_geo``: one row per (country, city) with active customers."""
    from pyspark.sql import functions as F

    return (
        current.filter(F.col("is_active"))
        .groupBy("country", "city")
        .agg(F.count(F.lit(1)).cast("long").alias("active_customers"))
    )


def status_distribution(current: DataFrame) -> DataFrame:
    """``gold/status_distribution``: one row per status (the four always, a null-status row
    when some customer has none), ``customers`` and ``share_pct``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spark = current.sparkSession
    counts = current.groupBy("status").agg(F.count(F.lit(1)).cast("long").alias("customers"))
    known = spark.createDataFrame([(s, i) for i, s in enumerate(STATUSES)], "status string, _o int")
    frame = known.join(counts, known["status"].eqNullSafe(counts["status"]), "full").select(
        F.coalesce(known["status"], counts["status"]).alias("status"),
        F.coalesce(F.col("customers"), F.lit(0).cast("long")).alias("customers"),
        F.coalesce(F.col("_o"), F.lit(len(STATUSES))).alias("_o"),
    )
    total = F.sum("customers").over(Window.partitionBy())
    return frame.select(
        "status", "customers", percent(F.col("customers"), total).alias("share_pct"), "_o"
    ).select(*STATUS_DISTRIBUTION.schema.names)


def calendar(dates: DataFrame) -> DataFrame:
    """Every change date (column ``date``) plus the quiet days between two change dates at
    most ``MAX_FILLED_GAP_DAYS`` apart: one row per date."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    changed = dates.select("date").distinct()
    gap = F.datediff(F.lead("date").over(Window.orderBy("date")), F.col("date"))
    fill = F.when(gap <= MAX_FILLED_GAP_DAYS, gap - 1).otherwise(0)
    return changed.select("date", fill.alias("_fill")).select(
        F.explode(F.sequence(F.col("date"), F.date_add(F.col("date"), F.col("_fill")))).alias(
            "date"
        )
    )


def daily_metrics(history: DataFrame) -> DataFrame:
    """``gold/daily_customer_metrics``: one row per UTC date (see :mod:`cdcflow.layers.gold`).

    Args:
        history: every version's ``customer_id``, ``sequence``, ``operation``, ``valid_from``,
            ``status``, ``is_deleted``, ``is_active``.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    by_key = Window.partitionBy("customer_id").orderBy("sequence")
    h = history.select(
        "customer_id",
        "sequence",
        "operation",
        "status",
        "is_deleted",
        "is_active",
        F.to_date("valid_from").alias("date"),
    )
    prev_status = F.lag("status").over(by_key)
    prev_exists = F.lag("sequence").over(by_key).isNotNull()
    prev_active = prev_exists & F.coalesce(F.lag("is_active").over(by_key), F.lit(False))
    prev_alive = prev_exists & ~F.coalesce(F.lag("is_deleted").over(by_key), F.lit(True))
    alive = ~F.col("is_deleted")
    h = h.select(
        "*",
        (F.col("is_deleted") & prev_alive).alias("_del"),
        (prev_active & alive & F.col("status").isin(*_INACTIVE)).alias("_deact"),
        F.coalesce(
            prev_alive & prev_status.isin(*_INACTIVE) & F.col("is_active"), F.lit(False)
        ).alias("_react"),
    )
    registrations = (
        h.filter(F.col("operation") == "INSERT")
        .groupBy("customer_id")
        .agg(F.min_by("date", "sequence").alias("date"))
        .groupBy("date")
        .agg(F.count(F.lit(1)).cast("long").alias("new_registrations"))
    )
    counts = h.groupBy("date").agg(
        F.sum(F.col("_del").cast("long")).alias("deletions"),
        F.sum(F.col("_deact").cast("long")).alias("deactivations"),
        F.sum(F.col("_react").cast("long")).alias("reactivations"),
    )
    # the state at the end of each date a customer changed: its highest version dated up to then
    by_date = Window.partitionBy("customer_id").orderBy("date")
    ends = (
        h.groupBy("customer_id", "date")
        .agg(F.max("sequence").alias("_day_max"))
        .withColumn(
            "sequence",
            F.max("_day_max").over(by_date.rowsBetween(Window.unboundedPreceding, 0)),
        )
        .join(h.select("customer_id", "sequence", "is_active"), ["customer_id", "sequence"])
        .withColumn("_now", F.col("is_active").cast("long"))
        .withColumn("_was", F.coalesce(F.lag("_now").over(by_date), F.lit(0).cast("long")))
        .groupBy("date")
        .agg(
            F.sum(F.col("_now") - F.col("_was")).alias("_delta"),
            F.sum(((F.col("_was") == 1) & (F.col("_now") == 0)).cast("long")).alias("_lost"),
        )
    )
    zero = F.lit(0).cast("long")
    frame = (
        calendar(h)
        .join(registrations, "date", "left")
        .join(counts, "date", "left")
        .join(ends, "date", "left")
        .select(
            "date",
            *(
                F.coalesce(F.col(c).cast("long"), zero).alias(c)
                for c in (
                    "new_registrations",
                    "deletions",
                    "deactivations",
                    "reactivations",
                    "_delta",
                    "_lost",
                )
            ),
        )
    )
    by_day = Window.orderBy("date")
    frame = frame.withColumn(
        "active_at_end_of_day",
        F.sum("_delta").over(by_day.rowsBetween(Window.unboundedPreceding, 0)),
    ).withColumn("_start", F.coalesce(F.lag("active_at_end_of_day").over(by_day), zero))
    frame = frame.withColumn("churn_pct", percent(F.col("_lost"), F.col("_start")))
    return frame.select(*DAILY_METRICS.schema.names)


def compute_gold(history: DataFrame) -> dict[str, DataFrame]:
    """Every Gold table's content from the history table (table name → lazy frame).

    Args:
        history: ``silver/customer_history`` (every version, every column).
    """
    from pyspark.sql import functions as F

    current = history.filter(F.col("is_current"))
    return {
        ACTIVE_CUSTOMERS.name: active_customers(current),
        ACTIVE_BY_GEO.name: active_by_geo(current),
        STATUS_DISTRIBUTION.name: status_distribution(current),
        DAILY_METRICS.name: daily_metrics(history),
    }


__all__ = ["compute_gold", "daily_metrics", "percent"]
