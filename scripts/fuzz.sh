#!/usr/bin/env bash
# Mutation-fuzzes the safetensors header parser and the archive reader with atheris
# (libFuzzer for Python), seeded with valid files. Installs what it needs into .venv.
#   scripts/fuzz.sh [COUNT] [--targets safetensors,archive] [--seed N] [--findings DIR]
# COUNT inputs per target (default 100000). Prints cases, time and findings per target;
# exits 1 on a finding, saved under fuzz-findings/<target>/ with the target's log.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
# 3.0.0 ships a wheel for CPython 3.11 (later releases build from source with clang).
if ! .venv/bin/python -c 'import atheris' 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check 'atheris==3.0.0'
fi
exec .venv/bin/python -m scripts.fuzz "$@"
