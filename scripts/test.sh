#!/usr/bin/env bash
# The test command: set-up, lint, type check, then the whole suite on real services.
# Extra arguments go to pytest (e.g. scripts/test.sh tests/registry -x).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
./scripts/services.sh
./scripts/ci-tools.sh
# tests/containers: a Docker engine, and the images compose.yaml names built locally
# where they cannot be pulled (cached: a warm run takes seconds, a cold one minutes).
./scripts/docker.sh
.venv/bin/python -m devharness.images build

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
exec .venv/bin/pytest "$@"
