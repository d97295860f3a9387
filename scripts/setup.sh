#!/usr/bin/env bash
# Creates .venv with the project and its dev tools; safe to run again (it skips work
# when pyproject.toml has not changed since the last successful install).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "loraplane needs Python 3.11; set PYTHON=/path/to/python3.11" >&2
  exit 2
fi

stamp=.venv/.loraplane-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
echo "$want" > "$stamp"
echo "setup: .venv ready"
