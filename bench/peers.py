"""cdcflow against the tools a user would pick instead, on one data set (a benchmark, not a test).

Usage::

    .venv/bin/python bench/peers.py          # 1,000,000 events / 100,000 customers / 20 files
    .venv/bin/python bench/peers.py --events 100000 --customers 10000 --files 20
    uv run --with 'dlt[duckdb]' python bench/peers.py --peers duckdb,dlt,cdcflow

One data set (``cdcflow generate``: re-deliveries, late and out-of-order events, partial
updates, deletes and invalid records; decimal LSNs, so every peer can order by them), then each
peer in a process of its own, over the same landing files, one micro-batch (transaction) per
file, in landing order:

* ``duckdb`` — the simplest correct-looking DuckDB loop a user would write: per file
  ``read_json`` (``ignore_errors``) into a staging table, drop records without a key, an
  operation or an LSN, keep the latest change per key by numeric LSN (``QUALIFY
  row_number()``), then one ``MERGE INTO`` guarded by the LSN (update when newer, absent
  columns of a partial update kept with ``COALESCE``, a DELETE sets ``is_deleted``, insert
  when new), one transaction per file.
* ``dlt`` — a dlt ``merge`` pipeline (``delete-insert`` into DuckDB, Arrow items, primary key
  ``customer_id``, ``dedup_sort`` on the LSN), one ``pipeline.run`` per file. Needs dlt
  (``uv run --with 'dlt[duckdb]' ...``); skipped with that hint when it is missing.
* ``cdcflow`` — the local engine, ``max_files_per_trigger: 1``, soft deletes.

Each result is compared with the expected state (the reference fold of everything delivered,
written by the generator): a customer is wrong when its live/deleted state or any attribute
differs. Printed (and written to ``bench/results/<UTC time>-peers.json``): wall seconds,
events/s, peak RSS of the peer's process (psutil, every 50 ms), customers wrong, and the
ratio of each peer's events/s to cdcflow's.

The peers' code is the plain version a data engineer would write first, not a straw man: it
dedups, orders by the numeric LSN within a batch and guards the MERGE by LSN. What it lacks is
what cdcflow's contract adds: per-column sequences (a partial UPDATE's absent columns are not
nulls), tombstones that outlive a late UPDATE, and duplicate conflicts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from cdcflow.engines.local.delta import read_arrow

RESULTS = Path(__file__).resolve().parent / "results"
ATTRIBUTES = ("customer_name", "email", "phone", "city", "country", "status")
PEERS = ("duckdb", "dlt", "cdcflow")


# ------------------------------------------------------------------------------ the peers
def run_duckdb(landing: Path, work: Path) -> dict[str, dict[str, Any]]:
    """The DuckDB ``MERGE INTO`` loop (module doc); returns customer_id → state."""
    import duckdb

    con = duckdb.connect(str(work / "duckdb-peer.db"))
    attrs = ", ".join(f"{a} VARCHAR" for a in ATTRIBUTES)
    con.execute(
        f"CREATE TABLE customers (customer_id VARCHAR PRIMARY KEY, {attrs}, "
        "is_deleted BOOLEAN, lsn HUGEINT)"
    )
    columns = {
        "event_id": "VARCHAR",
        "customer_id": "VARCHAR",
        "operation": "VARCHAR",
        "event_timestamp": "VARCHAR",
        **{a: "VARCHAR" for a in ATTRIBUTES},
        "metadata": "STRUCT(lsn VARCHAR, source_table VARCHAR, tx_id VARCHAR)",
    }
    # a partial UPDATE carries only some columns: keep the others (COALESCE)
    set_attrs = ", ".join(f"{a} = COALESCE(s.{a}, t.{a})" for a in ATTRIBUTES)
    for path in sorted(landing.glob("events-*.jsonl")):
        con.execute("BEGIN")
        con.execute(
            "CREATE OR REPLACE TEMP TABLE batch AS SELECT *, "
            "TRY_CAST(metadata.lsn AS HUGEINT) AS lsn, upper(trim(operation)) AS op "
            "FROM read_json(?, format = 'newline_delimited', columns = ?, ignore_errors = true)",
            [str(path), columns],
        )
        con.execute(
            "CREATE OR REPLACE TEMP TABLE latest AS SELECT * FROM batch "
            "WHERE customer_id IS NOT NULL AND lsn IS NOT NULL "
            "AND op IN ('INSERT', 'UPDATE', 'DELETE') "
            "QUALIFY row_number() OVER (PARTITION BY customer_id ORDER BY lsn DESC) = 1"
        )
        con.execute(
            "MERGE INTO customers t USING latest s ON t.customer_id = s.customer_id "
            "WHEN MATCHED AND s.lsn > t.lsn AND s.op = 'DELETE' THEN "
            "UPDATE SET is_deleted = true, status = 'DELETED', lsn = s.lsn "
            f"WHEN MATCHED AND s.lsn > t.lsn THEN UPDATE SET {set_attrs}, is_deleted = false, "
            "lsn = s.lsn "
            "WHEN NOT MATCHED AND s.op <> 'DELETE' THEN INSERT "
            f"(customer_id, {', '.join(ATTRIBUTES)}, is_deleted, lsn) VALUES "
            f"(s.customer_id, {', '.join('s.' + a for a in ATTRIBUTES)}, false, s.lsn)"
        )
        con.execute("COMMIT")
    rows = con.execute(
        f"SELECT customer_id, {', '.join(ATTRIBUTES)}, is_deleted FROM customers"
    ).fetchall()
    con.close()
    return {r[0]: dict(zip((*ATTRIBUTES, "is_deleted"), r[1:], strict=True)) for r in rows}


def run_dlt(landing: Path, work: Path) -> dict[str, dict[str, Any]]:
    """The dlt ``merge`` pipeline (module doc); returns customer_id → state."""
    import dlt
    import duckdb
    import polars as pl

    pipeline = dlt.pipeline(
        pipeline_name="peers",
        destination=dlt.destinations.duckdb(str(work / "dlt-peer.duckdb")),
        dataset_name="cdc",
        pipelines_dir=str(work / "dlt-pipelines"),
    )
    columns = {
        "customer_id": "VARCHAR",
        "operation": "VARCHAR",
        **{a: "VARCHAR" for a in ATTRIBUTES},
        "metadata": "STRUCT(lsn VARCHAR)",
    }
    for path in sorted(landing.glob("events-*.jsonl")):
        # the file's records as Arrow (DuckDB's reader skips the lines that are not JSON)
        read = duckdb.sql(
            "SELECT customer_id, upper(trim(operation)) AS op, "
            f"{', '.join(ATTRIBUTES)}, TRY_CAST(metadata.lsn AS BIGINT) AS lsn "
            f"FROM read_json('{path}', format = 'newline_delimited', columns = {columns}, "
            "ignore_errors = true)"
        ).arrow()
        frame = pl.DataFrame(pl.from_arrow(read)).filter(
            pl.col("customer_id").is_not_null()
            & pl.col("lsn").is_not_null()
            & pl.col("op").is_in(["INSERT", "UPDATE", "DELETE"])
        )
        items = frame.select(
            "customer_id",
            *ATTRIBUTES[:-1],
            pl.when(pl.col("op") == "DELETE")
            .then(pl.lit("DELETED"))
            .otherwise(pl.col("status"))
            .alias("status"),
            (pl.col("op") == "DELETE").alias("is_deleted"),
            "lsn",
        )
        resource = dlt.resource(
            items.to_arrow(),
            name="customers",
            primary_key="customer_id",
            write_disposition={"disposition": "merge", "strategy": "delete-insert"},
            columns={"lsn": {"dedup_sort": "desc"}},
        )
        pipeline.run(resource)
    with pipeline.sql_client() as client:
        rows = client.execute_sql(
            f"SELECT customer_id, {', '.join(ATTRIBUTES)}, is_deleted FROM customers"
        )
    return {r[0]: dict(zip((*ATTRIBUTES, "is_deleted"), r[1:], strict=True)) for r in rows}


def run_cdcflow(landing: Path, work: Path) -> dict[str, dict[str, Any]]:
    """The cdcflow local engine, one micro-batch per file; returns customer_id → state."""
    import polars as pl
    from deltalake import DeltaTable

    from cdcflow.config import CdcflowConfig
    from cdcflow.pipeline import Pipeline, Trigger

    config = CdcflowConfig(
        storage={"root": str(work / "lake")},
        source={"path": str(landing), "max_files_per_trigger": 1},
        checkpoint={"location": str(work / "lake" / "_checkpoints" / "customers")},
        logging={"level": "WARNING"},
    )
    Pipeline(config).run(Trigger.parse("available-now"))
    silver = pl.from_arrow(read_arrow(DeltaTable(config.table_uri("silver/customers"))))
    assert isinstance(silver, pl.DataFrame)
    return {
        r["customer_id"]: {k: r[k] for k in (*ATTRIBUTES, "is_deleted")} for r in silver.to_dicts()
    }


RUNNERS = {"duckdb": run_duckdb, "dlt": run_dlt, "cdcflow": run_cdcflow}


# ------------------------------------------------------------------------------ harness
def _child(peer: str, landing: Path, work: Path, out: Path) -> None:
    """Run one peer in this process; write its state and wall seconds to ``out``."""
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    state = RUNNERS[peer](landing, work)
    seconds = time.perf_counter() - started
    out.write_text(json.dumps({"seconds": seconds, "state": state}, default=str))


def _measure(peer: str, landing: Path, work: Path) -> dict[str, Any]:
    """Run ``peer`` in a child process; sample its peak RSS (children included)."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"{peer}.json"
    child = subprocess.Popen(
        [
            *(sys.executable, __file__, "--child", peer),
            *("--landing", str(landing), "--work", str(work), "--out", str(out)),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    proc, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        try:
            rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.05)
    if child.returncode != 0:
        stderr = child.stderr.read() if child.stderr else ""
        return {"peer": peer, "error": stderr.strip().splitlines()[-1] if stderr else "failed"}
    result = json.loads(out.read_text())
    return {"peer": peer, "seconds": result["seconds"], "peak_rss": peak, "state": result["state"]}


def wrong_customers(state: dict[str, dict[str, Any]], expected: dict[str, dict[str, Any]]) -> int:
    """Customers whose state differs from the expected one (missing and extra ones included)."""
    wrong = 0
    for key in set(state) | set(expected):
        got, want = state.get(key), expected.get(key)
        if got is None or want is None or any(got[c] != want[c] for c in want):
            wrong += 1
    return wrong


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--customers", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--peers", default=",".join(PEERS), help="comma-separated: " + ", ".join(PEERS)
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--landing", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, Path(args.landing), Path(args.work), Path(args.out))
        return
    import polars as pl

    import cdcflow.cli.app  # noqa: F401 - the CLI modules import each other through it
    from cdcflow.cli.generate import write_expected
    from cdcflow.generator import GeneratorConfig, generate

    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)}")
    work = Path(tempfile.mkdtemp(prefix="cdcflow-peers-"))
    landing = work / "landing"
    print(
        f"generating {args.events:,} events over {args.customers:,} customers in {work}",
        file=sys.stderr,
    )
    summary = generate(
        landing,
        GeneratorConfig(
            events=args.events,
            customers=args.customers,
            files=args.files,
            seed=args.seed,
            lsn_notation="decimal",
        ),
    )
    write_expected(summary, work / "expected.parquet", work / "expected.counts.json", "soft")
    expected = {
        r["customer_id"]: {k: r[k] for k in (*ATTRIBUTES, "is_deleted")}
        for r in pl.read_parquet(work / "expected.parquet").to_dicts()
    }
    del summary
    results = []
    for peer in peers:
        if peer == "dlt":
            try:
                import dlt  # noqa: F401
            except ImportError:
                results.append(
                    {
                        "peer": "dlt",
                        "error": "dlt not installed: uv run --with 'dlt[duckdb]' "
                        "python bench/peers.py",
                    }
                )
                continue
        print(f"running {peer}", file=sys.stderr)
        result = _measure(peer, landing, work / peer)
        if "state" in result:
            result["wrong"] = wrong_customers(result.pop("state"), expected)
            result["events_per_s"] = args.events / result["seconds"]
        results.append(result)
    base = next(
        (r["events_per_s"] for r in results if r["peer"] == "cdcflow" and "events_per_s" in r), None
    )
    print(
        f"\n{args.events:,} events, {args.customers:,} customers, {args.files} files "
        "(one micro-batch each)"
    )
    print(f"{'peer':<10}{'wall s':>9}{'events/s':>11}{'peak RSS':>11}{'wrong':>9}{'× cdcflow':>11}")
    for r in results:
        if "error" in r:
            print(f"{r['peer']:<10}  {r['error']}")
            continue
        ratio = f"{r['events_per_s'] / base:.2f}" if base else "-"
        print(
            f"{r['peer']:<10}{r['seconds']:>9.1f}{r['events_per_s']:>11,.0f}"
            f"{r['peak_rss'] / 2**30:>9.2f} GB{r['wrong']:>9,}{ratio:>11}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS / f"{stamp}-peers.json"
    params = {
        "events": args.events,
        "customers": args.customers,
        "files": args.files,
        "seed": args.seed,
    }
    path.write_text(json.dumps({"params": params, "results": results}, indent=1) + "\n")
    print(f"written to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
