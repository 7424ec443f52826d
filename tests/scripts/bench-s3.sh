#!/usr/bin/env bash
# The daemon with its WAL in S3 (moto on loopback) beside the disk WAL, in
# one script, alternating: `skipprd run --once`, the generator into the
# directory sink, two partitions. Then S3 mode across segment sizes, which
# bound the commit group (an eighth of a segment, 1 KiB to 1 MiB): how many
# puts the same records take and how long each commit takes.
# Prints one line a run and the medians. See BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
RECORDS=${RECORDS:-100000}   # per partition
cargo build --release --locked -p skipprd >/dev/null
. tests/scripts/moto.sh
bin=target/release/skipprd
work=$(mktemp -d "$PWD/target/bench-s3.XXXXXX")
trap 'kill "$moto_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing SKIPPR_AWS_REGION=us-east-1
export SKIPPR_AWS_ENDPOINT=$SKIPPR_TEST_AWS_ENDPOINT SKIPPR_OFFSET_DYNAMODB_TABLE=bench
"$moto_venv/bin/python" -c "
import boto3
boto3.client('s3', endpoint_url='$SKIPPR_AWS_ENDPOINT', region_name='us-east-1').create_bucket(Bucket='bench')"
$bin offsets init-table >/dev/null

# run MODE SEGMENT_BYTES: prints `records/s commits commits/s ms/commit`, in
# a fresh data directory, WAL prefix and pipeline
run() {
    local dir n mode=$1 seg=$2
    dir=$(mktemp -d "$work/run.XXXXXX")
    n=$(basename "$dir")
    local env=(WAL_STORAGE=disk)
    [ "$mode" = s3 ] && env=(WAL_STORAGE=s3 SKIPPR_WAL_S3_BUCKET=bench SKIPPR_WAL_S3_PREFIX="$n/")
    local line
    line=$(env "${env[@]}" $bin run --once --data-dir "$dir" --pipeline "$n" --generator-partitions 2 \
        --generator-records "$RECORDS" --wal-bytes-per-file "$seg" 2>/dev/null | tail -1)
    # records: R, committed: R, commits: C, compactions: X, elapsed: Es, records/s: S, ... (by name)
    echo "$line" | awk -F', ' '{
        for (i = 1; i <= NF; i++) { split($i, kv, ": "); v[kv[1]] = kv[2] }
        sub("s$", "", v["elapsed"]);
        printf "%d %d %d %.2f\n", v["records/s"], v["commits"], v["commits"] / v["elapsed"], 1000 * v["elapsed"] / v["commits"] }'
}

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo "records: 2 x $RECORDS, rounds: $ROUNDS"
echo "== disk and s3 side by side (64 MiB segments, 1 MiB groups)"
: >"$work/disk" && : >"$work/s3"
for r in $(seq "$ROUNDS"); do
    for mode in disk s3; do
        out=$(run $mode 67108864)
        echo "round $r $mode: records/s commits commits/s ms/commit = $out"
        echo "$out" >>"$work/$mode"
    done
done
for mode in disk s3; do
    echo "median $mode: records/s $(cut -d' ' -f1 "$work/$mode" | median), commits/s $(cut -d' ' -f3 "$work/$mode" | median), ms/commit $(cut -d' ' -f4 "$work/$mode" | median)"
done
echo "== s3 by segment size"
for seg in 262144 1048576 8388608 67108864; do
    : >"$work/seg"
    for r in $(seq "$ROUNDS"); do run s3 $seg >>"$work/seg"; done
    echo "segment $seg bytes: puts $(cut -d' ' -f2 "$work/seg" | median), records/s $(cut -d' ' -f1 "$work/seg" | median), ms/commit $(cut -d' ' -f4 "$work/seg" | median)"
done
