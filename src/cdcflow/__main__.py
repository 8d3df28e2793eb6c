"""``python -m cdcflow`` — same as the ``cdcflow`` console script."""

from cdcflow.cli import entry

entry()
