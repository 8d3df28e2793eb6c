"""``cdcflow validate``: re-check Silver against every table contract (validation parity)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from cdcflow.cli.options import ConfigOption
from cdcflow.config import CdcflowConfig
from cdcflow.errors import UsageError
from cdcflow.model.contracts import TableContract

if TYPE_CHECKING:
    import polars as pl

    from cdcflow.layers.validation import ValidationReport


def read_contract_silver(config: CdcflowConfig, contract: TableContract) -> pl.DataFrame:
    """The Silver rows of ``contract``'s table (its key and declared columns, the sequence
    registers of its not-null columns, ``is_deleted``).

    Raises:
        UsageError: the Silver table does not exist yet.
    """
    from cdcflow.cli.app import existing_table
    from cdcflow.engines.local.delta import scan_table
    from cdcflow.layers.tables import register

    name = contract.table_names.silver
    table = existing_table(config, name, f"validate: table {contract.name}")
    frame = scan_table(table)
    present = frame.collect_schema().names()
    wanted = [c.name for c in contract.columns if c.name in present]
    # the sequence register of a not-null column tells a null no event has set yet
    registers = [register(c.name) for c in contract.attributes if not c.nullable]
    wanted += [r for r in registers if r in present]
    return frame.select([*wanted, "is_deleted"]).collect()


def validate_lakehouse(config: CdcflowConfig) -> ValidationReport:
    """:func:`cdcflow.layers.validation.validate_silver` of every contract of ``config``.

    Raises:
        UsageError: a contract's Silver table does not exist yet.
    """
    from cdcflow.layers.validation import ValidationReport, validate_silver

    contracts = config.contracts()
    silver = {c.name: read_contract_silver(config, c) for c in contracts}
    report = ValidationReport()
    for contract in contracts:
        one = validate_silver(contract, silver[contract.name], silver)
        report.tables.update(one.tables)
        report.violations.extend(one.violations)
    return report


def validate(
    config: ConfigOption,
    output: Annotated[
        str, typer.Option(help="table: a summary and the violations; json: the whole report.")
    ] = "table",
) -> None:
    """Re-check Silver against every table contract: keys (non-null, unique, pattern), each
    column's constraints on live rows, foreign keys. Exit 0 when every rule holds, 1 otherwise.
    """
    from rich.table import Table

    from cdcflow.cli.app import console, load
    from cdcflow.cli.tables import OUTPUTS

    if output not in OUTPUTS:
        raise UsageError(f"--output: expected table or json, got {output!r}")
    cfg = load(config, declared_tables=True)
    report = validate_lakehouse(cfg)
    if output == "json":
        console.print_json(json.dumps(report.to_json()))
    else:
        summary = Table(title="validate", title_justify="left")
        for column in ("table", "rows", "live rows", "violations", "result"):
            summary.add_column(column, justify="left" if column == "table" else "right")
        for name, (rows, live) in report.tables.items():
            broken = sum(1 for v in report.violations if v.table == name)
            summary.add_row(name, str(rows), str(live), str(broken), "FAIL" if broken else "PASS")
        console.print(summary)
        if report.violations:
            detail = Table(title="violations", title_justify="left")
            for column in ("table", "column", "rule", "rows", "detail", "example keys"):
                detail.add_column(column, justify="right" if column == "rows" else "left")
            for v in report.violations:
                detail.add_row(
                    v.table, v.column, v.rule, str(v.rows), v.detail, ", ".join(v.examples)
                )
            console.print(detail)
    if not report.ok:
        raise typer.Exit(1)
