#!/usr/bin/env bash
# The whole test suite, on a fresh machine: format, lints, unit tests,
# simulator sweeps, planted bugs, the seeds/ corpus and end-to-end tests
# (those of S3 mode against a local S3 and DynamoDB server started here, the
# PostgreSQL sink's against a local PostgreSQL server started here, the
# Singer source's with a real tap installed here).
# One optimized profile (release) serves the binary, the tests and the
# sweeps, so every crate is built once.
set -euo pipefail
cd "$(dirname "$0")"

cargo fmt --all --check
cargo clippy --release --workspace --all-targets --locked -- -D warnings
# Every target at once (the binary, the libraries, the tests), so that the
# binary and the tests share one resolution of features: built alone, the
# binary leaves out features that test-only dependencies (turmoil) add to
# tokio, and `cargo test` would build tokio and the AWS SDK a second time.
cargo build --release --locked --workspace --all-targets

# A local S3 and DynamoDB server for the end-to-end tests of S3 mode (moto,
# pinned), and a PostgreSQL server for the PostgreSQL sink's (the machine's
# PostgreSQL, installed where missing, initialised under target/), each on
# 127.0.0.1 and stopped when this script exits; and the Singer tap tap-jsonl
# (pinned) in a virtualenv under target/.
. tests/scripts/moto.sh
. tests/scripts/postgres.sh
. tests/scripts/singer.sh
# FUSE for the power-cut tests (mounting as root; fuse3 installed where missing).
. tests/scripts/fuse.sh

cargo test --release --locked --workspace
