"""Logging: JSON lines or one-line text on stderr, and an optional JSON log file.

One output channel per audience: the commands print their human output (tables, progress) on
stdout; the log goes to stderr in the format chosen by the global ``--log-format`` option
(:func:`set_log_format`):

* ``auto`` (default): stderr is a terminal → one-line text, warnings and errors only (a human
  reads stdout, which already shows every result); otherwise (a service, a pipe, a file) →
  JSON lines at ``logging.level``;
* ``json``: JSON lines at ``logging.level``;
* ``text``: one-line text records at ``logging.level``;
* ``none``: nothing on stderr.

``logging.file`` in the configuration also appends JSON lines at ``logging.level`` to a file,
whatever ``--log-format`` says.

Log records carry counts, ids and timings only: attribute values (names, e-mails, phones) and raw
payloads are never logged.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Literal, TextIO, get_args

from pythonjsonlogger.json import JsonFormatter

from cdcflow.errors import ConfigError

LOGGER_NAME = "cdcflow"

LogFormat = Literal["auto", "json", "text", "none"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)

_JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"
_state: dict[str, str] = {"format": "auto"}
# attributes every LogRecord has: the rest came from ``extra=``
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def set_log_format(fmt: str) -> None:
    """Choose the stderr log format of this process (the global ``--log-format`` option).

    Args:
        fmt: ``auto``, ``json``, ``text`` or ``none``.

    Raises:
        ConfigError: any other value.
    """
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"--log-format: expected one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    _state["format"] = fmt


def log_format() -> str:
    """The stderr log format in effect: ``json``, ``text`` or ``none`` (``auto`` resolved)."""
    fmt = _state["format"]
    if fmt != "auto":
        return fmt
    return "text" if is_terminal(sys.stderr) else "json"


def is_terminal(stream: TextIO) -> bool:
    """True when ``stream`` is a terminal (False for a file, a pipe or a closed stream)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (never a stale stream)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ assigns it
        pass


class TextFormatter(logging.Formatter):
    """``<level>: <message> (key=value, ...)`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        """Render a record as one line (line breaks in the message become `` | ``)."""
        message = record.getMessage()
        extras = {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS}
        if extras:
            message += " (" + ", ".join(f"{k}={v}" for k, v in extras.items()) + ")"
        if record.exc_info:
            message += f" [{record.exc_info[0].__name__ if record.exc_info[0] else 'error'}]"
        parts = [part.strip() for part in message.splitlines()]
        return f"{record.levelname.lower()}: " + " | ".join(p for p in parts if p)


def setup_logging(level: str = "INFO", file: str | Path | None = None) -> None:
    """Configure the ``cdcflow`` logger: stderr per :func:`log_format`, plus an optional file.

    Args:
        level: ``logging.level`` of the configuration.
        file: ``logging.file``: append JSON lines there too (empty or None: no file).

    Raises:
        ConfigError: the log file cannot be opened.
    """
    logger = logging.getLogger(LOGGER_NAME)
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    logger.setLevel(level)
    logger.propagate = False
    json_formatter = JsonFormatter(_JSON_FIELDS, timestamp=False)
    fmt = log_format()
    if fmt != "none":
        handler: logging.Handler = _StderrHandler()
        if fmt == "json":
            handler.setFormatter(json_formatter)
        else:
            handler.setFormatter(TextFormatter())
            if _state["format"] == "auto":  # a human at a terminal: only what needs attention
                handler.setLevel(max(logging.WARNING, logging.getLevelName(level)))
        logger.addHandler(handler)
    else:  # a handler that drops everything: else logging's last resort prints warnings
        logger.addHandler(logging.NullHandler())
    if file:
        path = Path(file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            file_handler = logging.FileHandler(path, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"logging.file: cannot open {path} ({exc.strerror})") from None
        file_handler.setFormatter(json_formatter)
        logger.addHandler(file_handler)


def get_logger(name: str) -> logging.Logger:
    """A child of the ``cdcflow`` logger."""
    return logging.getLogger(f"{LOGGER_NAME}.{name}")
