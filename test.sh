#!/usr/bin/env bash
# The whole test suite, on a fresh machine: format, lints, unit tests,
# simulator sweeps, planted bugs, the seeds/ corpus and end-to-end tests.
# One optimized profile (release) serves the binary, the tests and the
# sweeps, so every crate is built once.
set -euo pipefail
cd "$(dirname "$0")"

cargo fmt --all --check
cargo clippy --release --workspace --all-targets --locked -- -D warnings
cargo build --release --locked -p skipprd
cargo test --release --locked --workspace
