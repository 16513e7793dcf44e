#!/usr/bin/env bash
# Run a command with a reachable Redis exported as FAIRGATE_TEST_REDIS_URL:
# the one already named there, else 127.0.0.1:6379, else a throwaway redis-server on a free port
# (stopped again on exit). Tests use a unique key prefix, so a shared server keeps its data.
set -euo pipefail

ping_url() {
  python3 - "$1" <<'PY'
import socket, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
try:
    s = socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379), timeout=1)
    s.sendall(b"PING\r\n")
    ok = s.recv(64).startswith(b"+PONG")
except OSError:
    ok = False
sys.exit(0 if ok else 1)
PY
}

started_pid=""
cleanup() { [ -n "$started_pid" ] && kill "$started_pid" 2>/dev/null || true; }
trap cleanup EXIT

if [ -n "${FAIRGATE_TEST_REDIS_URL:-}" ] && ping_url "$FAIRGATE_TEST_REDIS_URL"; then
  echo "with_redis: using FAIRGATE_TEST_REDIS_URL"
elif ping_url "redis://127.0.0.1:6379/0"; then
  export FAIRGATE_TEST_REDIS_URL="redis://127.0.0.1:6379/0"
  echo "with_redis: using redis://127.0.0.1:6379/0"
elif command -v redis-server >/dev/null 2>&1; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no >/tmp/fairgate-redis-$port.log 2>&1 &
  started_pid=$!
  for _ in $(seq 50); do ping_url "redis://127.0.0.1:$port/0" && break; sleep 0.1; done
  export FAIRGATE_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
  echo "with_redis: started a throwaway redis-server on port $port"
else
  echo "with_redis: no Redis reachable and no redis-server installed; Redis tests will fail" >&2
fi

"$@"
