#!/usr/bin/env bash
# Client instructions per acquire+release, independent of the machine's load: the `cost` binary
# run under valgrind (cachegrind, no cache simulation) twice, with N and 3N operations; the
# difference divided by 2N cancels start-up, connects and warm-up. Redis servers (children) are
# not traced. Prints one line per implementation: instructions/op and its ratio to the floor.
#
#   tools/compare/cost.sh [BINARY] [TASKS] [N]
#
# BINARY defaults to tools/compare/target/release/cost (build it with
# `cargo build --release --manifest-path tools/compare/Cargo.toml --bin cost`). IMPLS (a
# space-separated list, the floor first) narrows the implementations run; RUNTIME=mt runs them on
# a tokio multi-thread runtime (default ct).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/target/release/cost}
tasks=${2:-1}
n=${3:-1000}
# One run's instruction count; a run that fails (a connect timing out under valgrind on a
# loaded box) is tried again, up to three times.
irefs() {
    local out
    for _ in 1 2 3; do
        out=$(valgrind --tool=cachegrind --cache-sim=no --trace-children=no \
            --cachegrind-out-file=/dev/null "$bin" --impl "$1" --ops "$2" --tasks "$tasks" --runtime "${RUNTIME:-ct}" 2>&1) \
            && { sed -n 's/.*I *refs: *//p' <<<"$out" | tr -d ','; return; }
        echo "retrying $1 --ops $2: $(grep -m1 -E 'panicked|Error' <<<"$out")" >&2
    done
    return 1
}
floor=
for impl in ${IMPLS:-floor floor+fence floor+pipefence quorumlock quorumlock-nofence}; do
    small=$(irefs "$impl" "$n")
    large=$(irefs "$impl" $((3 * n)))
    per_op=$(( (large - small) / (2 * n) ))
    floor=${floor:-$per_op}
    ratio=$(awk -v a="$per_op" -v b="$floor" 'BEGIN { printf "%.2f", a / b }')
    echo "$impl tasks=$tasks instructions/op=$per_op ratio-to-floor=$ratio"
done
