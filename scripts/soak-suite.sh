#!/usr/bin/env bash
# Runs the whole suite (`bash scripts/test.sh`, the README's command) several times back to back
# on a fresh clone of the current commit, every other run with both cores kept busy by
# `stress-ng --cpu <cores>` (installed from Debian's packages when missing), and prints a tally:
# per run, the load, the wall time, tests passed / failed / ignored and the names of the failed
# tests. Exit status 0 only if no run had a failure.
#
#   bash scripts/soak-suite.sh            # 10 runs, 5 of them loaded
#   SOAK_RUNS=4 bash scripts/soak-suite.sh
#
# SOAK_DIR keeps the clone and the logs (default: a new temporary directory, printed).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
runs=${SOAK_RUNS:-10}
dir=${SOAK_DIR:-$(mktemp -d -t quorumlock-soak.XXXXXX)}
mkdir -p "$dir"
echo "soak: $runs runs of the suite on a fresh clone of $(git -C "$repo" rev-parse --short HEAD) in $dir" >&2

if ! command -v stress-ng >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq >&2 && apt-get install -y -qq stress-ng >&2
  fi
  command -v stress-ng >/dev/null 2>&1 || {
    echo "soak: stress-ng is required for the loaded runs (apt-get install stress-ng)" >&2
    exit 1
  }
fi

clone="$dir/clone"
rm -rf "$clone"
git clone --quiet "$repo" "$clone" || exit 1
git -C "$clone" checkout --quiet "$(git -C "$repo" rev-parse HEAD)" || exit 1
# Build once, before the first run, so every run measures the tests alone.
(cd "$clone" && . scripts/ensure-redis.sh &&
  cargo test --features testkit,metrics,cli,tls,blocking --no-run &&
  cargo test --features testkit,metrics,cli,tls,blocking,model --lib --no-run) \
  >"$dir/build.log" 2>&1 || {
  echo "soak: the build failed, see $dir/build.log" >&2
  exit 1
}

cores=$(nproc)
tally="$dir/tally.txt"
printf '| run | load | wall | passed | failed | ignored | failed tests |\n| ---: | --- | ---: | ---: | ---: | ---: | --- |\n' >"$tally"
bad=0
for run in $(seq 1 "$runs"); do
  log="$dir/run-$run.log"
  load=quiet
  stress=
  if [ $((run % 2)) = 0 ]; then
    load="stress-ng --cpu $cores"
    stress-ng --cpu "$cores" --quiet &
    stress=$!
  fi
  start=$(date +%s)
  (cd "$clone" && bash scripts/test.sh) >"$log" 2>&1
  rc=$?
  wall=$(($(date +%s) - start))
  if [ -n "$stress" ]; then
    kill "$stress" 2>/dev/null
    wait "$stress" 2>/dev/null
  fi
  sum() { grep -E '^test result:' "$log" | grep -oE "[0-9]+ $1" | awk '{s += $1} END {print s + 0}'; }
  passed=$(sum passed)
  failed=$(sum failed)
  ignored=$(sum ignored)
  names=$(grep -E '^---- .* stdout ----$' "$log" | sed -E 's/^---- (.*) stdout ----$/\1/' | paste -sd ' ' -)
  if [ "$rc" != 0 ] || [ "$failed" != 0 ]; then
    bad=$((bad + 1))
    [ -n "$names" ] || names="exit status $rc (see run-$run.log)"
  fi
  printf '| %s | %s | %ss | %s | %s | %s | %s |\n' "$run" "$load" "$wall" "$passed" "$failed" "$ignored" "${names:--}" | tee -a "$tally" >&2
done
echo >&2
cat "$tally"
echo "soak: $bad of $runs runs had a failure (logs in $dir)"
[ "$bad" = 0 ]
