"""Table definitions of the lakehouse layers (Bronze, quarantine, Silver, audit)."""
