"""The Spark session's defaults: what a ``spark.conf`` entry adds to or replaces."""

from __future__ import annotations

import shlex

from cdcflow.engines.spark.session import DEFAULT_CONF, JAVA_OPTIONS, LOG4J2_OPTION, java_options


def test_configured_java_options_come_after_the_log4j2_default() -> None:
    assert java_options(None) == DEFAULT_CONF[JAVA_OPTIONS] == LOG4J2_OPTION
    assert java_options("") == LOG4J2_OPTION
    mixed = java_options("-Xmx4g -Dlog4j2.configurationFile=file:/etc/mine.properties")
    # the default first, so the JVM (last -D wins) takes a configured log4j2 file over it
    assert shlex.split(mixed) == [
        LOG4J2_OPTION,
        "-Xmx4g",
        "-Dlog4j2.configurationFile=file:/etc/mine.properties",
    ]
