#!/usr/bin/env bash
# The whole test suite, on a fresh machine: format, lints, unit tests,
# simulator sweeps, planted bugs, the seeds/ corpus and end-to-end tests
# (those of S3 mode against a local S3 and DynamoDB server started here).
# One optimized profile (release) serves the binary, the tests and the
# sweeps, so every crate is built once.
set -euo pipefail
cd "$(dirname "$0")"

cargo fmt --all --check
cargo clippy --release --workspace --all-targets --locked -- -D warnings
cargo build --release --locked -p skipprd

# A local S3 and DynamoDB for the end-to-end tests: moto's server, at the
# version these tests were verified against, in a virtualenv under target/,
# on a free port on 127.0.0.1, stopped when this script exits.
MOTO_VERSION=5.2.5
venv=target/moto-venv
if ! "$venv/bin/python" -c "import sys, moto; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION"
fi
port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >target/moto.log 2>&1 &
moto_pid=$!
trap 'kill "$moto_pid" 2>/dev/null || true' EXIT
"$venv/bin/python" - "$port" <<'PY'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/moto-api/"
for _ in range(300):
    try:
        urllib.request.urlopen(url, timeout=1)
        sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit(f"moto did not answer at {url} within 30 s; see target/moto.log")
PY
export SKIPPR_TEST_AWS_ENDPOINT="http://127.0.0.1:$port"

cargo test --release --locked --workspace
