"""The README's and the docs' shell commands, run as pasted on a fresh copy of the checkout.

Every ```bash block of README.md and docs/*.md runs, in document order (README first: the
docs continue from its lakehouse), one command at a time, in a copy of the checkout's files
(tracked and untracked, nothing ignored: no .venv, no lakehouse, no .pgdata), with a PATH a
new user has: without ~/.local/bin (where `make` installs uv) and without the test suite's own
virtual environment. Nothing is skipped; the few adaptations are listed in ``ADAPTATIONS``:

* ``make test`` is not run again: it is the command running this test;
* the benchmarks run with small sizes (same code paths, seconds instead of minutes; a
  continuous phase of 5 s); a
  benchmark command that becomes the same command line as one already run (the docs show one
  benchmark at several sizes, and in more than one doc) runs once;
* ``pytest`` commands collect their tests (``--collect-only``): the same tests run in this suite;
* a continuous command (``--continuous``, ``--trigger processing-time=…``) runs until its first
  round has printed, then gets SIGINT and must stop cleanly (exit 0);
* files a command names as the reader's own (``cdcflow.yaml``: a configuration;
  ``customers.csv``: an export of the source table) are written first: the shipped dev config,
  and the non-deleted rows of the generator's expected state (``expected.parquet``);
* PostgreSQL runs on a free port of its own (``CDCFLOW_PG_PORT``), not the suite's server, and
  its data folder is deleted afterwards; so do Kafka and Kafka Connect (``CDCFLOW_KAFKA_PORT``,
  ``CDCFLOW_KAFKA_CONTROLLER_PORT``, ``CDCFLOW_CONNECT_PORT``), stopped afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO
from tests.ports import unused_port

pytestmark = pytest.mark.docs

#: README first (the docs continue from its lakehouse), then the docs in reading order; a new
#: docs/*.md is picked up at the end.
FIRST_DOCS = [
    "README.md",
    "docs/spark.md",
    "docs/performance.md",
    "docs/recovery_playbook.md",
    "docs/snowflake.md",
    "docs/history_and_gold.md",
    "docs/postgres.md",
]
DOCS = FIRST_DOCS + sorted(
    str(p.relative_to(REPO))
    for p in (REPO / "docs").glob("*.md")
    if str(p.relative_to(REPO)) not in FIRST_DOCS
)

ADAPTATIONS = {
    "make test": "not run: it is the command running this test",
    "bench/bench_*.py": "small sizes: --events 500 --customers 50 --files 2 (and a given "
    "--continuous: 5 s); each line once",
    "pytest": "--collect-only: the same tests run in this suite",
    "--continuous / processing-time=": "SIGINT after the first round; must exit 0",
}
SMALL_BENCH = {"--events": "500", "--customers": "50", "--files": "2"}
#: Benchmark options made small only where a command gives them (not every benchmark has them).
SMALL_WHERE_GIVEN = {"--continuous": "5"}
TIMEOUT_S = 1200


def command_blocks(doc: Path) -> list[list[str]]:
    """The ```bash / ```sh / ```shell blocks of ``doc``, as lists of commands (comment-only
    lines dropped, backslash continuations joined)."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in doc.read_text(encoding="utf-8").splitlines():
        fence = line.strip()
        if current is None:
            if re.fullmatch(r"```(bash|sh|shell|console)", fence):
                current = []
            continue
        if fence == "```":
            blocks.append(current)
            current = None
            continue
        if current and current[-1].endswith("\\"):
            current[-1] = current[-1][:-1] + " " + line.strip()
        elif line.strip() and not line.strip().startswith("#"):
            current.append(line.strip())
    return blocks


def without_comment(command: str) -> str:
    """The command without its trailing ``# comment`` (a ``#`` after a blank, outside quotes)."""
    quote = ""
    for i, char in enumerate(command):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i].rstrip()
    return command.strip()


def adapt(command: str) -> tuple[str, str]:
    """(how to run it: "run" | "benchmark" | "skip-self" | "continuous", the command line to
    run); a benchmark runs like "run", once per command line (:func:`run_command`)."""
    bare = without_comment(command)
    if bare == "make test":
        return "skip-self", bare
    if re.search(r"bench/(bench_\w+|peers)\.py", bare):
        bare = " ".join(bare.split())  # one spelling per command line (continuations joined)
        for flag, value in SMALL_BENCH.items():
            if re.search(rf"{flag}\s+\d+", bare):
                bare = re.sub(rf"{flag}\s+\d+", f"{flag} {value}", bare)
            else:
                bare += f" {flag} {value}"
        for flag, value in SMALL_WHERE_GIVEN.items():
            bare = re.sub(rf"{flag}\s+\d+", f"{flag} {value}", bare)
        return "benchmark", bare
    if re.search(r"(^|\s|/)pytest(\s|$)", bare):
        return "run", bare + " --collect-only"
    if "--continuous" in bare or "processing-time=" in bare:
        return "continuous", bare
    return "run", bare


def user_env(workdir: Path) -> dict[str, str]:
    """A new user's environment: no ~/.local/bin, no virtual environment, no cdcflow settings."""
    home_bin = str(Path.home() / ".local" / "bin")
    venv = os.environ.get("VIRTUAL_ENV", "")
    drop = {home_bin, str(REPO / ".venv" / "bin")} | ({f"{venv}/bin"} if venv else set())
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in drop]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CDCFLOW_", "SNOWFLAKE_", "PYTEST_", "UV_RUN"))
        and k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYSPARK_PYTHON", "MAKEFLAGS", "MAKELEVEL"}
    }
    env["PATH"] = os.pathsep.join(path)
    env["CDCFLOW_PG_PORT"] = str(unused_port())
    # Kafka, its controller and Connect of docs/kafka.md: ports of their own, not the suite's
    env["CDCFLOW_KAFKA_PORT"] = str(unused_port())
    env["CDCFLOW_KAFKA_CONTROLLER_PORT"] = str(unused_port())
    env["CDCFLOW_CONNECT_PORT"] = str(unused_port())
    env["TERM"] = "dumb"
    return env


def copy_checkout(target: Path) -> None:
    """The checkout's files as a fresh clone of this working tree would have them."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        source = REPO / os.fsdecode(raw)
        if not source.is_file() or source.is_symlink():
            continue
        destination = target / os.fsdecode(raw)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)


# session-scoped: the docs continue from the README's state, so the copy must outlive any
# interleaving of other modules' tests on this xdist worker (a module-scoped fixture is torn
# down and rebuilt when the worker runs another module's test in between)
@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("docs") / "cdcflow"
    copy_checkout(root)
    env = user_env(root)
    yield root, env
    # the PostgreSQL of docs/postgres.md: stopped, and its data folder (maybe under /var/tmp)
    # deleted; Spark's and the benchmarks' temporary folders are removed by themselves; the
    # Kafka broker and Connect of docs/kafka.md stopped
    subprocess.run(
        ["bash", "scripts/kafka/stop.sh", "--purge"],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    subprocess.run(
        ["bash", "scripts/postgres/stop.sh", "--purge"],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def benchmarks_run() -> set[str]:
    """The benchmark command lines run so far, over every doc (see :func:`run_command`)."""
    return set()


def readers_files(root: Path, command: str) -> None:
    """Write the files a command names as the reader's own (see the module docstring)."""
    if "cdcflow.yaml" in command and not (root / "cdcflow.yaml").exists():
        shutil.copy(root / "config" / "dev.yaml", root / "cdcflow.yaml")
    if "customers.csv" in command and not (root / "customers.csv").exists():
        state = pl.read_parquet(root / "expected.parquet")
        columns = ["customer_id", "customer_name", "email", "phone", "city", "country", "status"]
        state.filter(~pl.col("is_deleted")).select(columns).write_csv(root / "customers.csv")


def run_command(root: Path, env: dict[str, str], doc: str, command: str, ran: set[str]) -> str:
    """Run one command of ``doc`` as pasted (adapted: :func:`adapt`) and return its output.

    ``ran`` holds the benchmark command lines already run: a benchmark that adapts to one of
    them is not run again (same code path, same small size). Fails the test when the command
    exits non-zero.
    """
    how, line = adapt(command)
    if how == "skip-self":
        return ""
    if how == "benchmark":
        if line in ran:
            return ""
        ran.add(line)
    readers_files(root, line)
    where = f"{doc}: `{command}` (ran `{line}`)"
    if how == "continuous":
        out, err = root / ".docs-test.out", root / ".docs-test.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                ["bash", "-c", f"exec {line}"], cwd=root, env=env, stdout=stdout, stderr=stderr
            )
            # the first round's result on stdout, then Ctrl-C
            deadline = time.monotonic() + TIMEOUT_S
            while out.stat().st_size == 0 and proc.poll() is None:
                assert time.monotonic() < deadline, f"{where}: printed nothing"
                time.sleep(0.5)
            time.sleep(1)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=300)
        text = out.read_text(errors="replace") + err.read_text(errors="replace")
        assert code == 0, f"{where}: exit {code} after SIGINT\n{text[-4000:]}"
        return text
    done = subprocess.run(
        ["bash", "-c", line],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    text = done.stdout + done.stderr
    assert done.returncode == 0, f"{where}: exit {done.returncode}\n{text[-4000:]}"
    return text


def test_every_doc_has_its_blocks_found() -> None:
    """The extractor sees the README's blocks (a changed fence would silently test nothing)."""
    readme = command_blocks(REPO / "README.md")
    assert any("make demo" in c for block in readme for c in block)
    assert all(cmd for block in readme for cmd in block)


def test_commands_need_no_path_change() -> None:
    """No command relies on `uv` or `cdcflow` being on the PATH (make puts uv in ~/.local/bin)."""
    offending = [
        f"{doc}: {command}"
        for doc in DOCS
        for block in command_blocks(REPO / doc)
        for command in block
        if re.match(r"(\S+=\S+\s+)*(uv|uvx|cdcflow|pytest|python)\s", without_comment(command))
    ]
    assert offending == []


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS)
def test_doc_commands_run_as_pasted(
    workdir: tuple[Path, dict[str, str]], benchmarks_run: set[str], doc: str
) -> None:
    root, env = workdir
    for block in command_blocks(REPO / doc):
        for command in block:
            run_command(root, env, doc, command, benchmarks_run)
