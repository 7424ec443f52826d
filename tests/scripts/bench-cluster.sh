#!/usr/bin/env bash
# Clustered mode (three `skipprd run` processes on loopback ports, mutual
# TLS, each with its own DATA_DIR on this disk) beside the disk WAL, in one
# script, alternating: `skipprd run --once`, the built-in generator into the
# directory sink, two partitions. For each run: records/s over the whole run
# (start-up, the election and the drain included), records/s over the window
# from the first read to the last ack, and the ack latency a source sees
# (p50, p99: from a read to the ack that covers it, which the engine sends
# once the commit group is visible: fdatasync'ed on disk; fdatasync'ed on a
# majority of the three hosts in clustered mode). Two phases: throughput
# (the generator unpaced, so reads run ahead of commits up to the pending
# limit and the ack latency is mostly that queue), and latency (the
# generator paced at RATE records/s, well below either mode's throughput,
# so the ack latency is the commit path's). Prints one line a run and the
# medians. See BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
RECORDS=${RECORDS:-500000}   # per partition, throughput phase
RATE=${RATE:-20000}          # records/s over both partitions, latency phase
PACED=${PACED:-50000}        # per partition, latency phase
cargo build --release --locked -p skipprd >/dev/null
bin=$PWD/target/release/skipprd
work=$(mktemp -d "$PWD/target/bench-cluster.XXXXXX")
trap 'jobs -p | xargs -r kill 2>/dev/null || true; rm -rf "$work"' EXIT
"$bin" cluster certs --dir "$work/certs" --nodes 1,2,3 >/dev/null

# The summary line's fields: `records/s window-records/s p50-ms p99-ms`.
fields() {
    awk -F', ' '/^records: / {
        for (i = 1; i <= NF; i++) { split($i, kv, ": "); v[kv[1]] = kv[2] }
        sub("s$", "", v["acked in"]); sub("ms$", "", v["ack p50"]); sub("ms$", "", v["ack p99"]);
        printf "%d %d %s %s\n", v["records/s"], v["records"] / v["acked in"], v["ack p50"], v["ack p99"] }'
}

free_ports() {
    python3 -c 'import socket
ss = [socket.socket() for _ in range('"$1"')]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))'
}

# run_MODE RECORDS RATE: one `--once` run of the generator, RECORDS per
# partition at RATE records/s (0: unpaced); prints its fields.
run_disk() {
    local dir
    dir=$(mktemp -d "$work/disk.XXXXXX")
    "$bin" run --once --generator-partitions 2 --generator-records "$1" --generator-rate "$2" \
        --data-dir "$dir/data" 2>/dev/null | fields
}

run_clustered() {
    local dir id peers n ports records=$1 rate=$2
    dir=$(mktemp -d "$work/cluster.XXXXXX")
    id=$("$bin" cluster init --node-id 1 --voters 1,2,3 "$dir/d1" | awk '{ print $2 }' | tr -d :)
    for n in 2 3; do "$bin" cluster init --node-id $n --voters 1,2,3 --cluster-id "$id" "$dir/d$n" >/dev/null; done
    read -ra ports <<<"$(free_ports 3)"
    peers="1=127.0.0.1:${ports[0]},2=127.0.0.1:${ports[1]},3=127.0.0.1:${ports[2]}"
    local pids=()
    for n in 1 2 3; do
        WAL_STORAGE=clustered DATA_DIR="$dir/d$n" SKIPPR_CLUSTER_NODE_ID=$n SKIPPR_CLUSTER_PEERS="$peers" \
            SKIPPR_CLUSTER_CA="$work/certs/ca.pem" SKIPPR_CLUSTER_CERT="$work/certs/node-$n.pem" \
            SKIPPR_CLUSTER_KEY="$work/certs/node-$n-key.pem" \
            "$bin" run --once --generator-partitions 2 --generator-records "$records" --generator-rate "$rate" \
            --sink-dir "$dir/sink" >"$dir/out$n" 2>"$dir/log$n" &
        pids+=($!)
    done
    wait "${pids[@]}"
    # The leader read the sources: its summary has every record.
    cat "$dir"/out1 "$dir"/out2 "$dir"/out3 | grep "^records: $((2 * records))," | head -1 | fields
}

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

# phase NAME RECORDS RATE
phase() {
    echo "== $1: 2 x $2 records, rate ${3/#0/unpaced}, $ROUNDS rounds, $(nproc) cores"
    : >"$work/disk" && : >"$work/clustered"
    for r in $(seq "$ROUNDS"); do
        for mode in disk clustered; do
            out=$(run_$mode "$2" "$3" | tail -1)
            [ -n "$out" ] || { echo "round $r $mode: no summary line with every record" >&2; exit 1; }
            echo "round $r $mode: records/s, in the window, ack p50 ms, ack p99 ms = $out"
            echo "$out" >>"$work/$mode"
        done
    done
    for mode in disk clustered; do
        echo "median $mode: records/s $(cut -d' ' -f1 "$work/$mode" | median), in the window $(cut -d' ' -f2 "$work/$mode" | median), ack p50 $(cut -d' ' -f3 "$work/$mode" | median) ms, ack p99 $(cut -d' ' -f4 "$work/$mode" | median) ms"
    done
}

phase throughput "$RECORDS" 0
phase latency "$PACED" "$RATE"
