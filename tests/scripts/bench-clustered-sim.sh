#!/usr/bin/env bash
# The clustered sweep's rate against the disk sweep's, in one script:
# `tests/scripts/bench-clustered-sim.sh BIN [OTHER_BIN...] [SEEDS]`. Each
# round runs the disk sweep with BIN, then the clustered sweep with every
# binary given (an older build to compare with, say), each under
# /usr/bin/time. Prints one line a round: wall and CPU seconds, and each
# clustered sweep's ratio to the disk sweep (disk time / clustered time,
# which is the ratio of their rates). Compare medians. See BENCHMARKS.md.
set -euo pipefail
seeds=0..20000
bins=()
for a in "$@"; do
    if [[ $a == *..* ]]; then seeds=$a; else bins+=("$a"); fi
done
[ ${#bins[@]} -gt 0 ] || { echo "usage: $0 BIN [OTHER_BIN...] [SEEDS]" >&2; exit 2; }
timed() { /usr/bin/time -f "%e %U %S" "$@" 2>&1 >/dev/null | tail -1; }
for round in 1 2 3; do
    read -r dw du ds < <(timed "${bins[0]}" sim --seeds "$seeds" --jobs 2)
    line="round $round: disk ${dw}s wall $(echo "$du + $ds" | bc)s cpu"
    for b in "${bins[@]}"; do
        read -r cw cu cs < <(timed "$b" sim --wal clustered --seeds "$seeds" --jobs 2)
        ratio=$(echo "scale=3; $dw / $cw" | bc)
        line="$line | $b clustered ${cw}s wall $(echo "$cu + $cs" | bc)s cpu, ratio $ratio"
    done
    echo "$line"
done
