#!/usr/bin/env bash
# A Singer tap's first sync of GIB GiB (default 4) with one closing STATE,
# and the same sync with a STATE every 10,000 records, side by side: the
# daemon's peak resident memory (GNU time's maximum RSS) and wall time for
# each, into the directory sink. The WAL's limit is raised above twice the
# window (a window may take half of it). Issue #33's benchmark:
# `tests/scripts/bench-singer-window.sh [GIB]` from the repository's root,
# with the release binary built; the data goes under $BENCH_DIR (default a
# temporary directory) and is removed at the end.
set -euo pipefail
gib=${1:-4}
bin=${SKIPPRD_BIN:-target/release/skipprd}
pad=1000
# About 1,060 bytes a record with the tap's own fields.
records=$((gib * 1024 * 1024 * 1024 / 1060))
dir=$(mktemp -d "${BENCH_DIR:-/tmp}/singer-window.XXXX")
trap 'rm -rf "$dir"' EXIT
limit=$(((2 * gib + 2) * 1024 * 1024 * 1024))
echo "records=$records pad=$pad wal_max_bytes=$limit"
for every in "$records" 10000; do
    rm -rf "$dir/data"
    stats=$(
        RECORDS=$records EVERY=$every PAD=$pad /usr/bin/time -f "%M %e" "$bin" run --once \
            --data-dir "$dir/data" --source singer --singer-command "python3 tests/plugins/singer_tap.py" \
            --sink-dir "$dir/data/sink" --wal-max-bytes "$limit" 2>&1 >/dev/null | tail -n 1
    )
    read -r kib secs <<<"$stats"
    lines=$(cat "$dir"/data/sink/events/*.jsonl | wc -l)
    echo "state_every=$every peak_rss_mib=$((kib / 1024)) seconds=$secs records_in_sink=$lines"
done
