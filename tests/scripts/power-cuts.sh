#!/usr/bin/env bash
# The power-cut loops under many kill schedules, outside ./test.sh (issue
# #29): ROUNDS seeds (10 by default) of the single-host loop, 100 cuts each
# mid-ingest with the acknowledging source, and of the clustered loop (the
# leader, a follower and two hosts at once three times each, then all
# three: 13 host cuts a round). Each round prints its seed, which
# SKIPPR_POWER_CUT_SEED=<seed> runs again; a failing round stops the script
# with its output. Needs what ./test.sh needs for FUSE: root and /dev/fuse.
# Results: BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-${ROUNDS:-10}}
. tests/scripts/fuse.sh
cargo build --release --locked --workspace --all-targets >/dev/null 2>&1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
round() { # seed test-module test-name
    local t0=$SECONDS
    if ! SKIPPR_POWER_CUT_SEED=$1 cargo test --release --locked --test e2e "$2::$3" -- --nocapture >"$log" 2>&1; then
        cat "$log"
        echo "power-cuts: seed $1 of $2 failed: SKIPPR_POWER_CUT_SEED=$1 cargo test --release --test e2e $2::$3 -- --nocapture" >&2
        exit 1
    fi
    echo "seed $1 $2: $((SECONDS - t0)) s: $(grep -E '^(100 cuts|Cuts)' "$log" | tail -1)"
}
start=$SECONDS
for seed in $(seq 1 "$ROUNDS"); do
    round "$seed" power_cut the_power_cut_mid_ingest_again_and_again
    round "$seed" power_cut_cluster power_cuts_of_the_leader
done
echo "power-cuts: $ROUNDS rounds, $((ROUNDS * 100)) single-host cuts and $((ROUNDS * 13)) clustered host cuts, all mid-ingest, in $((SECONDS - start)) s"
