"""Readable result tables for the command line (``gold``, ``as-of``, ``generate``).

A result is a list of rows (column name → value). :func:`print_rows` shows it so that it fits
the output width (:func:`output_width`: the console's, or ``COLUMNS`` when smaller):

* one row: vertically, one ``field | value`` line per column (long values wrap);
* several rows: a table; when its natural width is too wide, column headers are broken after
  an underscore (``new_`` / ``registrations``), and when that is still too wide the last
  columns are left out and the table's caption names them.

Percentages (columns named ``*_pct``) show two decimals; ``None`` shows as an empty cell. The
JSON form of the same rows is :func:`jsonable` (dates and times in ISO-8601).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

Row = Mapping[str, Any]

#: Options of the ``--output`` option of ``gold`` and ``as-of``.
OUTPUTS = ("table", "json")


def output_width(console: Console) -> int:
    """Columns available for a table: the console's width, or ``COLUMNS`` when that is set to
    a smaller number (the console of a command whose output is not a terminal is wider than
    most terminals).

    Args:
        console: the console the table is printed on.

    Returns:
        The width in terminal cells (at least 20).
    """
    columns = os.environ.get("COLUMNS", "").strip()
    width = min(int(columns), console.width) if columns.isdigit() else console.width
    return max(width, 20)


def cell(name: str, value: Any) -> str:
    """Text of one value: empty for None, two decimals for a ``*_pct`` column, ISO-8601 for
    dates and times, ``true``/``false`` for booleans."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and name.endswith("_pct"):
        return f"{value:.2f}"
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def jsonable(value: Any) -> Any:
    """``value`` in a form ``json.dumps`` accepts (dates and times as ISO-8601 strings)."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def _numeric(rows: Sequence[Row], name: str) -> bool:
    values = [row[name] for row in rows if row[name] is not None]
    return bool(values) and all(
        isinstance(v, int | float | Decimal) and not isinstance(v, bool) for v in values
    )


def wrap_header(name: str, width: int) -> str:
    """``name`` on lines of at most ``width`` cells, broken after underscores only.

    Args:
        name: a column name such as ``active_at_end_of_day``.
        width: the wanted line length (a part longer than it gets a line of its own).

    Returns:
        The name with line breaks (``active_at_`` / ``end_of_day`` for width 10).
    """
    parts = [p + "_" for p in name.split("_")]
    parts[-1] = parts[-1][:-1]
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(part) <= width:
            lines[-1] += part
        else:
            lines.append(part)
    return "\n".join(lines)


def _header_width(name: str) -> int:
    parts = name.split("_")
    return max(len(p) + (i < len(parts) - 1) for i, p in enumerate(parts))


def _table(
    title: str | None,
    columns: Sequence[str],
    texts: list[list[str]],
    numeric: dict[str, bool],
    wrap: bool,
) -> Table:
    # as wide as its title: a title wider than a narrow table would wrap ("(1\nrow)")
    table = Table(title=title, title_justify="left", min_width=len(title or ""))
    for i, name in enumerate(columns):
        header = name
        if wrap:
            longest = max((len(row[i]) for row in texts), default=0)
            header = wrap_header(name, max(longest, _header_width(name)))
        table.add_column(header, justify="right" if numeric[name] else "left", no_wrap=True)
    for row in texts:
        table.add_row(*row)
    return table


def _fits(console: Console, table: Table, width: int) -> bool:
    # measured without a limit: Rich clamps a measurement to the width it is given
    measured = Measurement.get(console, console.options.update_width(1_000_000), table)
    return measured.maximum <= width


def vertical_table(title: str | None, row: Row, columns: Sequence[str] | None = None) -> Table:
    """One row as a two-column table: one ``field | value`` line per column (default: the
    row's keys, in order); a long value wraps within the width."""
    table = Table(title=title, title_justify="left")
    table.add_column("field", no_wrap=True)
    table.add_column("value", overflow="fold")
    for name in columns if columns is not None else list(row):
        table.add_row(name, cell(name, row[name]))
    return table


def rows_table(
    console: Console,
    title: str | None,
    rows: Sequence[Row],
    width: int,
    columns: Sequence[str] | None = None,
    more: str = "--output json shows every column",
) -> Table:
    """The rows as a table that fits ``width`` (see the module doc).

    Args:
        console: used to measure the table.
        title: shown above the table.
        rows: the rows (same keys in each).
        width: the available width in cells.
        columns: column names (default: the keys of the first row).
        more: hint added to the caption when columns are left out.

    Returns:
        A Rich table: vertical for a single row, else as many leading columns as fit.
    """
    names = list(columns if columns is not None else (rows[0].keys() if rows else ()))
    if len(rows) == 1:
        return vertical_table(title, rows[0], names)
    texts = [[cell(name, row[name]) for name in names] for row in rows]
    numeric = {name: _numeric(rows, name) for name in names}
    table = _table(title, names, texts, numeric, wrap=False)
    if not names or _fits(console, table, width):
        return table
    shown = len(names)
    while True:
        table = _table(title, names[:shown], [t[:shown] for t in texts], numeric, wrap=True)
        if shown == 1 or _fits(console, table, width):
            break
        shown -= 1
    if shown < len(names):
        hidden = ", ".join(names[shown:])
        table.caption = f"not shown at {width} columns: {hidden} ({more})"
        table.caption_justify = "left"
    return table


def print_rows(
    console: Console,
    title: str | None,
    rows: Sequence[Row],
    columns: Sequence[str] | None = None,
    more: str = "--output json shows every column",
) -> None:
    """Print rows readably at the output width (:func:`rows_table`, :func:`output_width`)."""
    width = output_width(console)
    console.print(rows_table(console, title, rows, width, columns, more), width=width)


__all__ = [
    "OUTPUTS",
    "cell",
    "jsonable",
    "output_width",
    "print_rows",
    "rows_table",
    "vertical_table",
    "wrap_header",
]
