#!/usr/bin/env bash
# Makes a Docker engine answer, for the container tests (tests/containers/) and
# `docker-compose up`: installs docker.io, docker-compose and debootstrap from Debian when
# they are missing, and starts dockerd in the background when no engine answers.
# Idempotent: a second run with an engine up does nothing. Fails with a message saying
# what to do when it cannot. DOCKER_HOST pointing elsewhere is respected (nothing started).
set -euo pipefail

LOG=${LORAPLANE_DOCKERD_LOG:-/var/log/loraplane-dockerd.log}
TIMEOUT_S=${LORAPLANE_DOCKERD_TIMEOUT:-60}

engine_up() { docker info >/dev/null 2>&1; }

fail() {
  echo "docker.sh: $*" >&2
  exit 1
}

missing_packages() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
  echo "${missing[@]}"
}

install_missing() {
  local missing
  missing=$(missing_packages)
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    fail "missing: $missing. Install them (Debian: apt-get install $missing) or start a Docker engine and set DOCKER_HOST."
  fi
  echo "docker.sh: installing $missing from Debian's packages"
  apt-get update -qq </dev/null
  # shellcheck disable=SC2086  # one word per package
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing \
    </dev/null >/dev/null || fail "apt-get install $missing failed"
}

start_dockerd() {
  [ "$(id -u)" -eq 0 ] || fail "no Docker engine answers and dockerd needs root: start one, or set DOCKER_HOST."
  echo "docker.sh: starting dockerd (log: $LOG)"
  # setsid: the engine outlives this script and the shell that ran it.
  setsid dockerd >>"$LOG" 2>&1 </dev/null &
  local deadline=$((SECONDS + TIMEOUT_S))
  while [ $SECONDS -lt $deadline ]; do
    engine_up && return 0
    kill -0 $! 2>/dev/null || fail "dockerd exited at once; its log says:
$(tail -n 20 "$LOG")"
    sleep 0.5
  done
  fail "dockerd did not answer within ${TIMEOUT_S}s; see $LOG"
}

install_missing
if [ -n "${DOCKER_HOST:-}" ]; then
  engine_up || fail "DOCKER_HOST=$DOCKER_HOST does not answer (docker info failed)."
  exit 0
fi
engine_up || start_dockerd
echo "docker.sh: the Docker engine answers ($(docker version --format '{{.Server.Version}}'))"
