#!/usr/bin/env bash
# How long CI takes from a fresh clone: `git clone` of this repository's HEAD into a temporary
# folder, then `time bash .ci/run` there, the container images built cold (every image, container
# and build cache removed first: `docker system prune -af`, so run it where nothing else needs
# Docker's images). Writes benchmarks/results/suite-time-<stamp>.md: the machine, the total, the
# two pytest processes' summary lines, the image build's steps (run/containers/timings.txt) and
# each process's ten slowest tests.
#
#   bash benchmarks/suite_time.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STAMP=$(date +%Y%m%d-%H%M)
CLONE=$(mktemp -d /tmp/funnel-suite-time.XXXXXX)
LOG=$CLONE.log
OUT=$ROOT/benchmarks/results/suite-time-$STAMP.md

git clone -q "$ROOT" "$CLONE"
command -v docker >/dev/null && docker system prune -af >/dev/null 2>&1 || true
START=$(date +%s)
STATUS=0
(cd "$CLONE" && CI=true bash .ci/run) >"$LOG" 2>&1 || STATUS=$?
SECONDS_TAKEN=$(( $(date +%s) - START ))

{
    echo "# A fresh clone's .ci/run, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "Machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB;" \
         "commit $(git -C "$CLONE" rev-parse --short HEAD). Command: \`bash benchmarks/suite_time.sh\`."
    echo
    echo "**$SECONDS_TAKEN s** ($(( SECONDS_TAKEN / 60 )) min $(( SECONDS_TAKEN % 60 )) s), exit status $STATUS."
    echo
    echo "The two pytest processes (the second process's line first):"
    echo
    echo '```'
    grep -E "^=+ .*(passed|failed).* in [0-9.]+s" "$LOG" || true
    echo '```'
    echo
    echo "The image build (tests/deploy/test_containers.py):"
    echo
    echo '```'
    cat "$CLONE/run/containers/timings.txt" 2>/dev/null || echo "(no build: no Docker engine)"
    echo '```'
    echo
    echo "The slowest tests of each process:"
    echo
    echo '```'
    grep -A10 "slowest 10 durations" "$LOG" || true
    echo '```'
} >"$OUT"
echo "suite_time: $SECONDS_TAKEN s, exit status $STATUS: $OUT (the whole log: $LOG)"
rm -rf "$CLONE"
exit "$STATUS"
