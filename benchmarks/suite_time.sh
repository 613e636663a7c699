#!/usr/bin/env bash
# How long CI takes from a fresh clone, and whether it passes, RUNS times in a row: each run a
# `git clone` of this repository's HEAD into a temporary folder, then `time CI=true bash .ci/run`
# there, the container images built cold (every image, container and build cache removed first:
# `docker system prune -af`, so run it where nothing else needs Docker's images). Writes
# benchmarks/results/suite-time-<stamp>.md: the machine, a row per run (its time, exit status, the
# two pytest processes' counts and each failed test), then the last run's image build steps
# (run/containers/timings.txt) and each process's ten slowest tests. Each run's whole log stays
# beside its clone's folder (printed at the end).
#
#   bash benchmarks/suite_time.sh [RUNS]     # RUNS: 1 by default
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=${1:-1}
STAMP=$(date +%Y%m%d-%H%M)
OUT=$ROOT/benchmarks/results/suite-time-$STAMP.md
COMMIT=$(git rev-parse --short HEAD)
ROWS=""
LOGS=""
FAILED_RUNS=0
for RUN in $(seq "$RUNS"); do
    CLONE=$(mktemp -d /tmp/funnel-suite-time.XXXXXX)
    LOG=$CLONE.log
    git clone -q "$ROOT" "$CLONE"
    command -v docker >/dev/null && docker system prune -af >/dev/null 2>&1 || true
    START=$(date +%s)
    STATUS=0
    (cd "$CLONE" && CI=true bash .ci/run) >"$LOG" 2>&1 || STATUS=$?
    TAKEN=$(( $(date +%s) - START ))
    [ "$STATUS" = 0 ] || FAILED_RUNS=$(( FAILED_RUNS + 1 ))
    # pytest's summary lines (the second process's first), and the tests that failed or errored.
    SUMMARY=$(grep -E "^=+ .*(passed|failed|error).* in [0-9.]+s" "$LOG" | sed 's/^=* //; s/ =*$//' | paste -sd ';' -)
    FAILURES=$(grep -E "^(FAILED|ERROR) " "$LOG" | sed 's/ - .*//' | sort -u | paste -sd ' ' - || true)
    ROWS+="| $RUN | $TAKEN s ($(( TAKEN / 60 )) min $(( TAKEN % 60 )) s) | $STATUS | ${SUMMARY:-none} | ${FAILURES:-none} |"$'\n'
    LOGS+="$LOG "
    echo "suite_time: run $RUN of $RUNS: $TAKEN s, exit status $STATUS${FAILURES:+: $FAILURES}"
    if [ "$RUN" = "$RUNS" ]; then
        TIMINGS=$(cat "$CLONE/run/containers/timings.txt" 2>/dev/null || echo "(no build: no Docker engine)")
        SLOWEST=$(grep -A10 "slowest 10 durations" "$LOG" || true)
    fi
    rm -rf "$CLONE"
done

{
    echo "# Fresh clones' .ci/run, $RUNS in a row, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB;" \
         "commit $COMMIT. Command: \`bash benchmarks/suite_time.sh $RUNS\`."
    echo
    echo "**$(( RUNS - FAILED_RUNS )) of $RUNS green.**"
    echo
    echo "| run | time | exit status | the two pytest processes (the second's first) | failed |"
    echo "| --- | --- | --- | --- | --- |"
    printf '%s' "$ROWS"
    echo
    echo "The last run's image build (tests/deploy/test_containers.py):"
    echo
    echo '```'
    echo "$TIMINGS"
    echo '```'
    echo
    echo "The last run's slowest tests of each process:"
    echo
    echo '```'
    echo "$SLOWEST"
    echo '```'
} >"$OUT"
echo "suite_time: $(( RUNS - FAILED_RUNS )) of $RUNS green: $OUT (the logs: $LOGS)"
[ "$FAILED_RUNS" = 0 ]
