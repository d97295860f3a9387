#!/usr/bin/env bash
# The main job, on the embedded default: the registry (SQLite, a local blob folder and
# its own NATS), a vLLM server (CPU build) on a tiny model built here, and an inference
# agent, each a separate process. It publishes v1, starts a long stream, publishes v2
# while the stream runs, and prints a timeline of the hot swap. Everything it starts is
# stopped at the end, also on Ctrl-C or a failure.
#
# A fresh machine spends ~2 minutes installing vLLM into ~/.cache/loraplane/vllm-venv; the tiny model is
# built once into .artifacts/demo/; later runs go straight to the demo (~1.5 minutes,
# most of it vLLM starting). Logs of the last run: .artifacts/demo/last-run/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
bash scripts/vllm/install.sh
exec .venv/bin/python -m scripts.demo "$@"
