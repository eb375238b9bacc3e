#!/usr/bin/env bash
# Where a runtime's time goes, per acquire+release, in figures that do not depend on the box's
# load: the `cost` binary's context switches (voluntary / involuntary, its own threads, from
# /proc) and futex calls (perf's syscalls:sys_enter_futex tracepoint; the redis-server children
# are counted too, and make almost none), each the difference of an N and a 3N run divided by
# 2N, so start-up, connects and warm-up cancel out. One line per implementation and runtime.
#
#   tools/compare/wakeups.sh [BINARY] [TASKS] [N]
#
# IMPLS (default: floor quorumlock quorumlock-io) and RUNTIMES (default: ct mt) narrow it.
# Needs perf with access to tracepoints (root, or kernel.perf_event_paranoid <= 1 and tracefs).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/target/release/cost}
tasks=${2:-1}
n=${3:-2000}
# One run: "voluntary involuntary futex" (totals over the measured operations, and futex calls
# over the whole run).
one() {
    local out ctx
    out=$(perf stat -x, -e syscalls:sys_enter_futex -- \
        "$bin" --impl "$1" --runtime "$2" --ops "$3" --tasks "$tasks" 2>&1)
    ctx=$(sed -n 's/.* ops=\([0-9]*\) .*ctxsw\/op=\([0-9.]*\)\/\([0-9.]*\).*/\1 \2 \3/p' <<<"$out")
    read -r ops vol invol <<<"$ctx"
    local futex
    futex=$(grep 'sys_enter_futex' <<<"$out" | cut -d, -f1)
    awk -v o="$ops" -v v="$vol" -v i="$invol" -v f="$futex" \
        'BEGIN { printf "%.0f %.0f %s\n", v * o, i * o, f }'
}
for impl in ${IMPLS:-floor quorumlock quorumlock-io}; do
    for rt in ${RUNTIMES:-ct mt}; do
        read -r v1 i1 f1 <<<"$(one "$impl" "$rt" "$n")"
        read -r v3 i3 f3 <<<"$(one "$impl" "$rt" $((3 * n)))"
        awk -v impl="$impl" -v rt="$rt" -v t="$tasks" -v n="$n" \
            -v v1="$v1" -v v3="$v3" -v i1="$i1" -v i3="$i3" -v f1="$f1" -v f3="$f3" \
            'BEGIN { printf "%s runtime=%s tasks=%s voluntary/op=%.2f involuntary/op=%.2f futex/op=%.2f\n",
                impl, rt, t, (v3 - v1) / (2 * n), (i3 - i1) / (2 * n), (f3 - f1) / (2 * n) }'
    done
done
