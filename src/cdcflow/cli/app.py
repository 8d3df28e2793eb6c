"""The ``cdcflow`` command.

Errors: a :class:`~cdcflow.errors.CdcflowError` prints one line on stderr (the traceback only
with ``--debug``) and exits with its ``exit_code``: 2 for a usage or configuration error
(:class:`~cdcflow.errors.UsageError`, :class:`~cdcflow.errors.ConfigError`), 1 for any other
failure; a click usage error (unknown option, missing value...) prints one line and exits with
code 2; a crash of anything else prints one line and exits with code 1. Each error is exactly one
line whatever the terminal width (:func:`print_error`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import traceback
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from cdcflow.cli.options import ConfigOption, HelpCommand, HelpGroup
from cdcflow.config import CdcflowConfig, load_config
from cdcflow.errors import CdcflowError, ConfigError, UsageError
from cdcflow.logs import set_log_format, setup_logging
from cdcflow.report import BatchReport

if TYPE_CHECKING:
    from deltalake import DeltaTable

app = typer.Typer(
    name="cdcflow",
    help="Change Data Capture pipeline: landing files -> Bronze -> quarantine -> Silver (Delta).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=HelpGroup,
)
#: Width of the results when stdout is not a terminal (a pipe, a file, a CI log): tables fit
#: 100 columns. A line of text is printed with ``soft_wrap=True``: whole, whatever its length.
PIPED_WIDTH = 100
console = Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)
_state = {"debug": False}


def one_line(text: str) -> str:
    """``text`` as one line: its lines joined with `` | ``, control characters escaped.

    Args:
        text: a message that may span lines (e.g. a delta-rs or pydantic error).

    Returns:
        The message without line breaks (``\\n``, ``\\r``, U+2028...); other control and
        format characters are shown as ``\\xNN`` / ``\\uNNNN``, spaces inside a line are kept.
    """
    parts = [part.strip() for part in text.splitlines()]
    joined = " | ".join(part for part in parts if part)

    def shown(char: str) -> str:
        category = unicodedata.category(char)
        if not category.startswith("C") and category not in ("Zl", "Zp"):
            return char
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return "".join(shown(char) for char in joined)


#: Where an error message of a library starts quoting table rows: delta-rs' "Preview of invalid
#: data:" table after a NOT NULL or CHECK violation.
_ROW_PREVIEWS = ("Preview of invalid data",)


def without_rows(message: str) -> str:
    """``message`` cut where a library starts quoting rows, which may hold personal data (a
    ``pii`` column's values must never reach an error message)."""
    for marker in _ROW_PREVIEWS:
        cut = message.find(marker)
        if cut >= 0:
            message = message[:cut].rstrip() + " (rows not shown: they may hold personal data)"
    return message


#: Terminal colour codes some libraries put in their messages (object_store's "↳" chains).
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: Marks of an object store failure in delta-rs / obstore messages and exception modules.
_OBJECT_STORE = ("Generic S3 error", "Generic MicrosoftAzure error", "Generic GCS error")
#: The longest library message quoted in an unexpected error (an S3 XML body can be long).
_QUOTED = 300


#: A quoted literal in a database's error text.
_LITERAL = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")

#: Where a Rust library's backtrace starts in its error text (delta-rs: ``\n   0: <unknown>``).
_BACKTRACE = re.compile(r"\n\s*(?:Stack backtrace:|0: )")


def unexpected_message(exc: BaseException) -> str:
    """The one-line message of an unexpected exception: its type and text, without table rows,
    colour codes or more than ``_QUOTED`` characters of the library's text; an object store
    failure says which settings to check."""
    text = _ANSI.sub("", without_rows(_BACKTRACE.split(str(exc), maxsplit=1)[0])).strip()
    if len(text) > _QUOTED:
        text = text[:_QUOTED] + "…"
    module = type(exc).__module__ or ""
    if module.startswith("snowflake."):
        # Snowflake quotes the values it cannot convert ("Could not convert string '…' to
        # DECIMAL"): a value may be personal data, never printed (its error number stays)
        text = _LITERAL.sub("'…'", text)
    if module.startswith("obstore") or any(mark in str(exc) for mark in _OBJECT_STORE):
        return (
            f"the object store of storage.root / checkpoint.location failed "
            f"({type(exc).__name__}: {text}); check the bucket or container, the endpoint "
            "(AWS_ENDPOINT_URL, storage.options; AWS_ALLOW_HTTP for http://) and the "
            "credentials (environment variables or storage.options)"
        )
    return f"unexpected {type(exc).__name__}: {text}"


def print_error(message: str) -> None:
    """Write ``error: <message>`` to stderr as exactly one line.

    Plain text, not Rich: Rich wraps at 80 columns when stderr is not a terminal.
    """
    sys.stderr.write(f"error: {one_line(message)}\n")
    sys.stderr.flush()


def _click_exception(exc: BaseException) -> bool:
    """True for Click's ``ClickException`` (Typer may vendor its own copy of Click)."""
    return any(cls.__name__ == "ClickException" for cls in type(exc).__mro__) and hasattr(
        exc, "format_message"
    )


GLOBAL_OPTIONS = ("--debug", "--log-format")


def _usage_message(exc: Exception) -> str:
    message: str = exc.format_message()  # type: ignore[attr-defined]
    ctx = getattr(exc, "ctx", None)
    option = getattr(exc, "option_name", None)
    if type(exc).__name__ == "NoSuchOption" and option in GLOBAL_OPTIONS and ctx is not None:
        names = []
        while ctx.parent is not None:
            names.append(ctx.info_name)
            ctx = ctx.parent
        command = " ".join(reversed(names))
        return (
            f"{option} is an option of cdcflow itself: put it before the command"
            f" (cdcflow {option} ... {command} ...)"
        )
    if ctx is not None and type(exc).__name__ != "ClickException":
        message = f"{message} (see: {ctx.command_path} --help)"
    return message


def _print_version(value: bool) -> None:
    """``cdcflow --version``: the installed package's version, then exit 0."""
    if value:
        from importlib.metadata import version

        typer.echo(f"cdcflow {version('cdcflow')}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format",
            envvar="CDCFLOW_LOG_FORMAT",
            help="Log on stderr: json | text | none | auto (JSON lines when stderr is not a"
            " terminal, else warnings as text). Results and progress always go to stdout.",
        ),
    ] = "auto",
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print cdcflow's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    _state["debug"] = debug
    set_log_format(log_format)


def load(config_path: Path, declared_tables: bool = False) -> CdcflowConfig:
    """Load the config and set up logging (``logging`` section, ``--log-format``).

    Args:
        config_path: the YAML file.
        declared_tables: the command works on declared tables (a ``tables:`` section):
            ``run``, ``validate``, ``generate``, ``reconcile``, ``replay``, ``as-of``, ``sync``,
            ``optimize`` and ``schema``; ``gold`` (the customers analytics of the brief) works
            on the shipped customers tables only.

    Raises:
        ConfigError: the file is invalid, or it declares tables and the command does not
            work on them yet.
    """
    config = load_config(config_path)
    if config.tables and not declared_tables:
        raise ConfigError(
            f"{config_path}: key 'tables': this command works on the shipped customers tables "
            "only (a config without tables:); declared tables work with `cdcflow run`, "
            "`generate`, `reconcile`, `replay`, `as-of`, `validate`, `schema`, `optimize` and "
            "`sync snowflake`"
        )
    setup_logging(config.logging.level, config.logging.file)
    return config


def existing_table(config: CdcflowConfig, name: str, command: str) -> DeltaTable:
    """The latest version of the Delta table ``name`` under ``storage.root``, for a command
    that reads what the pipeline wrote.

    Raises:
        UsageError: no such table yet: the pipeline has not run, or ``storage.root`` names
            another folder (the message names the table, the root and ``command``).
        ConfigError: a file stands where ``storage.root``'s folders would be.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from cdcflow.engines.local.delta import local_path, unwritable_root

    uri = config.table_uri(name)
    try:
        return DeltaTable(uri, storage_options=config.storage.options or None)
    except TableNotFoundError as exc:
        path = local_path(uri)
        in_the_way = path is not None and any(p.is_file() for p in (path, *path.parents))
        if in_the_way:  # a file where storage.root's folders would be: say so, as a run does
            raise unwritable_root(uri, exc) from None
        raise UsageError(
            f"{command}: {name} does not exist under storage.root {config.storage.root} yet "
            "(run the pipeline first, or check storage.root)"
        ) from None


@app.command(cls=HelpCommand)
def run(
    config: ConfigOption,
    trigger: Annotated[
        str,
        typer.Option(help="once | available-now | processing-time=<duration, e.g. 10s>"),
    ] = "available-now",
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="serve Prometheus metrics on http://<metrics-host>:<port>/metrics while running",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option(help="the address the metrics endpoint listens on")
    ] = "127.0.0.1",
) -> None:
    """Run the pipeline: landing files -> Bronze/quarantine -> Silver -> audit tables.

    Prints one summary per micro-batch on stdout: a table at the end (``once``,
    ``available-now``) or one line per batch as it commits (``processing-time``); on a terminal
    a live line shows the batches, files, records and events/s so far. With ``--metrics-port``
    a Prometheus endpoint serves the run's counters (cdcflow.layers.metrics).
    """
    from cdcflow.cli.progress import working
    from cdcflow.cli.render import RunTotals, batch_line, batch_table
    from cdcflow.pipeline import Pipeline, Trigger
    from cdcflow.state.checkpoint import BatchOffsets

    parsed = Trigger.parse(trigger)
    settings = load(config, declared_tables=True)
    metrics = None
    if metrics_port is not None:
        from cdcflow.layers.metrics import PipelineMetrics, serve

        metrics = PipelineMetrics(settings)
        serve(metrics, metrics_port, metrics_host)
        from cdcflow.logs import get_logger

        url = f"http://{metrics_host}:{metrics_port}/metrics"
        get_logger("metrics").info("metrics endpoint", extra={"url": url})
        console.print(f"metrics: {url}", markup=False, highlight=False, soft_wrap=True)
    try:
        pipeline = Pipeline(settings)
    except ConfigError as exc:  # a setting the run cannot honour: name the file too
        raise ConfigError(f"{config}: {exc}") from None
    continuous = parsed.kind == "processing-time"
    totals = RunTotals()
    label = "waiting for landing files" if continuous else "micro-batches"
    with working(label, unit="batches") as work:

        def show(report: BatchReport) -> None:
            if metrics is not None:
                metrics.observe(report)
            totals.add(report)
            work.update(completed=totals.batches, detail=totals.detail(), label=label)
            if continuous:
                work.step(batch_line(report))

        def recovering(batch_id: int) -> None:
            work.step(
                f"recovering micro-batch {batch_id}: an earlier run stopped before committing"
                " it; re-running it with its recorded files"
            )

        def starting(offsets: BatchOffsets) -> None:
            files = len(offsets.files)
            work.update(label=f"micro-batch {offsets.batch_id}: {files} file{'s'[: files != 1]}")

        def stopping() -> None:
            work.step(
                "stop requested: the run stops once the micro-batch in progress, if any, is "
                "committed"
            )

        reports = pipeline.run(
            parsed, on_batch=show, on_recover=recovering, on_start=starting, on_stop=stopping
        )
    # declared tables: the contract changes this run applied and recorded (audit/schema_log)
    for line in getattr(pipeline.engine, "schema_changes", []):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if not continuous:
        if reports:
            console.print(batch_table(reports))
        elif pipeline.config.source.type == "kafka":
            topics = getattr(pipeline.source, "matched_topics", None)
            kafka = pipeline.config.source.kafka
            asked = kafka.topic_pattern or ", ".join(kafka.topics)
            if not topics:
                console.print(
                    f"no Kafka topic matches source.kafka ({asked}) at "
                    f"{kafka.bootstrap_servers}: check topics / topic_pattern",
                    soft_wrap=True,
                    markup=False,
                )
            else:
                console.print(
                    f"no new records in {len(topics)} Kafka topic(s) matching {asked}",
                    soft_wrap=True,
                    markup=False,
                )
        else:
            folder = Path(pipeline.config.source.path)
            missing = "" if folder.is_dir() else " (the folder does not exist)"
            console.print(f"no new landing files in {folder}{missing}", soft_wrap=True)


from cdcflow.cli.asof import as_of  # noqa: E402
from cdcflow.cli.maintenance import gold, optimize  # noqa: E402

app.command("as-of", cls=HelpCommand)(as_of)
app.command(cls=HelpCommand)(gold)
app.command(cls=HelpCommand)(optimize)

from cdcflow.cli.catalog import catalog  # noqa: E402
from cdcflow.cli.demo import demo  # noqa: E402
from cdcflow.cli.generate import generate  # noqa: E402
from cdcflow.cli.lag import lag  # noqa: E402
from cdcflow.cli.reconcile import reconcile  # noqa: E402
from cdcflow.cli.replay import replay  # noqa: E402
from cdcflow.cli.report import report  # noqa: E402
from cdcflow.cli.status import status  # noqa: E402

app.command(cls=HelpCommand)(generate)
app.command(cls=HelpCommand)(reconcile)
app.command(cls=HelpCommand)(replay)
app.command(cls=HelpCommand)(demo)
app.command(cls=HelpCommand)(lag)
app.command(cls=HelpCommand)(status)
app.command(cls=HelpCommand)(report)
app.command(cls=HelpCommand)(catalog)

from cdcflow.cli.erase import erase  # noqa: E402
from cdcflow.cli.validate import validate  # noqa: E402

app.command(cls=HelpCommand)(validate)
app.command(cls=HelpCommand)(erase)

from cdcflow.cli.source_workload import source_workload  # noqa: E402
from cdcflow.cli.sync import sync_app  # noqa: E402

app.command("source-workload", cls=HelpCommand)(source_workload)

app.add_typer(sync_app)

from cdcflow.cli.schema import schema_app  # noqa: E402

app.add_typer(schema_app)


def entry() -> None:
    """The ``cdcflow`` console script (and ``python -m cdcflow``): :func:`main`, then exit
    without the interpreter's finalization.

    A process that read a Delta table through delta-rs' PyArrow dataset can abort while the
    interpreter shuts down (``terminate called without an active exception``, exit 134: a
    PyArrow I/O thread still attached to delta-rs' Python file system; delta-io/delta-rs#2184,
    apache/arrow#34314) — after its work and its one-line message, but with the wrong exit
    code. Every write is committed before :func:`main` returns, so the streams and log handlers
    are flushed here and the process leaves with ``os._exit`` and the command's exit code.
    """
    code = 0
    try:
        main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # sys.exit("message"): printed like the interpreter does
            print(exc.code, file=sys.stderr)
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        logging.shutdown()
        emulator = sys.modules.get("cdcflow.sinks.snowflake.connection")
        if emulator is not None:  # the exit handlers do not run: remove its stage folders here
            with contextlib.suppress(Exception):
                emulator.remove_stage_folders()
    os._exit(code)


def main() -> None:
    """The command line: run the command, print an error in one line; exit codes 0 (done),
    1 (failed), 2 (usage or configuration), 130 (interrupted)."""
    try:
        code = app(standalone_mode=False)
        if code == 130:  # Typer turns a Ctrl-C (KeyboardInterrupt) into Exit(130)
            print_error("aborted")
        if isinstance(code, int) and code:  # typer.Exit(n) returns n outside standalone mode
            sys.exit(code)
    except CdcflowError as exc:
        if _state["debug"]:
            traceback.print_exc()
        print_error(str(exc))
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print_error("aborted")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors and crashes
        if _click_exception(exc):
            if type(exc).__name__ == "NoArgsIsHelpError":  # `cdcflow` alone: the help is shown
                sys.exit(2)
            if _state["debug"]:
                traceback.print_exc()
            print_error(_usage_message(exc))
            sys.exit(int(getattr(exc, "exit_code", 2)))
        if _state["debug"]:
            traceback.print_exc()
        print_error(unexpected_message(exc))
        sys.exit(1)
