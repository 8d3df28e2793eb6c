"""``cdcflow source-workload``: run a realistic transactional workload on a PostgreSQL table.

See :mod:`cdcflow.sources.postgres_workload` for the transaction mix. The connection comes from
``--dsn`` (or ``CDCFLOW_PG_DSN``); a password belongs in ``PGPASSWORD`` or ``~/.pgpass``, not in
the DSN, and is never printed.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from cdcflow.cli.app import console
from cdcflow.cli.progress import working
from cdcflow.errors import UsageError
from cdcflow.sources.postgres import PostgresSourceError, require_psycopg


def source_workload(
    dsn: Annotated[
        str,
        typer.Option(
            envvar="CDCFLOW_PG_DSN",
            help="libpq connection string or URI (password via PGPASSWORD or ~/.pgpass).",
            show_default=False,
        ),
    ],
    customers: Annotated[int, typer.Option(min=0, help="Customers registered first.")] = 100,
    transactions: Annotated[int, typer.Option(min=0, help="Mixed transactions after.")] = 1000,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 7,
    table: Annotated[str, typer.Option(help="Source table (created when missing).")] = "customers",
    replica_identity: Annotated[
        str, typer.Option(help="Replica identity of the table: default | full.")
    ] = "default",
) -> None:
    """Run registrations, address/e-mail/status changes, GDPR deletions, re-registrations."""
    from cdcflow.sources.postgres_workload import REGISTRATION_BATCH, run_workload

    if replica_identity not in ("default", "full"):
        raise UsageError(f"--replica-identity: expected default or full, got {replica_identity!r}")
    psycopg = require_psycopg()
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise PostgresSourceError(f"cannot connect to PostgreSQL: {str(exc).strip()}") from None
    total = -(-customers // REGISTRATION_BATCH) + transactions
    try:
        with working("source workload", total=total, unit="transactions") as work:
            summary = run_workload(
                conn,
                customers,
                transactions,
                seed=seed,
                table=table,
                replica_identity=replica_identity,
                progress=work.advance,
            )
    except psycopg.Error as exc:
        raise PostgresSourceError(f"workload failed: {str(exc).strip()}") from None
    finally:
        conn.close()
    out = Table(title=f"source workload on {table}")
    out.add_column("transaction kind")
    out.add_column("count", justify="right")
    for kind, n in sorted(summary.kinds.items()):
        out.add_row(kind, str(n))
    out.add_row("committed transactions", str(summary.transactions))
    out.add_row("rolled back", str(summary.rolled_back))
    out.add_row("row changes committed", str(summary.statements))
    out.add_row("live customers", str(summary.live_customers))
    console.print(out)
