#!/usr/bin/env bash
# Debian tools the tests need, installed when missing (idempotent; seconds when present):
#   - prometheus and promtool (Debian's `prometheus`): REQUIRED. tests/deploy unit-tests the
#     alert rules with promtool, and tests/e2e/test_prometheus.py runs a real Prometheus.
#     Without them this script fails, and so would those tests.
#   - a Compose CLI (Debian's docker-compose, v1) without its recommends: optional, so
#     tests/test_compose.py also runs `config -q` on compose.yaml. Never fatal.
set -uo pipefail

have_compose() {
  docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1
}
have_prometheus() {
  command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1
}
can_apt() {
  [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1
}

updated=0
apt_install() {
  if [ "$updated" -eq 0 ]; then
    apt-get update -qq || return 1
    updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ! have_prometheus; then
  if ! can_apt; then
    echo "ci-tools: prometheus/promtool are missing and this is not root with apt-get;" \
         "install Debian's 'prometheus' package (the alert and Prometheus tests need it)" >&2
    exit 1
  fi
  echo "ci-tools: installing prometheus (Debian) for promtool and the Prometheus tests"
  if ! apt_install prometheus || ! have_prometheus; then
    echo "ci-tools: could not install Debian's 'prometheus' package; the alert and" \
         "Prometheus tests cannot run" >&2
    exit 1
  fi
fi

if ! have_compose; then
  if ! can_apt; then
    echo "ci-tools: no Compose CLI and no root apt-get; compose.yaml is checked without one" >&2
  else
    echo "ci-tools: installing docker-compose (Debian) to validate compose.yaml"
    apt_install docker-compose \
      || echo "ci-tools: could not install docker-compose; compose.yaml is checked without it" >&2
  fi
fi
exit 0
