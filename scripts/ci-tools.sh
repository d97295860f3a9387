#!/usr/bin/env bash
# Optional tools that make some tests check more, installed when missing and cheap:
#   a Compose CLI, so tests/test_compose.py also runs `config -q` on compose.yaml.
# Debian's docker-compose (v1, Python) without its recommends (docker.io) is 16 small
# packages, about 15 s after `apt-get update`. No Docker engine is needed or started.
# Never fatal: without the tool the tests still check compose.yaml themselves.
set -uo pipefail

have_compose() {
  docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1
}

have_compose && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ci-tools: no Compose CLI and no root apt-get; compose.yaml is checked without one" >&2
  exit 0
fi
echo "ci-tools: installing docker-compose (Debian) to validate compose.yaml"
if ! { apt-get update -qq \
       && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            docker-compose >/dev/null; }; then
  echo "ci-tools: could not install docker-compose; compose.yaml is checked without it" >&2
fi
exit 0
