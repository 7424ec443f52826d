#!/usr/bin/env bash
# S3 mode's commit latency through a remote-like link (issue #34's
# baseline): moto on loopback behind tests/scripts/latency-proxy.py
# (DELAY_MS each way, default 12.5: about a 25 ms round trip), the generator
# paced at RATE records/s (default 4,000) over two partitions into the
# directory sink, `skipprd run --once`; each round prints the run's ack
# p50/p99 and, measured in the same round through the same proxy, the
# median latency of a single PUT of a group-sized object (If-None-Match),
# then an unpaced run's records/s and ack p99. Medians of ROUNDS rounds
# (default 3). `tests/scripts/bench-s3-latency.sh` from anywhere in the
# repository; see BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
RATE=${RATE:-4000}
RECORDS=${RECORDS:-20000}     # per partition, paced runs
UNPACED=${UNPACED:-100000}    # per partition, unpaced runs
DELAY_MS=${DELAY_MS:-12.5}
cargo build --release --locked -p skipprd >/dev/null
. tests/scripts/moto.sh
bin=$PWD/target/release/skipprd
work=$(mktemp -d "$PWD/target/bench-s3-latency.XXXXXX")
proxy_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 tests/scripts/latency-proxy.py "$proxy_port" "${SKIPPR_TEST_AWS_ENDPOINT#http://}" "$DELAY_MS" &
proxy_pid=$!
trap 'kill "$moto_pid" "$proxy_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
sleep 0.5
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing SKIPPR_AWS_REGION=us-east-1
export SKIPPR_AWS_ENDPOINT=$SKIPPR_TEST_AWS_ENDPOINT SKIPPR_OFFSET_DYNAMODB_TABLE=bench
"$moto_venv/bin/python" -c "
import boto3
boto3.client('s3', endpoint_url='$SKIPPR_AWS_ENDPOINT', region_name='us-east-1').create_bucket(Bucket='bench')"
$bin offsets init-table >/dev/null
export SKIPPR_AWS_ENDPOINT=http://127.0.0.1:$proxy_port

# One PUT's latency through the proxy: the median of 30 conditional puts
# (If-None-Match) of a 64 KiB group-sized object, each a new key, on one
# kept-alive connection as the SDK keeps its own, without `Expect:
# 100-continue` (which the SDK does not send either; boto3 would, and pay a
# round trip more). The first, which opens the connection, is left out.
put_ms() {
    local body=$work/put-body urls=()
    head -c 65536 /dev/urandom >"$body"
    for i in $(seq 0 30); do urls+=(-T "$body" "$SKIPPR_AWS_ENDPOINT/bench/put-probe/$1/$i"); done
    curl -sf -H "Expect:" -H "If-None-Match: *" -o /dev/null -w "%{time_total}\n" "${urls[@]}" |
        tail -n +2 | awk '{ print 1000 * $1 }' | sort -n | awk '{ a[NR] = $1 } END { printf "%.1f\n", a[int((NR + 1) / 2)] }'
}

# run RECORDS RATE: `records/s ack-p50-ms ack-p99-ms` of one run.
run() {
    local dir n
    dir=$(mktemp -d "$work/run.XXXXXX")
    n=$(basename "$dir")
    WAL_STORAGE=s3 SKIPPR_WAL_S3_BUCKET=bench SKIPPR_WAL_S3_PREFIX="$n/" $bin run --once --data-dir "$dir" \
        --pipeline "$n" --generator-partitions 2 --generator-records "$1" --generator-rate "$2" 2>/dev/null |
        tail -1 | awk -F', ' '{
            for (i = 1; i <= NF; i++) { split($i, kv, ": "); v[kv[1]] = kv[2] }
            sub("ms$", "", v["ack p50"]); sub("ms$", "", v["ack p99"]);
            printf "%d %s %s\n", v["records/s"], v["ack p50"], v["ack p99"] }'
}

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo "delay: $DELAY_MS ms each way, paced: 2 x $RECORDS records at $RATE/s, unpaced: 2 x $UNPACED, rounds: $ROUNDS"
: >"$work/p50" && : >"$work/p99" && : >"$work/put" && : >"$work/rate" && : >"$work/up99"
for r in $(seq "$ROUNDS"); do
    read -r _ p50 p99 <<<"$(run "$RECORDS" "$RATE")"
    put=$(put_ms "$r")
    read -r rate _ up99 <<<"$(run "$UNPACED" 0)"
    echo "round $r: paced ack p50 $p50 ms, p99 $p99 ms; one PUT $put ms; unpaced $rate records/s, ack p99 $up99 ms"
    echo "$p50" >>"$work/p50"; echo "$p99" >>"$work/p99"; echo "$put" >>"$work/put"
    echo "$rate" >>"$work/rate"; echo "$up99" >>"$work/up99"
done
echo "median: paced ack p50 $(median <"$work/p50") ms, p99 $(median <"$work/p99") ms; one PUT $(median <"$work/put") ms; unpaced $(median <"$work/rate") records/s, ack p99 $(median <"$work/up99") ms"
