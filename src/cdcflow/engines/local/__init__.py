"""Local engine: delta-rs + Polars + PyArrow, no JVM."""
