"""The ``cdcflow`` command as a user runs it: generate, run with each trigger, errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from tests import forkrun


def cdcflow(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``cdcflow <args>`` in a child process of its own (environment, folder, streams), forked
    from the warm fork server of :mod:`tests.forkrun` (the console script's entry point without
    three seconds of imports per command; ``python -m cdcflow`` and ``.venv/bin/cdcflow`` as a
    shell runs them are covered by tests/test_docs.py and tests/test_cli_output.py)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    full_env.update(env or {})
    return forkrun.run(list(args), full_env, cwd, timeout=300)


CONFIG = """
pipeline: {name: customers, engine: local}
storage: {root: ./lakehouse}
source: {type: files, format: flat, path: ./landing, max_files_per_trigger: 3}
checkpoint: {location: ./lakehouse/_checkpoints/customers}
processing: {delete_mode: soft}
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "cdcflow.yaml").write_text(CONFIG)
    return tmp_path


def test_generate_then_run_once_and_available_now(workdir: Path) -> None:
    gen = cdcflow("generate", "--out", "landing", "--events", "400", "--files", "5", cwd=workdir)
    assert gen.returncode == 0, gen.stderr
    assert len(list((workdir / "landing").glob("*.jsonl"))) == 5
    once = cdcflow("run", "--config", "cdcflow.yaml", "--trigger", "once", cwd=workdir)
    assert once.returncode == 0, once.stderr
    log = pl.read_delta(str(workdir / "lakehouse" / "audit" / "batch_log"))
    assert log["files"].to_list() == [5]  # once: everything in one micro-batch
    assert '"micro-batch committed"' in once.stderr  # JSON log line
    for pii in ("@example.com", "Sharma"):
        assert pii not in once.stderr and pii not in once.stdout
    # a second workload into the same folder is refused: it would overwrite files already
    # taken and reuse event ids
    refused = cdcflow("generate", "--out", "landing", "--events", "400", cwd=workdir)
    assert refused.returncode == 2 and "already holds 5 landing file(s)" in refused.stderr
    assert len(list((workdir / "landing").glob("*.jsonl"))) == 5
    more = cdcflow(
        "generate", "--out", "more", "--events", "400", "--files", "7", "--seed", "7",
        cwd=workdir,
    )  # fmt: skip
    assert more.returncode == 0
    for path in sorted((workdir / "more").glob("*.jsonl")):  # new files, after the others
        path.rename(workdir / "landing" / f"later-{path.name}")
    now = cdcflow("run", "--config", "cdcflow.yaml", "--trigger", "available-now", cwd=workdir)
    assert now.returncode == 0, now.stderr
    log = pl.read_delta(str(workdir / "lakehouse" / "audit" / "batch_log")).sort("batch_id")
    assert log["files"].to_list() == [5, 3, 3, 1]


def test_processing_time_stops_cleanly_on_sigterm(workdir: Path) -> None:
    assert (
        cdcflow(
            "generate", "--out", "landing", "--events", "100", "--files", "2", cwd=workdir
        ).returncode
        == 0
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCFLOW")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cdcflow",
            "run",
            "--config",
            "cdcflow.yaml",
            "--trigger",
            "processing-time=1s",
        ],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    commits = workdir / "lakehouse" / "_checkpoints" / "customers" / "commits"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (commits / "0.json").exists():
        time.sleep(0.2)
    assert (commits / "0.json").exists()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stop requested" in err
    assert out.startswith("batch 0: 2 files, ")  # one line per micro-batch as it commits
    assert "records/s" in out.splitlines()[0]


def test_errors_are_one_line_with_nonzero_exit(workdir: Path) -> None:
    (workdir / "bad.yaml").write_text("processing: {delete_mod: soft}\n")
    bad = cdcflow("run", "--config", "bad.yaml", cwd=workdir)
    assert bad.returncode == 2
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2 and "processing.delete_mod" in bad.stderr and "bad.yaml" in bad.stderr
    assert "Traceback" not in bad.stderr
    debug = cdcflow("--debug", "run", "--config", "bad.yaml", cwd=workdir)
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    trigger = cdcflow("run", "--config", "cdcflow.yaml", "--trigger", "sometimes", cwd=workdir)
    assert trigger.returncode == 2 and "--trigger" in trigger.stderr
    missing = cdcflow("run", "--config", "nope.yaml", cwd=workdir)
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr


# ---------------------------------------------- issue 11, item 9: every error is exactly one line
def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    return lines[0]


LONG_PATH = "/missing/" + "a-rather-long-folder-name/" * 4 + "config.yaml"


@pytest.mark.parametrize("columns", [None, "40"])
def test_errors_are_exactly_one_line_whatever_the_width(workdir: Path, columns: str | None) -> None:
    env = {"COLUMNS": columns} if columns else {}
    missing = cdcflow("run", "--config", LONG_PATH, cwd=workdir, env=env)
    assert missing.returncode == 2
    assert LONG_PATH in one_error_line(missing)


def test_usage_and_parse_errors_are_one_line_exit_2(workdir: Path) -> None:
    env = {"COLUMNS": "40"}
    usage = {
        ("run", "--bogus"): "--bogus",
        ("bogus",): "bogus",
        ("run",): "--config",
        ("run", "--config", "cdcflow.yaml", "--trigger"): "--trigger",
        ("as-of", "--config", "cdcflow.yaml", "--version", "-1"): "--version",
        ("optimize", "--config", "cdcflow.yaml", "--wait", "soon"): "--wait",
    }
    for args, named in usage.items():
        result = cdcflow(*args, cwd=workdir, env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert named in one_error_line(result), args
    bad_yaml = workdir / "broken.yaml"
    bad_yaml.write_text("storage: {root: [\n  bad: : x\n")  # the YAML error spans 5 lines
    result = cdcflow("run", "--config", "broken.yaml", cwd=workdir, env=env)
    assert result.returncode == 2 and "broken.yaml" in one_error_line(result)
    debug = cdcflow("--debug", "run", "--config", LONG_PATH, cwd=workdir, env=env)
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    assert debug.stderr.splitlines()[-1].startswith("error: ")


def test_unwritable_storage_root_is_a_configuration_error(workdir: Path) -> None:
    (workdir / "landing").mkdir()
    (workdir / "landing" / "a.jsonl").write_text("{}\n")
    (workdir / "a-file").write_text("not a folder\n")
    config = CONFIG.replace("./lakehouse}", "./a-file/lakehouse}").replace(
        "./lakehouse/_checkpoints", "./checkpoints"
    )
    (workdir / "under-file.yaml").write_text(config)
    for command in (("run",), ("gold",)):
        result = cdcflow(*command, "--config", "under-file.yaml", cwd=workdir)
        assert result.returncode == 2, result.stderr
        line = one_error_line(result)
        assert "storage.root" in line and f"{workdir / 'a-file'} is a file" in line, line
    if os.geteuid() != 0:  # root writes anywhere
        (workdir / "read-only").mkdir(mode=0o555)
        (workdir / "ro.yaml").write_text(
            CONFIG.replace("./lakehouse}", "./read-only/lakehouse}").replace(
                "./lakehouse/_checkpoints", "./checkpoints"
            )
        )
        result = cdcflow("run", "--config", "ro.yaml", cwd=workdir)
        assert result.returncode == 2, result.stderr
        assert f"{workdir / 'read-only'} is not writable" in one_error_line(result)


def test_read_only_storage_root_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The not-writable reason (checked with os.access, which root always passes)."""
    import cdcflow.engines.local.delta as delta

    folder = tmp_path / "ro"
    folder.mkdir()
    monkeypatch.setattr(delta.os, "access", lambda path, mode: Path(path) != folder)
    error = delta.unwritable_root(str(folder / "lake" / "silver"), PermissionError("denied"))
    assert str(error) == (
        f"storage.root: cannot create Delta table {folder / 'lake' / 'silver'} "
        f"({folder} is not writable)"
    )


def test_percent_escape_in_local_root_is_explained(tmp_path: Path) -> None:
    """delta-rs decodes ``%20`` in a local path: a clear configuration error, not a crash."""
    from cdcflow.engines.local.delta import DeltaStore
    from cdcflow.errors import ConfigError
    from cdcflow.layers.tables import BRONZE

    uri = str(tmp_path / "50%20off" / "lake" / BRONZE.name)
    with pytest.raises(ConfigError, match=r"delta-rs reads '%XX' in a local path"):
        DeltaStore({BRONZE.name: uri}).ensure(BRONZE)


def test_unexpected_errors_and_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cdcflow import pipeline
    from cdcflow.cli import app as cli_app
    from cdcflow.config import CdcflowConfig

    one_line = cli_app.one_line
    assert one_line("a\n  b\r\nc\u2028d\x85e") == "a | b | c | d | e"
    assert one_line("tab\there \x1b[31m red") == "tab\\x09here \\x1b[31m red"
    assert one_line("/data/sp ace/文件/ü") == "/data/sp ace/文件/ü"

    def crash(*_: object, **__: object) -> None:
        raise RuntimeError("first line\nsecond line\n  third line")

    monkeypatch.setattr(pipeline.Pipeline, "__init__", crash)
    monkeypatch.setattr(cli_app, "load_config", lambda path: CdcflowConfig())
    monkeypatch.setattr(sys, "argv", ["cdcflow", "run", "--config", "x.yaml"])
    with pytest.raises(SystemExit) as exit_info:
        cli_app.main()
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        "error: unexpected RuntimeError: first line | second line | third line\n"
    )


def test_the_console_script_exits_with_its_code_after_a_delta_read(tmp_path: Path) -> None:
    """A process that reads a Delta table through delta-rs' PyArrow dataset just before it
    exits can abort while the interpreter shuts down (exit 134, ``terminate called without an
    active exception``; it hit about one drift stop in five). The console script's entry point
    leaves with the command's own exit code: eight children in a row whose command reads a
    table last and exits 2 all exit 2 (without the entry point, most of them abort)."""
    from deltalake import write_deltalake

    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"a": list(range(1000)), "b": ["x"] * 1000}))
    child = (
        "import sys\n"
        "import cdcflow.cli.app as app\n"
        "from deltalake import DeltaTable\n"
        "kept = []\n"
        "def main():\n"
        f"    kept.append(DeltaTable({str(table)!r}).to_pyarrow_table(columns=['a']))\n"
        "    sys.exit(2)\n"
        "app.main = main\n"
        "app.entry()\n"
    )
    codes = [
        subprocess.run(
            [sys.executable, "-c", child], capture_output=True, text=True, timeout=120
        ).returncode
        for _ in range(8)
    ]
    assert codes == [2] * 8


def test_an_unexpected_error_quotes_no_rows(tmp_path: Path) -> None:
    """delta-rs quotes the rows that fail a NOT NULL check ("Preview of invalid data"); such
    rows may hold personal data, so the one-line error leaves them out."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from cdcflow.cli.app import without_rows

    schema = pa.schema([pa.field("k", pa.string(), nullable=False), pa.field("v", pa.string())])
    write_deltalake(str(tmp_path / "t"), pa.table({"k": ["a"], "v": ["x"]}, schema=schema))
    with pytest.raises(Exception) as raised:
        (
            DeltaTable(str(tmp_path / "t"))
            .merge(pa.table({"k": ["b"], "v": ["ann@example.com"]}), "t.v = s.v", "s", "t")
            .when_not_matched_insert(updates={"k": "NULL", "v": "s.v"})
            .execute()
        )
    assert "ann@example.com" in str(raised.value)  # what delta-rs says
    shown = without_rows(str(raised.value))
    assert "ann@example.com" not in shown and "failed validation check" in shown
    assert without_rows("no rows here") == "no rows here"


def test_an_object_store_failure_is_one_short_line_that_names_the_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """delta-rs' object store errors carry colour codes and the store's whole XML body: the
    CLI prints one line without either, cut to a few hundred characters, that says which
    settings to check."""
    from cdcflow import pipeline
    from cdcflow.cli import app as cli_app
    from cdcflow.config import CdcflowConfig

    body = "<Error><Code>NoSuchBucket</Code>" + "<Detail>x</Detail>" * 200 + "</Error>"

    def crash(*_: object, **__: object) -> None:
        raise OSError(f"Kernel error -> Generic S3 error | \x1b[31m↳\x1b[0m {body}")

    monkeypatch.setattr(pipeline.Pipeline, "__init__", crash)
    monkeypatch.setattr(cli_app, "load_config", lambda path: CdcflowConfig())
    monkeypatch.setattr(sys, "argv", ["cdcflow", "run", "--config", "x.yaml"])
    with pytest.raises(SystemExit) as exit_info:
        cli_app.main()
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\\x1b" not in err and "\x1b" not in err
    assert "storage.root" in err and "AWS_ENDPOINT_URL" in err and "NoSuchBucket" in err
    assert len(err) < 700
