"""Sinks: copies of the lakehouse tables in external systems (Snowflake)."""
