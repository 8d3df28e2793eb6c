"""Change-event sources. ``files``: a landing folder of JSON-lines files."""
