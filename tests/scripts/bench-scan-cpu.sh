#!/usr/bin/env bash
# The daemon's CPU time for a recovery scan, two builds side by side:
#   tests/scripts/bench-scan-cpu.sh OLD_SKIPPRD NEW_SKIPPRD DATA_DIR [ROUNDS]
# DATA_DIR holds a full disk WAL (one `skipprd bench recovery` left, e.g.
# ./data/bench-recovery/wal-1024MiB). Each start removes the stop record,
# so that it scans, behind a sink answering `retryable` (nothing changes
# in the WAL); at its `recovered` line its user+system CPU time is read from
# /proc and it is SIGKILLed. Prints, per build, the medians of the CPU
# seconds and of the daemon's own `scan_seconds`.
set -euo pipefail
old=$1 new=$2 data=$3 rounds=${4:-7}
max=$(($(du -sb "$data/wal" | cut -f1) + (64 << 20)))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/sink.sh" <<'SINK'
#!/bin/sh
read hello
echo '{"type":"hello","protocol":1}'
while read request; do echo '{"type":"result","outcome":"retryable","rows":0}'; done
SINK
chmod +x "$tmp/sink.sh"
once() {
  rm -f "$data/stop-record"
  RUST_LOG=info "$1" run --data-dir "$data" --sink command --sink-command "$tmp/sink.sh" \
    --wal-max-bytes "$max" --generator-records 0 --drain-timeout 1 2> "$tmp/log" &
  local pid=$!
  for _ in $(seq 1 6000); do grep -q "recovered" "$tmp/log" && break; sleep 0.02; done
  local cpu
  cpu=$(awk '{print ($14 + $15) / 100}' "/proc/$pid/stat")
  kill -9 "$pid"; wait "$pid" 2>/dev/null || true
  echo "$1 cpu=$cpu $(grep -o 'scan_seconds=[0-9.]*' "$tmp/log")"
}
for _ in $(seq 1 "$rounds"); do once "$old"; once "$new"; done > "$tmp/runs"
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
for b in "$old" "$new"; do
  cpu=$(grep "^$b " "$tmp/runs" | grep -o 'cpu=[0-9.]*' | cut -d= -f2 | median)
  scan=$(grep "^$b " "$tmp/runs" | grep -o 'scan_seconds=[0-9.]*' | cut -d= -f2 | median)
  echo "$b: median CPU $cpu s, median scan $scan s ($rounds starts)"
done
