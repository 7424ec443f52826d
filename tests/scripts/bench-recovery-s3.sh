#!/usr/bin/env bash
# `skipprd bench recovery` in S3 mode, against the suite's local S3 and
# DynamoDB server (moto, started here): a sink answering `retryable` until
# the WAL in the bucket reaches WAL_MAX_BYTES, the daemon SIGKILLed or
# SIGTERMed, then started again with the directory sink; time to recovery
# and to the first delivery, peak RSS, the daemon's own scan rate.
#   SIZES=256,1024 ROUNDS=2 [DELAY_MS=12.5] tests/scripts/bench-recovery-s3.sh [--daemon OTHER_SKIPPRD]
# DELAY_MS puts tests/scripts/latency-proxy.py between the daemon and the
# server, adding that much each way (12.5: about a nearby S3 region's round
# trip). The lease is 1.5 s (a restart after a crash waits for the dead run's lease
# to lapse; the daemon's scan_seconds count from its listing). See
# BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --locked --bin skipprd >/dev/null
. tests/scripts/moto.sh
bin=$PWD/target/release/skipprd
work=$(mktemp -d "$PWD/target/bench-recovery-s3.XXXXXX")
trap 'kill "$moto_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing SKIPPR_AWS_REGION=us-east-1
export SKIPPR_AWS_ENDPOINT=$SKIPPR_TEST_AWS_ENDPOINT SKIPPR_OFFSET_DYNAMODB_TABLE=bench
if [ -n "${DELAY_MS:-}" ]; then
    proxy_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    python3 tests/scripts/latency-proxy.py "$proxy_port" "${SKIPPR_AWS_ENDPOINT#http://}" "$DELAY_MS" &
    proxy_pid=$!
    trap 'kill "$moto_pid" "$proxy_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
    sleep 0.5
fi
export SKIPPR_WAL_S3_BUCKET=bench SKIPPR_LEASE_SECONDS=1.5
"$moto_venv/bin/python" -c "
import boto3
boto3.client('s3', endpoint_url='$SKIPPR_AWS_ENDPOINT', region_name='us-east-1').create_bucket(Bucket='bench')"
$bin offsets init-table >/dev/null
[ -n "${DELAY_MS:-}" ] && export SKIPPR_AWS_ENDPOINT=http://127.0.0.1:$proxy_port
$bin bench recovery --wal-storage s3 --dir "$work" --sizes "${SIZES:-256,1024}" --rounds "${ROUNDS:-2}" "$@"
