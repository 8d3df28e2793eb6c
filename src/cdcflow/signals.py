"""Clean stop of continuous runs on SIGINT/SIGTERM (the batch in progress finishes first)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

from cdcflow.logs import get_logger

log = get_logger("signals")

T = TypeVar("T")


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


def off_main_thread(work: Callable[[], T]) -> T:
    """Run ``work`` in a worker thread and wait for it, so that the main thread's SIGINT /
    SIGTERM handlers stay in charge while it runs.

    The Snowflake connector replaces the SIGINT handler around every query it executes on the
    main thread (to cancel the query and raise ``KeyboardInterrupt``), which would turn the
    clean stop of a continuous run into an interrupted one; off the main thread it leaves the
    handler alone. Called from another thread, ``work`` simply runs there.

    Returns:
        ``work``'s result.

    Raises:
        Whatever ``work`` raised (re-raised in the caller's thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return work()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="cdcflow-sync", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)  # short waits: the main thread runs its signal handlers in between
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
