#!/usr/bin/env bash
# Sweep speed of two skipprd binaries side by side, alternating, on the same
# machine: `tests/scripts/bench-sim-versions.sh OLD NEW [SEEDS]`. Build OLD
# from an earlier commit (for example in a `git worktree`), copy it aside,
# then build NEW. Prints one line per sweep; compare medians, not single runs.
set -euo pipefail
old=$1 new=$2 seeds=${3:-0..30000}
for i in 1 2 3; do
    for b in "$old" "$new"; do
        echo "$b disk $("$b" sim --seeds "$seeds" --jobs 2 2>/dev/null | tail -1)"
    done
done
for i in 1 2; do
    for b in "$old" "$new"; do
        echo "$b s3 $("$b" sim --wal s3 --seeds "$seeds" --jobs 2 2>/dev/null | tail -1)"
    done
done
