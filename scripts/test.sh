#!/usr/bin/env bash
# Runs the whole test suite against real, throwaway redis-server processes, then the model
# checker's bounded profile as a step of its own (`cargo test` of one area does not pay for it).
# Every test runs even when one fails (`--no-fail-fast`); the exit status is non-zero if
# anything failed. Arguments, if any, go to the suite's `cargo test` and the model step is
# skipped (`bash scripts/test.sh --test waiting`, `bash scripts/test.sh -- --test-threads 1`).
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-redis.sh || exit 1
features=testkit,metrics,cli,tls,blocking,cron
status=0
cargo test --no-fail-fast --features "$features" "$@" || status=1
if [ "$#" = 0 ]; then
  cargo test --no-fail-fast --features "$features,model" --lib model:: || status=1
fi
exit "$status"
