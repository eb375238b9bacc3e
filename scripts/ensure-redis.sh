#!/usr/bin/env bash
# Makes sure `redis-server`, `redis-sentinel` and `redis-cli` are on PATH (sourced by demo.sh
# and test.sh): the suite starts standalone masters, Redis Cluster members (`redis-cli --cluster
# create`) and Sentinel groups. Installs Debian's packages (redis-server, redis-sentinel,
# redis-tools) when one is missing and we can; otherwise prints the exact command and fails.
missing=()
if ! command -v redis-server >/dev/null 2>&1 && [ -z "${REDIS_SERVER_BIN:-}" ]; then
  missing+=(redis-server)
fi
command -v redis-sentinel >/dev/null 2>&1 || missing+=(redis-sentinel)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
# libfaketime steps a test server's clock (tests/safety/s17_clock_jump.rs); not required to run
# the rest, so its absence alone is not fatal below.
_ql_faketime=
for _ql_lib in /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1; do
  [ -e "$_ql_lib" ] && _ql_faketime=1
done
[ -n "$_ql_faketime" ] || missing+=(libfaketime)
unset _ql_faketime _ql_lib
if [ "${#missing[@]}" = 0 ]; then
  return 0 2>/dev/null || exit 0
fi
install="apt-get update -qq && apt-get install -y -qq ${missing[*]}"
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "${missing[*]} not found; installing Debian's packages..." >&2
    sh -c "$install" >&2
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    echo "${missing[*]} not found; installing Debian's packages with sudo..." >&2
    sudo sh -c "$install" >&2
  fi
fi
still=()
if ! command -v redis-server >/dev/null 2>&1 && [ -z "${REDIS_SERVER_BIN:-}" ]; then
  still+=(redis-server)
fi
command -v redis-sentinel >/dev/null 2>&1 || still+=(redis-sentinel)
command -v redis-cli >/dev/null 2>&1 || still+=(redis-tools)
if [ "${#still[@]}" != 0 ]; then
  echo "${still[*]} required (the packages of redis-server, redis-sentinel and redis-cli). Install with:" >&2
  echo "    sudo apt-get update && sudo apt-get install -y redis-server redis-sentinel redis-tools" >&2
  echo "(or set REDIS_SERVER_BIN to a redis-server binary)" >&2
  exit 1
fi
