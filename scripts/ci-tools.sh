#!/usr/bin/env bash
# Debian tools some tests need, installed when missing (as root, with apt-get); fast when
# they are already there:
#   chromium, the browser the /ui tests drive with Playwright (tests/registry/ui). Required:
#     Playwright cannot download a browser of its own here. Without it those tests fail.
#   a Compose CLI, so tests/test_compose.py also runs `config -q` on compose.yaml.
#     Debian's docker-compose (v1, Python) without its recommends (docker.io) is 16 small
#     packages, about 15 s after `apt-get update`. Optional: without it the tests still
#     check compose.yaml themselves.
set -uo pipefail

have_compose() {
  docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1
}

can_apt() {
  [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1
}

updated=0
apt_install() {
  # Another apt (a parallel set-up) may hold the lock: wait for it rather than fail.
  if [ "$updated" -eq 0 ]; then
    apt-get -o DPkg::Lock::Timeout=300 update -qq || return 1
    updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends "$@" >/dev/null
}

install_chromium() {
  [ -x /usr/bin/chromium ] && return 0
  if ! can_apt; then
    echo "ci-tools: ERROR: /usr/bin/chromium is missing and this is not root with apt-get;" \
         "install Debian's chromium (apt-get install --no-install-recommends chromium)," \
         "or the browser tests in tests/registry/ui fail" >&2
    return 1
  fi
  echo "ci-tools: installing chromium (Debian) for the /ui browser tests"
  if ! apt_install chromium || [ ! -x /usr/bin/chromium ]; then
    echo "ci-tools: ERROR: could not install Debian's chromium; the browser tests in" \
         "tests/registry/ui will fail (see apt-get's messages above)" >&2
    return 1
  fi
}

install_compose() {
  have_compose && return 0
  if ! can_apt; then
    echo "ci-tools: no Compose CLI and no root apt-get; compose.yaml is checked without one" >&2
    return 0
  fi
  echo "ci-tools: installing docker-compose (Debian) to validate compose.yaml"
  if ! apt_install docker-compose; then
    echo "ci-tools: could not install docker-compose; compose.yaml is checked without it" >&2
  fi
}

install_chromium
install_compose
# Never fatal: the suite still runs, and the tests that need a missing tool fail with a
# message that names it.
exit 0
