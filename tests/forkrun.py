"""A ``cdcflow`` command in a real child process, forked from a warm fork server.

A child started as ``python -m cdcflow`` spends about 3 s of CPU importing Polars, delta-rs,
PyArrow and the CLI before it does anything; the crash tests start one per cell. Here the
children are forked from a :mod:`multiprocessing` fork server that imported those modules once
(per test process): each child is still a process of its own, with its own environment,
working folder and standard streams, that runs the console script's entry point
(:func:`cdcflow.cli.app.main`) and can be killed by ``SIGKILL`` at a crash point — the same
code path as ``cdcflow …`` from a shell. The fork server never opens a Delta table itself
(delta-rs's runtime does not survive a fork), so its children start clean.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from multiprocessing.context import ForkServerContext
from pathlib import Path

#: Modules the fork server imports once, before it forks any child.
PRELOAD = [
    "tests.forkrun",
    "polars",
    "pyarrow",
    "deltalake",
    "cdcflow.cli.app",
    "cdcflow.pipeline",
    "cdcflow.engines.local.engine",
    "cdcflow.engines.local.gold",
    "cdcflow.engines.local.history",
]

_context: ForkServerContext | None = None


def _server() -> ForkServerContext:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _child(argv: list[str], env: dict[str, str], cwd: str, out: str, err: str) -> None:
    """The child: the given environment, folder and streams, then ``cdcflow <argv>``."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the child's own stdin, closed by its exit
    sys.argv = ["cdcflow", *argv]
    from cdcflow.cli.app import main

    try:
        main()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run(
    argv: list[str], env: dict[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``cdcflow <argv>`` in a forked child and wait for it.

    Args:
        argv: the command line after ``cdcflow``.
        env: the child's whole environment.
        cwd: the child's working folder.
        timeout: seconds before the child is killed and an AssertionError raised.

    Returns:
        The finished child: ``returncode`` (``-9`` when it died by ``SIGKILL``), and its
        ``stdout`` and ``stderr`` as text.
    """
    with tempfile.TemporaryDirectory(prefix="cdcflow-child-") as folder:
        out, err = f"{folder}/stdout", f"{folder}/stderr"
        child = _server().Process(target=_child, args=(argv, env, str(cwd), out, err))
        child.start()
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
            raise AssertionError(f"cdcflow {' '.join(argv)}: still running after {timeout} s")
        code = child.exitcode
        assert code is not None
        read = lambda path: Path(path).read_text(errors="replace")  # noqa: E731
        return subprocess.CompletedProcess(
            ["cdcflow", *argv], code, stdout=read(out), stderr=read(err)
        )
