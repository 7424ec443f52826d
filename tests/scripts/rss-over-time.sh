#!/usr/bin/env bash
# Resident memory of a command over time: `tests/scripts/rss-over-time.sh
# INTERVAL_SECONDS COMMAND...` runs COMMAND, samples its VmRSS from /proc
# every INTERVAL_SECONDS, and prints one `seconds rss_mib` line per sample,
# then the peak (VmHWM), the command's exit status and its last output line. Used for issue #11's
# memory figures in BENCHMARKS.md.
set -euo pipefail
interval=$1
shift
log=$(mktemp)
"$@" >"$log" 2>&1 &
pid=$!
start=$(date +%s.%N)
peak=0
echo "seconds rss_mib"
while kill -0 "$pid" 2>/dev/null; do
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    if [[ -n "$rss" ]]; then
        now=$(date +%s.%N)
        awk -v a="$now" -v b="$start" -v r="$rss" 'BEGIN { printf "%.1f %d\n", a - b, r / 1024 }'
        [[ -n "$hwm" && "$hwm" -gt "$peak" ]] && peak=$hwm
    fi
    sleep "$interval"
done
status=0
wait "$pid" || status=$?
echo "peak_rss_mib $((peak / 1024))"
echo "exit $status"
tail -n 1 "$log"
rm -f "$log"
