"""``cdcflow catalog``: the catalog of the pipeline's datasets (:mod:`cdcflow.layers.catalog`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdcflow.cli.app import ConfigOption, console, load
from cdcflow.errors import ConfigError


def catalog(
    config: ConfigOption,
    out: Annotated[Path, typer.Option(help="folder for catalog.yaml and catalog.md")] = Path(
        "catalog"
    ),
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="compare the catalog with the lakehouse instead of writing it: exit 1 when a "
            "Delta table has no entry or an entry's columns differ from its table's",
        ),
    ] = False,
) -> None:
    """Write the catalog of every dataset the pipeline owns (layer, URI, grain, key, columns
    with types, PII flags and descriptions, owner, consumers, cadence, upstream/downstream) as
    YAML and Markdown, generated from the table contracts and the live Delta tables."""
    from cdcflow.layers.catalog import build_catalog, check_catalog, to_markdown, to_yaml

    settings = load(config, declared_tables=True)
    entries = build_catalog(settings)
    if check:
        problems = check_catalog(settings, entries)
        if problems:
            typer.echo("catalog: " + "; ".join(problems), err=True)
            raise typer.Exit(1)
        console.print(
            f"catalog: {len(entries)} datasets; every Delta table has an entry matching its schema",
            markup=False,
            soft_wrap=True,
        )
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "catalog.yaml").write_text(to_yaml(entries), encoding="utf-8")
        (out / "catalog.md").write_text(
            to_markdown(entries, settings.pipeline.name), encoding="utf-8"
        )
    except OSError as exc:
        raise ConfigError(f"--out: cannot write to {out} ({exc.strerror or exc})") from None
    console.print(
        f"catalog: {len(entries)} datasets -> {out / 'catalog.yaml'}, {out / 'catalog.md'}",
        markup=False,
        soft_wrap=True,
    )
