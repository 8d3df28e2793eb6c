"""Spark engine: the same pipeline on PySpark Structured Streaming + delta-spark.

Optional (extra ``spark``); nothing here is imported unless ``pipeline.engine: spark``.
See docs/spark.md for set-up, versions and what differs from the local engine.
"""
