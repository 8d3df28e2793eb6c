"""Clean stop of continuous runs on SIGINT/SIGTERM (the batch in progress finishes first)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from cdcflow.logs import get_logger

log = get_logger("signals")


@contextmanager
def stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Call ``stop`` on SIGINT/SIGTERM inside the block; restore the previous handlers after."""

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("stop requested", extra={"signal": signal.Signals(signum).name})
        stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
