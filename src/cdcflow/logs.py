"""JSON logging (python-json-logger) to stderr.

Log records carry counts, ids and timings only: attribute values (names, e-mails, phones) and raw
payloads are never logged.
"""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

LOGGER_NAME = "cdcflow"


def setup_logging(level: str = "INFO") -> None:
    """Send the ``cdcflow`` logger's records to stderr as one JSON object per line."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s", timestamp=False)
    )
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def get_logger(name: str) -> logging.Logger:
    """A child of the ``cdcflow`` logger."""
    return logging.getLogger(f"{LOGGER_NAME}.{name}")
