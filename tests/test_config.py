"""Configuration loading: YAML, ${ENV} interpolation, CDCFLOW__ overrides, clear errors."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from cdcflow.config import load_config
from cdcflow.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "name", ["dev.yaml", "test.yaml", "prod.yaml", "spark.yaml", "spark-cluster.yaml"]
)
def test_shipped_configs_are_valid(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("CDCFLOW_STORAGE_ROOT", "CDCFLOW_LANDING_PATH", "CDCFLOW_CHECKPOINT_PATH"):
        monkeypatch.setenv(var, f"/tmp/{var.lower()}")
    config = load_config(REPO / "config" / name)
    assert config.pipeline.name == "customers"


def test_values_durations_and_env_interpolation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAKE", "/data/lake")
    file = tmp_path / "c.yaml"
    file.write_text(
        "storage: {root: '${LAKE}'}\nprocessing: {delete_mode: hard, tombstone_retention: 7d,"
        " max_clock_skew: 90s}\n"
    )
    config = load_config(file)
    assert config.storage.root == "/data/lake"
    assert config.processing.delete_mode == "hard"
    assert config.processing.tombstone_retention == timedelta(days=7)
    assert config.processing.max_clock_skew == timedelta(seconds=90)
    assert config.processing.late_event_threshold == timedelta(hours=24)


def test_env_override_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("processing: {delete_mode: soft}\nsource: {max_files_per_trigger: 5}\n")
    monkeypatch.setenv("CDCFLOW__PROCESSING__DELETE_MODE", "hard")
    monkeypatch.setenv("CDCFLOW__SOURCE__MAX_FILES_PER_TRIGGER", "7")
    config = load_config(file)
    assert config.processing.delete_mode == "hard"
    assert config.source.max_files_per_trigger == 7


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("processing: {delete_mod: soft}\n", "processing.delete_mod"),
        ("bogus: 1\n", "bogus"),
        ("processing: {delete_mode: sometimes}\n", "processing.delete_mode"),
        ("processing: {late_event_threshold: soon}\n", "processing.late_event_threshold"),
        ("storage: {root: '${NOT_SET_ANYWHERE}'}\n", "NOT_SET_ANYWHERE"),
        ("- a list\n", "mapping"),
        ("spark: {codegen_min_bytes: -1}\n", "spark.codegen_min_bytes"),
        # a negative duration turned hard deletes around (a trial: -5d dropped the tombstones
        # at once, and a late event brought a deleted row back)
        ("processing: {tombstone_retention: -5d}\n", "processing.tombstone_retention"),
        ("processing: {tombstone_retention: -P1D}\n", "processing.tombstone_retention"),
        ("processing: {max_clock_skew: -300}\n", "processing.max_clock_skew"),
        ("processing: {max_clock_skew: .nan}\n", "processing.max_clock_skew"),
    ],
)
def test_errors_name_key_and_file(tmp_path: Path, text: str, fragment: str) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(file)
    assert fragment in str(info.value)
    assert str(file) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


def test_env_errors_name_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("processing: {delete_mode: soft}\n")
    monkeypatch.setenv("CDCFLOW__PROCESSING__DELET_MODE", "hard")
    with pytest.raises(ConfigError, match="CDCFLOW__PROCESSING__DELET_MODE"):
        load_config(file)
    monkeypatch.delenv("CDCFLOW__PROCESSING__DELET_MODE")
    monkeypatch.setenv("CDCFLOW__FOO__BAR", "1")
    with pytest.raises(ConfigError, match="CDCFLOW__FOO__BAR"):
        load_config(file)


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        (
            "processing: {delete_mod: soft}\n",
            "key 'processing.delete_mod': unknown key, did you mean delete_mode?",
        ),
        ("procesing: {delete_mode: soft}\n", "did you mean processing?"),
        ("snowflake: {schem: X}\n", "did you mean schema?"),  # the alias, as written in YAML
        ("logging: {fil: x.log}\n", "did you mean file?"),
        ("processing: {zzz: 1}\n", "key 'processing.zzz': unknown key"),
    ],
)
def test_unknown_keys_suggest_the_closest(tmp_path: Path, text: str, hint: str) -> None:
    file = tmp_path / "typo.yaml"
    file.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(file)
    assert hint in str(info.value) and str(file) in str(info.value)
    if "zzz" in text:
        assert "did you mean" not in str(info.value)


def test_an_error_is_said_once_not_with_what_follows_from_it(tmp_path: Path) -> None:
    """A column type that is refused empties the table's ``columns``; only the column's error is
    shown, not the "at least 1 item" of its table that follows from it."""
    path = tmp_path / "c.yaml"
    path.write_text(
        "tables:\n  - name: t\n    keys: [id]\n    columns: [{name: id, type: integr}]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message == (
        f"{path}: key 'tables[t].columns[id].type': unknown column type 'integr' (one of "
        "string, integer, double, boolean, date, timestamp, json or decimal(p,s))"
    )


def test_env_typos_suggest_the_closest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("{}\n")
    monkeypatch.setenv("CDCFLOW__PROCESSING__DELET_MODE", "hard")
    with pytest.raises(ConfigError, match="did you mean delete_mode"):
        load_config(file)
    monkeypatch.delenv("CDCFLOW__PROCESSING__DELET_MODE")
    monkeypatch.setenv("CDCFLOW__PROCESING__DELETE_MODE", "hard")
    with pytest.raises(ConfigError, match="did you mean processing"):
        load_config(file)


def test_log_file_is_resolved_against_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    file = tmp_path / "c.yaml"
    file.write_text("logging: {level: WARNING, file: logs/cdcflow.log}\n")
    assert load_config(file).logging.file == str(tmp_path / "logs" / "cdcflow.log")
    file.write_text("logging: {level: WARNING}\n")
    assert load_config(file).logging.file == ""


def test_config_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        load_config(path)


@pytest.mark.parametrize(
    ("root", "fragment"), [("''", "must not be empty"), ("/data/50%41off", "'%XX'")]
)
def test_unusable_storage_roots_are_refused_at_load(
    tmp_path: Path, root: str, fragment: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"storage: {{root: {root}}}\n")
    with pytest.raises(ConfigError, match=r"storage\.root") as info:
        load_config(path)
    assert fragment in str(info.value) and str(path) in str(info.value)


def test_pattern_check_prints_no_warning(tmp_path: Path) -> None:
    import warnings

    path = tmp_path / "c.yaml"
    path.write_text("processing: {customer_id_pattern: '[[:alpha:]]+'}\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(path)


def test_emulator_refuses_a_folder_with_a_question_mark(tmp_path: Path) -> None:
    from cdcflow.sinks.snowflake.connection import emulator_path

    path = tmp_path / "c.yaml"
    path.write_text(f"storage: {{root: '{tmp_path}/q?m/lake'}}\n")
    with pytest.raises(ConfigError, match=r"snowflake\.emulator_path"):
        emulator_path(load_config(path))
    path.write_text(
        f"storage: {{root: '{tmp_path}/q?m/lake'}}\nsnowflake: {{emulator_path: '{tmp_path}/e'}}\n"
    )
    assert emulator_path(load_config(path)) == str(tmp_path / "e")


def test_an_object_store_lakehouse_keeps_its_checkpoint_beside_it() -> None:
    """Without ``checkpoint.location`` a lakehouse on an object store keeps its checkpoint
    under its root (not in a local folder of the working directory); a location given, or a
    local root, is kept as it is."""
    from cdcflow.config import CdcflowConfig

    def location(raw: dict) -> str:
        return CdcflowConfig.model_validate(raw).checkpoint.location

    assert location({"storage": {"root": "s3://b/lake/"}}) == "s3://b/lake/_checkpoints/customers"
    named = {"pipeline": {"name": "shop"}, "storage": {"root": "az://c/lake"},
             "checkpoint": {"lease_ttl": "40s"}}  # fmt: skip
    assert location(named) == "az://c/lake/_checkpoints/shop"
    given = {"storage": {"root": "s3://b/lake"}, "checkpoint": {"location": "s3://b/ck"}}
    assert location(given) == "s3://b/ck"
    assert location({"storage": {"root": "./l"}}) == "./lakehouse/_checkpoints/customers"
