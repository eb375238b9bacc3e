#!/usr/bin/env bash
# Makes sure `redis-server` is on PATH (sourced by demo.sh and test.sh). Installs Debian's
# package when it is missing and we can; otherwise prints the exact command and fails.
if command -v redis-server >/dev/null 2>&1 || [ -n "${REDIS_SERVER_BIN:-}" ]; then
  return 0 2>/dev/null || exit 0
fi
install="apt-get update -qq && apt-get install -y -qq redis-server"
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "redis-server not found; installing Debian's package..." >&2
    sh -c "$install" >&2
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    echo "redis-server not found; installing Debian's package with sudo..." >&2
    sudo sh -c "$install" >&2
  fi
fi
if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server is required. Install it with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y redis-server" >&2
  echo "(or set REDIS_SERVER_BIN to a redis-server binary)" >&2
  exit 1
fi
