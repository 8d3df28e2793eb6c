"""Command-line interface (Typer + Rich)."""
