"""Output channels of the ``cdcflow`` command (issue 12): results and progress on stdout, logs on
stderr only when asked (or when stderr is not a terminal), usage and operational errors in one
line that says what to do."""

from __future__ import annotations

import io
import json
import os
import pty
import socket
import subprocess
import sys
import threading
from pathlib import Path

import polars as pl
import pytest
from rich.console import Console

from cdcflow.state.faults import CRASH_EXIT_CODE
from tests.test_cli import CONFIG, cdcflow, one_error_line


def read_terminal(master: int, received: list[bytes]) -> None:
    """Append what a pseudo-terminal's process writes to ``received`` until it closes it."""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the process closed the terminal
            return
        if not chunk:
            return
        received.append(chunk)


def cdcflow_on_terminal(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``cdcflow`` with stdout piped and stderr on a pseudo-terminal (a user piping stdout).

    Returns:
        (exit code, stdout, what the terminal received on stderr).
    """
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    full_env.update(env or {})
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdcflow", *args],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
    )
    os.close(slave)
    received: list[bytes] = []
    reader = threading.Thread(target=read_terminal, args=(master, received), daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=300)
    reader.join(timeout=10)
    os.close(master)
    return proc.returncode, out, b"".join(received).decode().replace("\r\n", "\n")


@pytest.fixture(scope="module")
def landed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the config and 5 generated landing files (2 micro-batches of <= 3 files)."""
    root = tmp_path_factory.mktemp("output")
    (root / "cdcflow.yaml").write_text(CONFIG)
    gen = cdcflow("generate", "--out", "landing", "--events", "300", "--files", "5", cwd=root)
    assert gen.returncode == 0, gen.stderr
    assert gen.stderr == ""
    return root


def _fresh(landed: Path, tmp_path: Path) -> Path:
    """A new lakehouse over the shared landing files."""
    (tmp_path / "cdcflow.yaml").write_text(CONFIG.replace("./landing", str(landed / "landing")))
    return tmp_path


def _table_rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.strip()[:1].isdigit()]


def test_run_prints_each_batch_once_on_stdout_and_logs_only_when_asked(
    landed: Path, tmp_path: Path
) -> None:
    work = _fresh(landed, tmp_path)
    code, out, err = cdcflow_on_terminal("run", "--config", "cdcflow.yaml", cwd=work)
    assert code == 0, err
    assert err == ""  # a person at a terminal: the table is the result, no JSON echo of it
    assert len(_table_rows(out)) == 2 and "rec/s" in out
    assert "\x1b" not in out  # stdout is a pipe: nothing animated

    again = cdcflow("--log-format", "json", "run", "--config", "cdcflow.yaml", cwd=work)
    assert again.returncode == 0 and "no new landing files" in again.stdout
    (work / "lakehouse").rename(work / "old-lakehouse")

    logged = cdcflow("--log-format", "json", "run", "--config", "cdcflow.yaml", cwd=work)
    assert logged.returncode == 0, logged.stderr
    assert len(_table_rows(logged.stdout)) == 2
    records = [json.loads(line) for line in logged.stderr.splitlines()]
    assert [r["batch"]["batch_id"] for r in records if r["message"] == "micro-batch committed"] == [
        0,
        1,
    ]
    assert "{" not in logged.stdout  # no log line among the results


def test_log_format_none_text_and_a_log_file(landed: Path, tmp_path: Path) -> None:
    work = _fresh(landed, tmp_path)
    config = (work / "cdcflow.yaml").read_text() + "logging: {level: INFO, file: logs/run.log}\n"
    (work / "cdcflow.yaml").write_text(config)
    quiet = cdcflow("--log-format", "none", "run", "--config", "cdcflow.yaml", cwd=work)
    assert quiet.returncode == 0 and quiet.stderr == ""
    logged = [json.loads(line) for line in (work / "logs" / "run.log").read_text().splitlines()]
    assert sum(r["message"] == "micro-batch committed" for r in logged) == 2
    text = cdcflow("run", "--config", "cdcflow.yaml", cwd=work, env={"CDCFLOW_LOG_FORMAT": "text"})
    assert text.returncode == 0 and "no new landing files" in text.stdout
    bad = cdcflow("--log-format", "xml", "run", "--config", "cdcflow.yaml", cwd=work)
    assert bad.returncode == 2 and "--log-format" in one_error_line(bad)


def test_text_log_records_are_one_line() -> None:
    import logging

    from cdcflow.logs import TextFormatter

    record = logging.LogRecord("cdcflow.x", logging.WARNING, "", 0, "first\nsecond", None, None)
    record.batch_id = 3
    assert TextFormatter().format(record) == "warning: first | second (batch_id=3)"


def test_recovering_batch_is_said_on_stdout(landed: Path, tmp_path: Path) -> None:
    work = _fresh(landed, tmp_path)
    crash = cdcflow(
        "run", "--config", "cdcflow.yaml", cwd=work, env={"CDCFLOW_CRASH_AT": "after_bronze@0"}
    )
    assert crash.returncode == CRASH_EXIT_CODE
    code, out, err = cdcflow_on_terminal("run", "--config", "cdcflow.yaml", cwd=work)
    assert code == 0 and err == "", err
    first = out.splitlines()[0]
    assert first.startswith("recovering micro-batch 0: ") and "re-running" in first
    assert len(_table_rows(out)) == 2


def test_replay_logs_the_verification_outcome(landed: Path, tmp_path: Path) -> None:
    work = _fresh(landed, tmp_path)
    assert cdcflow("run", "--config", "cdcflow.yaml", cwd=work).returncode == 0
    done = cdcflow(
        "--log-format", "json", "replay", "--config", "cdcflow.yaml", "--verify", cwd=work
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert all("verified" not in r for r in records if r["message"] == "replay shadow rebuilt")
    verified = [r for r in records if r["message"] == "replay verified"]
    assert len(verified) == 1 and verified[0]["verified"] is True
    assert verified[0]["silver_differences"] == 0
    assert "verified vs live silver" in done.stdout


def test_lock_error_names_the_holder(tmp_path: Path) -> None:
    (tmp_path / "cdcflow.yaml").write_text(CONFIG)
    location = tmp_path / "lakehouse" / "_checkpoints" / "customers"
    code = (
        "import sys, time\n"
        "from cdcflow.state.checkpoint import Checkpoint\n"
        "with Checkpoint(sys.argv[1]).lock():\n"
        "    print('held', flush=True)\n"
        "    time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(location)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        for command in ("run", "optimize"):
            refused = cdcflow(command, "--config", "cdcflow.yaml", cwd=tmp_path)
            assert refused.returncode == 1  # another run: a failure, not a usage error
            line = one_error_line(refused)
            assert f"pid {holder.pid} on {socket.gethostname()} since " in line, line
    finally:
        holder.kill()
        holder.wait()
    from cdcflow.state.checkpoint import Checkpoint

    checkpoint = Checkpoint(location)
    with checkpoint.lock():  # free again once the holder died (flock), even without clean-up
        assert checkpoint.holder().startswith(f"pid {os.getpid()} on ")
    assert checkpoint.holder() == ""  # emptied on release


def test_version_is_printed(tmp_path: Path) -> None:
    from importlib.metadata import version

    shown = cdcflow("--version", cwd=tmp_path)
    assert (shown.returncode, shown.stdout) == (0, f"cdcflow {version('cdcflow')}\n")


def test_usage_errors_say_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "cdcflow.yaml").write_text(CONFIG)
    cases = {
        ("runn",): "Did you mean 'run'?",
        ("run", "--confg", "cdcflow.yaml"): "--config",
        ("run", "--debug", "--config", "cdcflow.yaml"): "put it before the command",
        ("sync", "snowflake", "--log-format", "json"): "(cdcflow --log-format ... sync snowflake",
        ("replay", "--config", "cdcflow.yaml", "--verify", "--apply"): "give one of --verify",
    }
    for args, expected in cases.items():
        result = cdcflow(*args, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        assert expected in one_error_line(result), args
    (tmp_path / "typo.yaml").write_text("processing: {delete_mod: hard}\n")
    typo = cdcflow("run", "--config", "typo.yaml", cwd=tmp_path)
    assert typo.returncode == 2
    line = one_error_line(typo)
    assert "typo.yaml" in line and "processing.delete_mod" in line
    assert "did you mean delete_mode?" in line


def test_piped_results_fit_100_columns_and_a_line_stays_whole(tmp_path: Path) -> None:
    """Without a terminal (and without COLUMNS) tables fit 100 columns, and a line of text
    longer than that is printed whole, not broken."""
    from rich.cells import cell_len

    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW") and k != "COLUMNS"}
    landing = tmp_path / ("a-rather-long-landing-folder-name-" * 4)
    landing.mkdir()
    (tmp_path / "cdcflow.yaml").write_text(CONFIG.replace("./landing", str(landing)))

    def piped(*args: str) -> subprocess.CompletedProcess[str]:  # a fresh process, no terminal
        cmd = [sys.executable, "-m", "cdcflow", *args]
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)

    empty = piped("run", "--config", "cdcflow.yaml")
    assert empty.returncode == 0, empty.stderr
    assert empty.stdout == f"no new landing files in {landing}\n"  # one line, longer than 100
    gen = piped("generate", "--out", "gen", "--events", "300", "--expected", "out/state.parquet")
    assert gen.returncode == 0, gen.stderr
    lines = gen.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 100, gen.stdout
    assert any("expected quarantined" in line for line in lines)


def test_progress_is_animated_only_on_a_terminal() -> None:
    from cdcflow.cli.progress import working

    plain = io.StringIO()
    with working("work", total=3, console=Console(file=plain, width=100)) as work:
        work.advance()
        work.step("step one")
    assert plain.getvalue() == "step one\n"
    live = io.StringIO()
    terminal = Console(file=live, width=100, force_terminal=True)
    with working("work", total=3, unit="files", console=terminal) as work:
        work.update(completed=2, detail="a detail")
        work.step("step two")
    assert "step two" in live.getvalue() and "2/3 files" in live.getvalue()


def test_logs_go_to_a_redirected_stderr_while_stdout_is_a_terminal(
    landed: Path, tmp_path: Path
) -> None:
    """``cdcflow run ... 2>run.log`` at a terminal: the progress bar draws on stdout, and the
    log lines go to the file, not onto the screen (the bar redirects stderr only when stderr is
    the terminal too)."""
    work = _fresh(landed, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    master, slave = pty.openpty()
    with (work / "run.log").open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cdcflow", "--log-format", "json", "run", "--config",
             "cdcflow.yaml"],
            cwd=work, env=env, stdout=slave, stderr=log_file,
        )  # fmt: skip
        os.close(slave)
        screen: list[bytes] = []
        read_terminal(master, screen)
        assert proc.wait(timeout=300) == 0
    os.close(master)
    records = [json.loads(line) for line in (work / "run.log").read_text().splitlines()]
    committed = [r["batch"]["batch_id"] for r in records if r["message"] == "micro-batch committed"]
    assert committed == [0, 1]
    shown = b"".join(screen).decode()
    assert '"levelname"' not in shown and "rec/s" in shown  # the results, no log line


def test_ctrl_c_of_a_continuous_run_is_acknowledged_and_the_batch_finishes(
    landed: Path, tmp_path: Path
) -> None:
    """SIGINT to ``run --trigger processing-time=…``: one line says the stop was heard (a
    new-user trial pressed Ctrl-C and saw nothing until the batch ended), the run exits 0 after
    committing what it took, and a next run takes the rest."""
    import signal
    import time

    work = _fresh(landed, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    out = work / "run.out"
    with out.open("w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cdcflow", "run", "--config", "cdcflow.yaml", "--trigger",
             "processing-time=30s"],
            cwd=work, env=env, stdout=stdout, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while "batch 0:" not in out.read_text():  # the first micro-batch committed
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, out.read_text()
    lines = out.read_text().splitlines()
    assert lines == [
        lines[0],
        "stop requested: the run stops once the micro-batch in progress, if any, is committed",
    ] and lines[0].startswith("batch 0: 3 files")
    rest = cdcflow("run", "--config", "cdcflow.yaml", cwd=work)
    assert rest.returncode == 0 and len(_table_rows(rest.stdout)) == 1, rest.stdout


def test_ctrl_c_while_loading_or_running_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) while the command is still importing its libraries, and during an
    ``available-now`` run: ``error: aborted`` and exit 130, no traceback (a new-user trial saw a
    traceback of the imports, and nothing at all during a run); the next run finishes the
    interrupted micro-batch."""
    import signal
    import time

    (tmp_path / "cdcflow.yaml").write_text(CONFIG)
    gen = cdcflow("generate", "--out", "landing", "--events", "6000", "--files", "21",
                  cwd=tmp_path)  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    command = [sys.executable, "-m", "cdcflow", "--log-format", "none", "run", "--config",
               "cdcflow.yaml"]  # fmt: skip
    loading = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(0.2)  # the imports take about a second
    loading.send_signal(signal.SIGINT)
    _, err = loading.communicate(timeout=120)
    assert (loading.returncode, err) == (130, "error: aborted\n")
    running = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    log = tmp_path / "lakehouse" / "audit" / "batch_log" / "_delta_log"
    deadline = time.monotonic() + 120
    while not list(log.glob("*.json")):  # the first of seven micro-batches committed
        assert running.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    running.send_signal(signal.SIGINT)
    _, err = running.communicate(timeout=120)
    assert (running.returncode, err) == (130, "error: aborted\n")
    rest = cdcflow("run", "--config", "cdcflow.yaml", cwd=tmp_path)
    assert rest.returncode == 0, rest.stderr
    files = pl.read_delta(str(tmp_path / "lakehouse" / "audit" / "batch_log"))["files"]
    assert files.sum() == 21


def test_an_unexpected_library_error_is_one_line_without_its_backtrace(tmp_path: Path) -> None:
    """A Delta log that delta-rs cannot parse (a corrupt commit file): one line, the library's
    message without the Rust backtrace it appends (``0: <unknown>`` frames), exit 1."""
    from cdcflow.cli.app import unexpected_message

    raw = "Kernel error: Json error: bad\n   0: <unknown>\n  12: start_thread\n   at x.c:1:8\n"
    assert (
        unexpected_message(RuntimeError(raw))
        == "unexpected RuntimeError: Kernel error: Json error: bad"
    )
    work = tmp_path
    (work / "cdcflow.yaml").write_text(CONFIG)
    gen = cdcflow("generate", "--out", "landing", "--events", "50", "--files", "1", cwd=work)
    assert gen.returncode == 0, gen.stderr
    assert cdcflow("run", "--config", "cdcflow.yaml", cwd=work).returncode == 0
    log = sorted((work / "lakehouse" / "silver" / "customers" / "_delta_log").glob("*.json"))
    log[-1].write_text("garbage\n")
    status = cdcflow("status", "--config", "cdcflow.yaml", cwd=work)
    assert status.returncode == 1
    line = one_error_line(status)
    assert "Json error" in line and "<unknown>" not in line and "start_thread" not in line


def test_commands_that_read_the_lakehouse_name_a_missing_one(tmp_path: Path) -> None:
    """Before the first run (or with storage.root naming another folder) the commands reading
    the lakehouse say which table is missing under which root, in one line (exit 2), and
    create nothing; replay names a Bronze version it does not have."""
    (tmp_path / "cdcflow.yaml").write_text(CONFIG)
    gen = cdcflow("generate", "--out", "landing", "--events", "20", "--files", "1",
                  "--expected", "expected.parquet", cwd=tmp_path)  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    for args, table in (
        (("reconcile", "--expected", "expected.parquet"), "silver/customers"),
        (("gold",), "silver/customer_history"),
        # the same for every command reading the lakehouse (a trial found exit 1 and a
        # library's message for these three)
        (("as-of", "--version", "0"), "silver/customers"),
        (("as-of", "--timestamp", "2026-01-01T00:00:00Z"), "silver/customer_history"),
        (("replay", "--verify"), "bronze/customer_events"),
        (("sync", "snowflake"), "silver/customers"),
    ):
        result = cdcflow(*args, "--config", "cdcflow.yaml", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        line = one_error_line(result)
        assert table in line and "storage.root" in line and "run the pipeline first" in line
    assert not (tmp_path / "lakehouse").exists()
    assert cdcflow("run", "--config", "cdcflow.yaml", cwd=tmp_path).returncode == 0
    beyond = cdcflow("replay", "--config", "cdcflow.yaml", "--to-version", "999", cwd=tmp_path)
    assert beyond.returncode == 2
    assert "--to-version 999: bronze/customer_events: no version 999 (the latest is 1)" in (
        one_error_line(beyond)
    )


def test_a_snowflake_error_prints_no_value_it_quotes() -> None:
    """Snowflake quotes the value it could not convert; a value may be personal data, so the
    one-line error keeps the error number and the type but masks every quoted literal (an
    attack saw a row's value printed). Other libraries' messages are kept as they are."""
    from snowflake.connector.errors import ProgrammingError

    from cdcflow.cli.app import unexpected_message

    error = ProgrammingError(
        msg="Could not convert string 'jane@example.com' to DECIMAL(10,3)", errno=100035
    )
    line = unexpected_message(error)
    assert "jane@example.com" not in line and "100035" in line and "DECIMAL(10,3)" in line
    assert unexpected_message(RuntimeError("keep 'this'")) == "unexpected RuntimeError: keep 'this'"
