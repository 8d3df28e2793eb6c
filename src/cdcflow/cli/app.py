"""The ``cdcflow`` command.

Errors: a :class:`~cdcflow.errors.CdcflowError` prints one line on stderr and exits with code 2
(the traceback only with ``--debug``); a crash of anything else exits with code 1.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cdcflow.config import CdcflowConfig, load_config
from cdcflow.errors import CdcflowError
from cdcflow.logs import setup_logging

app = typer.Typer(
    name="cdcflow",
    help="Change Data Capture pipeline: landing files -> Bronze -> quarantine -> Silver (Delta).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)
_state = {"debug": False}

ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="YAML configuration file.", show_default=False)
]


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    _state["debug"] = debug


def load(config_path: Path) -> CdcflowConfig:
    """Load the config and set up JSON logging at its level."""
    config = load_config(config_path)
    setup_logging(config.logging.level)
    return config


@app.command()
def run(
    config: ConfigOption,
    trigger: Annotated[
        str,
        typer.Option(help="once | available-now | processing-time=<duration, e.g. 10s>"),
    ] = "available-now",
) -> None:
    """Run the pipeline: landing files -> Bronze/quarantine -> Silver -> audit tables."""
    from cdcflow.cli.render import batch_table
    from cdcflow.pipeline import Pipeline, Trigger

    parsed = Trigger.parse(trigger)
    pipeline = Pipeline(load(config))
    done = []

    def show(report: object) -> None:
        done.append(report)
        if parsed.kind == "processing-time":
            console.print(batch_table([report], title=None))  # type: ignore[list-item]

    reports = pipeline.run(parsed, on_batch=show)
    if parsed.kind != "processing-time":
        if reports:
            console.print(batch_table(reports))
        else:
            console.print("no new landing files")


@app.command()
def generate(
    out: Annotated[Path, typer.Option(help="Landing folder to write into.")] = Path("./landing"),
    events: Annotated[int, typer.Option(min=1, help="Number of source changes.")] = 2000,
    customers: Annotated[int, typer.Option(min=1, help="Number of distinct customers.")] = 300,
    files: Annotated[int, typer.Option(min=1, help="Number of files to split into.")] = 10,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 42,
    duplicate_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.05,
    out_of_order_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.15,
    late_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.02,
    invalid_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.01,
    partial_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.5,
    lsn_notation: Annotated[str, typer.Option(help="postgres | sqlserver | decimal | mixed")] = (
        "postgres"
    ),
    gzip_every: Annotated[int, typer.Option(min=0, help="Gzip every n-th file (0: none).")] = 0,
) -> None:
    """Write realistic JSON-lines CDC event files (with duplicates, late and invalid records)."""
    from cdcflow.generator import GeneratorConfig, generate as write_events

    if lsn_notation not in ("postgres", "sqlserver", "decimal", "mixed"):
        raise CdcflowError(f"--lsn-notation: unknown notation {lsn_notation!r}")
    summary = write_events(
        out,
        GeneratorConfig(
            events=events,
            customers=customers,
            files=files,
            seed=seed,
            duplicate_rate=duplicate_rate,
            out_of_order_rate=out_of_order_rate,
            late_rate=late_rate,
            invalid_rate=invalid_rate,
            partial_rate=partial_rate,
            lsn_notation=lsn_notation,  # type: ignore[arg-type]
            gzip_every=gzip_every,
        ),
    )
    console.print(
        f"wrote {summary.records} records ({summary.valid_events} changes, "
        f"{summary.duplicates} duplicates, {summary.invalid} invalid) "
        f"in {len(summary.files)} files to {out}"
    )


def main() -> None:
    """Console-script entry point."""
    try:
        app(standalone_mode=False)
    except CdcflowError as exc:
        if _state["debug"]:
            traceback.print_exc()
        err_console.print(f"error: {exc}", markup=False, highlight=False)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("aborted")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors and crashes
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if _state["debug"]:
            traceback.print_exc()
        err_console.print(f"error: unexpected {type(exc).__name__}: {exc}", markup=False)
        sys.exit(1)
