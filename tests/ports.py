"""Ports for servers the tests start later: outside the kernel's ephemeral range.

A port found by binding port 0 comes from ``net.ipv4.ip_local_port_range`` (32768–60999 by
default), the range every process that binds port 0 or opens a connection draws from — a Spark
driver's RPC and block-manager ports, py4j's gateway, a client socket. A port picked that way
at the start of a session and bound only minutes later (the Kafka broker of ``docs/kafka.md``)
can be taken in between, and the server then refuses to start. These ports come from below
that range, where only servers given a fixed port listen.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_given: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def unused_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, below the ephemeral range.

    Returns:
        A port in 20000 up to the ephemeral range's start (at most 32767), not bound when
        probed and not returned before in this process.

    Raises:
        RuntimeError: when no port in that range could be bound after 200 tries.
    """
    high = min(_ephemeral_start(), 32768)
    low = min(20000, high - 1000)
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _given:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no unused port on 127.0.0.1 in {low}..{high - 1}")
