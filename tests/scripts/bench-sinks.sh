#!/usr/bin/env bash
# The sinks side by side, in one script, alternating: `skipprd run --once`,
# the built-in generator (two partitions) through the disk WAL into the
# directory sink, the PostgreSQL sink (a local server started as ./test.sh
# starts it) and the S3 sink (moto on loopback, as ./test.sh starts it).
# Each run gets a fresh data directory, schema or prefix. Prints one line a
# run (records/s over the whole run, which under --once ends only when the
# sink has applied everything; the seconds; compactions) and the medians.
# (The summary's ack window is not used: sources are acked at the WAL
# commit, before any sink sees the records.) See BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
RECORDS=${RECORDS:-200000}   # per partition
cargo build --release --locked -p skipprd >/dev/null
. tests/scripts/moto.sh
. tests/scripts/postgres.sh
bin=$PWD/target/release/skipprd
work=$(mktemp -d "$PWD/target/bench-sinks.XXXXXX")
skippr_cleanup="${skippr_cleanup}rm -rf $work;"
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing SKIPPR_AWS_REGION=us-east-1
export SKIPPR_AWS_ENDPOINT=$SKIPPR_TEST_AWS_ENDPOINT SKIPPR_POSTGRES_URL=$SKIPPR_TEST_POSTGRES_URL
"$moto_venv/bin/python" -c "
import boto3
boto3.client('s3', endpoint_url='$SKIPPR_AWS_ENDPOINT', region_name='us-east-1').create_bucket(Bucket='bench')"

# The summary line's fields: `records/s seconds compactions`.
fields() {
    awk -F', ' '/^records: / {
        for (i = 1; i <= NF; i++) { split($i, kv, ": "); v[kv[1]] = kv[2] }
        sub("s$", "", v["elapsed"]);
        printf "%d %.2f %d\n", v["records/s"], v["elapsed"], v["compactions"] }'
}

# run SINK: one `--once` run into a fresh destination; prints its fields.
run() {
    local dir n sink=()
    dir=$(mktemp -d "$work/run.XXXXXX")
    n=$(basename "$dir" | tr 'A-Z.' 'a-z_')
    case $1 in
        dir) sink=(--sink dir) ;;
        postgres) sink=(--sink postgres --postgres-schema "$n") ;;
        s3) sink=(--sink s3 --sink-s3-bucket bench --sink-s3-prefix "$n/") ;;
    esac
    "$bin" run --once --data-dir "$dir/data" --generator-partitions 2 --generator-records "$RECORDS" \
        "${sink[@]}" 2>/dev/null | fields
    rm -rf "$dir"
}

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo "records: 2 x $RECORDS, rounds: $ROUNDS, $(nproc) cores"
for sink in dir postgres s3; do : >"$work/$sink"; done
for r in $(seq "$ROUNDS"); do
    for sink in dir postgres s3; do
        out=$(run $sink)
        echo "round $r $sink: records/s, seconds, compactions = $out"
        echo "$out" >>"$work/$sink"
    done
done
for sink in dir postgres s3; do
    echo "median $sink: records/s $(cut -d' ' -f1 "$work/$sink" | median), seconds $(cut -d' ' -f2 "$work/$sink" | median), compactions $(cut -d' ' -f3 "$work/$sink" | median)"
done
