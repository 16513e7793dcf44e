#!/usr/bin/env bash
# The real clients the e2e tests run through the gateway: Claude Code and the Codex CLI, pinned to
# exact versions and installed with npm into a cache directory the suite owns (never globally).
# Idempotent: when the pinned versions are installed it only checks them (well under a second).
# Without Node/npm it says how to get them; the client tests then skip locally and fail under CI.
set -euo pipefail

# The pinned versions (tests/e2e/clients_support.py reads them from here too).
CLAUDE_CODE_VERSION="2.1.332"
CODEX_VERSION="0.171.0"

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${FAIRGATE_TEST_CLIENTS_DIR:-$ROOT/.cache/clients}"
STAMP="$DIR/installed-claude-$CLAUDE_CODE_VERSION-codex-$CODEX_VERSION"

if [ -f "$STAMP" ] && [ -x "$DIR/node_modules/.bin/claude" ] && [ -x "$DIR/node_modules/.bin/codex" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "ensure_clients: npm not found; install Node.js (>= 20) to run the Claude Code and Codex" \
    "tests (they skip without it, and fail when CI is set)" >&2
  exit 0
fi
mkdir -p "$DIR"
echo "ensure_clients: installing @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION and" \
  "@openai/codex@$CODEX_VERSION into $DIR"
rm -f "$DIR"/installed-*
# --prefix keeps everything in the cache dir; the clients' own postinstall picks the platform's
# native binary; no audit or funding calls
if ! npm install --prefix "$DIR" --no-audit --no-fund --no-save --loglevel=error \
  "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION"; then
  echo "ensure_clients: npm install failed (offline?); the client tests skip, and fail when CI is set" >&2
  [ -n "${CI:-}" ] && exit 1
  exit 0
fi
"$DIR/node_modules/.bin/claude" --version
"$DIR/node_modules/.bin/codex" --version
touch "$STAMP"
