#!/usr/bin/env bash
# Runs the demo: a throwaway local cluster of 5 redis-server processes, contention, a killed
# node and a handover with rising fencing tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ensure-redis.sh
cargo run --quiet --features cli --bin redlock -- demo
