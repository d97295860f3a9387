#!/usr/bin/env bash
# Debian tools some tests need, installed when missing (as root, with apt-get); seconds
# when they are already there. Both are required, and this script fails without them:
#   chromium: the browser the /ui tests drive with Playwright (tests/registry/ui);
#     Playwright cannot download a browser of its own here.
#   prometheus and promtool (Debian's `prometheus`): tests/deploy unit-tests the alert
#     rules with promtool, and tests/e2e/test_prometheus.py runs a real Prometheus.
#   nginx (Debian's `nginx-light`): bench/agent_proxy_overhead.py --floor-proxies puts
#     it in front of vLLM as a C proxy to compare the agent with (its CI test runs it).
#     Installed with its service kept from starting: the bench runs its own.
# The Compose CLI comes with the Docker engine (scripts/docker.sh).
set -uo pipefail

can_apt() {
  [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1
}
have_chromium() { [ -x /usr/bin/chromium ]; }
have_nginx() { [ -x /usr/sbin/nginx ]; }
have_prometheus() {
  command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1
}

updated=0
apt_install() {
  # Another apt (a parallel set-up) may hold the lock: wait for it rather than fail.
  if [ "$updated" -eq 0 ]; then
    apt-get -o DPkg::Lock::Timeout=300 update -qq || return 1
    updated=1
  fi
  # policy-rc.d 101: no package's service starts (nginx's would take port 80).
  local policy=/usr/sbin/policy-rc.d made_policy=0 rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends "$@" >/dev/null || rc=$?
  [ "$made_policy" -eq 1 ] && rm -f "$policy"
  return "$rc"
}

# ensure CHECK PACKAGE WHY: install PACKAGE when CHECK fails; say why it is needed if not.
ensure() {
  local check=$1 package=$2 why=$3
  "$check" && return 0
  if ! can_apt; then
    echo "ci-tools: ERROR: Debian's $package is missing and this is not root with apt-get;" \
         "install it (apt-get install --no-install-recommends $package): $why" >&2
    return 1
  fi
  echo "ci-tools: installing $package (Debian): $why"
  if ! apt_install "$package" || ! "$check"; then
    echo "ci-tools: ERROR: could not install Debian's $package (see apt-get's messages" \
         "above): $why" >&2
    return 1
  fi
}

status=0
ensure have_chromium chromium "the /ui browser tests (tests/registry/ui) drive it" || status=1
ensure have_prometheus prometheus \
  "promtool tests the alert rules, and tests/e2e/test_prometheus.py runs Prometheus" || status=1
ensure have_nginx nginx-light \
  "bench/agent_proxy_overhead.py --floor-proxies and its CI test run it" || status=1
exit "$status"
