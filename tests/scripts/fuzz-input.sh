#!/usr/bin/env bash
# A longer budget for the seeded input fuzzing of tests/tests/e2e/fuzz_input.rs
# than ./test.sh runs: SEEDS (default 0..500) for the file source, a sixth
# as many for the sink plugin's replies. A failure prints its seed and the
# command that runs it alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
SEEDS=${SEEDS:-0..500}
cargo build --release --locked --workspace --all-targets
SKIPPR_FUZZ_SEEDS=$SEEDS cargo test --release --locked --workspace --test e2e -- fuzz_input::random_files
a=${SEEDS%..*}
b=${SEEDS#*..}
SKIPPR_FUZZ_SEEDS=$a..$((a + (b - a) / 6 + 1)) cargo test --release --locked --workspace --test e2e -- fuzz_input::a_sink_plugin
