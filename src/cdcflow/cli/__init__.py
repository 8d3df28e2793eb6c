"""Command-line interface (Typer + Rich)."""

from __future__ import annotations

import os
import sys


def entry() -> None:
    """The ``cdcflow`` console script: :func:`cdcflow.cli.app.entry`, imported here so that a
    Ctrl-C while the command is still loading (about a second of imports) is the same one
    line and exit code 130 as one while it runs, not a traceback of the imports."""
    sys.unraisablehook = _interrupt_again
    try:
        from cdcflow.cli.app import entry as run
    except KeyboardInterrupt:
        sys.stderr.write("error: aborted\n")
        sys.stderr.flush()
        os._exit(130)
    run()


def _interrupt_again(unraisable: sys.UnraisableHookArgs) -> None:
    """A Ctrl-C that lands in code Python cannot raise from (a weakref callback or ``__del__``,
    e.g. a thread pool's being collected) would be printed as "Exception ignored … Traceback"
    and lost: it is raised again in the main thread instead (:func:`_thread.interrupt_main`)."""
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
        import threading

        # from another thread, once this hook has returned (raised within it, the interrupt
        # would be "ignored in sys.unraisablehook" in turn)
        threading.Timer(0.01, _interrupt_main).start()
        return
    sys.__unraisablehook__(unraisable)


def _interrupt_main() -> None:
    import _thread

    _thread.interrupt_main()
