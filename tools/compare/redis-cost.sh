#!/usr/bin/env bash
# The nodes' instructions per acquire+release, independent of the machine's load: the `cost`
# binary's five redis-server nodes each run under valgrind (cachegrind, no cache simulation),
# twice, with N and 3N operations; the difference of the five nodes' summed counts divided by 2N
# cancels start-up, connects and warm-up. Use one task (TASKS=1, the default): with several, how
# many commands a node reads per wake-up depends on timing, and so does its event loop's share.
#
#   tools/compare/redis-cost.sh [BINARY] [N]
#
# IMPLS (space-separated, the floor first) narrows the implementations, as for cost.sh. Needs
# valgrind and redis-cli. testkit kills its servers with SIGKILL, which would lose cachegrind's
# counts: each node runs as the child of a small wrapper (REDIS_SERVER_BIN) that testkit kills,
# and is shut down afterwards by its port.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/target/release/cost}
n=${2:-300}
tasks=${TASKS:-1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/redis-server" <<'WRAP'
#!/usr/bin/env bash
port=""; prev=""
for a in "$@"; do [ "$prev" = "--port" ] && port=$a; prev=$a; done
echo "$port" >>"$CG_DIR/ports"
valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file="$CG_DIR/cg.%p" redis-server "$@" &
wait
WRAP
chmod +x "$work/redis-server"
# The five nodes' instructions for one run of `ops` operations.
irefs() {
    local dir="$work/run"
    rm -rf "$dir"; mkdir -p "$dir"; : >"$dir/ports"
    CG_DIR=$dir REDIS_SERVER_BIN=$work/redis-server "$bin" --impl "$1" --ops "$2" --tasks "$tasks" \
        >"$work/out" 2>&1 || { echo "$1 --ops $2 failed: $(tail -n 2 "$work/out")" >&2; }
    while read -r port; do
        [ -n "$port" ] && redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    done <"$dir/ports"
    for _ in $(seq 1 150); do
        pgrep -f "cachegrind-out-file=$dir/" >/dev/null || break
        sleep 0.2
    done
    cat "$dir"/cg.* | awk '/^summary:/ { s += $2 } END { print s }'
}
floor=
for impl in ${IMPLS:-floor floor+pipefence quorumlock quorumlock-nofence}; do
    small=$(irefs "$impl" "$n")
    large=$(irefs "$impl" $((3 * n)))
    per_op=$(( (large - small) / (2 * n) ))
    floor=${floor:-$per_op}
    ratio=$(awk -v a="$per_op" -v b="$floor" 'BEGIN { printf "%.2f", a / b }')
    echo "$impl tasks=$tasks redis-instructions/op=$per_op ratio-to-floor=$ratio"
done
