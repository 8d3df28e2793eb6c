"""Options shared by the commands, in a module of their own so that a command module that is
imported alone (``cdcflow.cli.sync``, ``cdcflow.cli.schema``) need not import the app; and the
command classes every command and group uses (:class:`HelpCommand`, :class:`HelpGroup`)."""

from __future__ import annotations

import inspect
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from typer import _click as click
from typer.core import TyperCommand, TyperGroup, TyperOption

#: ``--config`` / ``-c``: the YAML configuration file.
ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="YAML configuration file.", show_default=False)
]


#: ``--wait``: how long a maintenance command waits for a running pipeline's checkpoint lock.
WaitOption = Annotated[
    str,
    typer.Option(
        help="How long to wait for a running pipeline to release the checkpoint lock "
        "(e.g. 10m; 0: fail at once)."
    ),
]


def parse_wait(wait: str) -> timedelta:
    """``--wait`` as a :class:`datetime.timedelta`.

    Raises:
        ConfigError: not a duration (names ``--wait``).
    """
    from cdcflow.config import parse_duration
    from cdcflow.errors import ConfigError

    try:
        return parse_duration(wait)
    except ValueError as exc:
        raise ConfigError(f"--wait: {exc}") from None


def unwrap_help(text: str | None) -> str | None:
    """A command's help with each paragraph on one line (the terminal wraps it).

    Typer keeps a docstring's line breaks, so a paragraph wrapped at the source's line length
    came out broken twice at 80 columns (``... on a terminal`` / ``a live line ...``).
    """
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _flags_as_flags(params: list[click.Parameter]) -> list[click.Parameter]:
    """A flag (``--verify``, ``--vacuum/--no-vacuum``, ``--help``) is shown without a type: it
    takes no value, so ``<bool>`` next to it reads as if it wanted one."""
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    return params


class HelpCommand(TyperCommand):
    """A command whose help reads well: paragraphs unwrapped, flags shown as flags."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = unwrap_help(self.help)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        return _flags_as_flags(super().get_params(ctx))


class HelpGroup(TyperGroup):
    """A command group whose help reads as :class:`HelpCommand`'s does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help = unwrap_help(self.help)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        return _flags_as_flags(super().get_params(ctx))
