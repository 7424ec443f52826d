#!/usr/bin/env bash
# Dead letters from a sink that names the records it refuses (protocol
# version 2, `refused`) beside one that cannot (version 1, `fatal` for the
# whole batch, which the daemon splits down to the record), in one script,
# alternating: `skipprd run --once` with the test source (two partitions of
# RECORDS, every BAD_EVERY-th record bad) into tests/plugins/sink.py
# (counting, keeping nothing), `--dead-letter dir`. Prints the seconds of
# each run and the dead letters it wrote. See BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
RECORDS=${RECORDS:-60000}
BAD_EVERY=${BAD_EVERY:-997}
cargo build --release --locked --quiet -p skipprd
bin=$PWD/target/release/skipprd
plugins=$PWD/tests/plugins
for round in $(seq "$ROUNDS"); do
  for version in 2 1; do
    work=$(mktemp -d "$PWD/target/bench-split.XXXXXX")
    if [ "$version" = 1 ]; then field=FATAL_FIELD; else field=REFUSE_FIELD; fi
    start=$(date +%s.%N)
    env "$field=bad" PROTOCOL="$version" RECORDS="$RECORDS" BAD_EVERY="$BAD_EVERY" \
      "$bin" run --once --data-dir "$work/data" \
      --source command --source-command "python3 $plugins/source.py" \
      --sink command --sink-command "python3 $plugins/sink.py" \
      --dead-letter dir --drain-timeout 600 >/dev/null 2>&1
    end=$(date +%s.%N)
    letters=$(cat "$work"/data/dead-letters/orders/*.jsonl | wc -l)
    echo "version $version, round $round: $(echo "$end - $start" | bc) s, $letters dead letters"
    rm -rf "$work"
  done
done
