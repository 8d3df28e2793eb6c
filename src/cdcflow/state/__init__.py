"""Streaming state: checkpoint (offset log, commit log, run lock) and fault injection."""
