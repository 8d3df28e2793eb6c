"""Log Sequence Number (LSN) notations, all mapped to one numeric order.

Supported notations (the raw text is never compared, only the number):

* PostgreSQL ``X/Y`` — two hexadecimal numbers of any width; value ``(X << 32) + Y``
  (PostgreSQL docs, "pg_lsn Type").
* SQL Server ``xxxxxxxx:xxxxxxxx:xxxx`` — three hexadecimal fields (VLF sequence, log block,
  slot), any case; value ``(a << 48) | (b << 16) | c`` (SQL Server CDC ``__$start_lsn``).
* Decimal — a non-negative integer given as a JSON number or as a string of digits.

Numbers are limited to 128 bits so that :func:`lsn_key` is a fixed-width (32 hex digits) string
whose plain string order is the numeric order, which every engine compares the same way.
"""

from __future__ import annotations

import re

#: The notations as regular expressions (same text in Python ``re`` and Java regex, so the Spark
#: rendering of the rules uses these very patterns).
PG_PATTERN = r"^([0-9A-Fa-f]+)/([0-9A-Fa-f]+)$"
MSSQL_PATTERN = r"^([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,4})$"
DECIMAL_PATTERN = r"^[0-9]+$"
_PG = re.compile(PG_PATTERN)
_MSSQL = re.compile(MSSQL_PATTERN)
_DECIMAL = re.compile(DECIMAL_PATTERN)
MAX_LSN = (1 << 128) - 1
LSN_KEY_WIDTH = 32


class LsnError(ValueError):
    """The value is not an LSN in any supported notation (reason ``INVALID_LSN``).

    The message says what kind of value it is, never the value itself (a bad record may carry
    personal data in any field).
    """


def parse_lsn(value: object) -> int:
    """Return the numeric position of an LSN given in any supported notation.

    Args:
        value: a JSON value: a string (``"0/16B3748"``, ``"00000028:000001bc:0001"``,
            ``"24023128"``; surrounding spaces ignored) or a non-negative JSON integer.

    Returns:
        The LSN as a non-negative integer below 2**128.

    Raises:
        LsnError: not a supported notation, negative, fractional, boolean or too large.
    """
    if isinstance(value, bool):
        raise LsnError("a boolean is not an LSN")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str):
        text = value.strip()
        if m := _PG.match(text):
            number = (int(m.group(1), 16) << 32) + int(m.group(2), 16)
        elif m := _MSSQL.match(text):
            number = (int(m.group(1), 16) << 48) | (int(m.group(2), 16) << 16) | int(m.group(3), 16)
        elif _DECIMAL.match(text):
            if len(text.lstrip("0")) > len(str(MAX_LSN)):
                raise LsnError("LSN out of range (0 .. 2**128-1)")
            number = int(text)
        else:
            raise LsnError(
                "not a supported LSN notation (PostgreSQL X/Y, SQL Server "
                "xxxxxxxx:xxxxxxxx:xxxx or a decimal integer)"
            )
    else:
        kind = {dict: "an object", list: "an array", float: "a fraction"}.get(type(value))
        raise LsnError(f"LSN must be a string or an integer, not {kind or type(value).__name__}")
    if number < 0 or number > MAX_LSN:
        raise LsnError("LSN out of range (0 .. 2**128-1)")
    return number


def lsn_key(number: int) -> str:
    """Fixed-width lowercase hex text of an LSN number: string order equals numeric order."""
    return f"{number:0{LSN_KEY_WIDTH}x}"


def format_pg_lsn(number: int) -> str:
    """Render a number in PostgreSQL ``X/Y`` notation (upper-case hex, no padding)."""
    return f"{number >> 32:X}/{number & 0xFFFFFFFF:X}"


def format_mssql_lsn(number: int) -> str:
    """Render a number below 2**80 in SQL Server ``xxxxxxxx:xxxxxxxx:xxxx`` notation."""
    return f"{number >> 48:08x}:{(number >> 16) & 0xFFFFFFFF:08x}:{number & 0xFFFF:04x}"
