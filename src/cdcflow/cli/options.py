"""Options shared by the commands, in a module of their own so that a command module that is
imported alone (``cdcflow.cli.sync``, ``cdcflow.cli.schema``) need not import the app."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

#: ``--config`` / ``-c``: the YAML configuration file.
ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="YAML configuration file.", show_default=False)
]
