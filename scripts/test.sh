#!/usr/bin/env bash
# Runs the whole test suite against real, throwaway redis-server processes.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-redis.sh
cargo test --features testkit,metrics,cli,tls,blocking "$@"
