#!/usr/bin/env bash
# Make a PostgreSQL reachable at 127.0.0.1:5432 for the metadata-DB tests (CI runs this):
# nothing to do when one answers; else install Debian's postgresql when missing, create the
# cluster when there is none (trusting loopback connections, as the tests connect without a
# password), and start it. The tests create and drop their own database on it.
set -euo pipefail

ready() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }

if command -v pg_isready >/dev/null 2>&1 && ready; then
  echo "ensure_postgres: PostgreSQL answers on 127.0.0.1:5432"
  exit 0
fi
if ! command -v pg_lsclusters >/dev/null 2>&1; then
  echo "ensure_postgres: installing postgresql"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql
fi
version=$(pg_lsclusters -h 2>/dev/null | awk '$2 == "main" {print $1; exit}')
if [ -z "$version" ]; then
  version=$(ls /usr/lib/postgresql | sort -V | tail -1)
  echo "ensure_postgres: creating cluster $version/main"
  pg_createcluster "$version" main --port 5432 >/dev/null
  hba="/etc/postgresql/$version/main/pg_hba.conf"
  printf 'local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n' \
    | cat - "$hba" >"$hba.new" && mv "$hba.new" "$hba"
fi
pg_ctlcluster "$version" main start 2>/dev/null || true
for _ in $(seq 100); do ready && break; sleep 0.2; done
if ready; then
  echo "ensure_postgres: PostgreSQL $version started on 127.0.0.1:5432"
else
  echo "ensure_postgres: PostgreSQL did not start; metadata-DB tests will fail" >&2
fi
