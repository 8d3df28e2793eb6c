#!/usr/bin/env bash
# The environment of `make demo` / `make test`: uv (installed into ~/.local/bin when missing),
# then the locked dependencies with every extra into ./.venv. Idempotent.
#
# uv does not have to be on your PATH afterwards: the README's commands call the tools of the
# project environment directly (.venv/bin/cdcflow, .venv/bin/python, .venv/bin/pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.local/bin:$PATH"

if ! command -v uv >/dev/null 2>&1; then
  echo "bootstrap: installing uv into ~/.local/bin"
  python3 -m pip install --quiet --user uv 2>/dev/null \
    || python3 -m pip install --quiet --user --break-system-packages uv 2>/dev/null \
    || python3 -m pip install --quiet uv 2>/dev/null \
    || { curl -LsSf https://astral.sh/uv/install.sh | env UV_NO_MODIFY_PATH=1 sh; }
  command -v uv >/dev/null 2>&1 || { echo "bootstrap: uv could not be installed" >&2; exit 1; }
fi
# One line when there is work to do (no .venv yet, or uv.lock / pyproject.toml changed), so a
# first run does not sit silent while the dependencies download; nothing otherwise.
plan=$(uv sync --frozen --all-extras --dry-run 2>&1 || true)
if [[ $plan != *"Would make no changes"* ]]; then
  echo "bootstrap: installing the locked dependencies into .venv (first run: a minute or two)"
fi
# --compile-bytecode: every module of .venv compiled once here (about 15 s on a first run,
# under a second afterwards), and the project's own modules (an editable install, outside
# site-packages) below. Without it a Python process started with PYTHONDONTWRITEBYTECODE set
# (as on this project's CI machines) compiles every module it imports, each time: about 1.6 s
# of CPU per `cdcflow` command, per Spark Python worker, per killed child of the crash tests.
uv sync --frozen --all-extras --quiet --compile-bytecode
.venv/bin/python -m compileall -q src >/dev/null
