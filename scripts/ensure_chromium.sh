#!/usr/bin/env bash
# The browser tests drive Debian's Chromium (/usr/bin/chromium) through Playwright; Playwright never
# downloads a browser of its own. Install the `chromium` package when it is missing and we are root;
# otherwise say how (the browser tests then skip locally, and fail under CI).
set -euo pipefail

CHROMIUM="${FAIRGATE_TEST_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "ensure_chromium: installing chromium (browser tests)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
else
  echo "ensure_chromium: no Chromium at $CHROMIUM; install it with 'sudo apt-get install chromium'" \
    "(the dashboard's browser tests skip without it, and fail when CI is set)" >&2
fi
