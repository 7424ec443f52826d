# Sourced by ./test.sh and the benchmark scripts: a real Singer tap from
# PyPI, tap-jsonl, pinned with the Singer SDK it was verified with, in a
# virtualenv under target/. Exports SKIPPR_TEST_TAP_JSONL (its executable).
TAP_JSONL_VERSION=0.3.1
SINGER_SDK_VERSION=0.53.7
tap_venv=target/singer-venv
if ! "$tap_venv/bin/python" -c "
import sys
from importlib.metadata import version
sys.exit(version('tap-jsonl') != '$TAP_JSONL_VERSION' or version('singer-sdk') != '$SINGER_SDK_VERSION')" 2>/dev/null; then
    rm -rf "$tap_venv"
    python3 -m venv "$tap_venv"
    "$tap_venv/bin/pip" install --quiet --disable-pip-version-check \
        "tap-jsonl==$TAP_JSONL_VERSION" "singer-sdk==$SINGER_SDK_VERSION"
fi
export SKIPPR_TEST_TAP_JSONL="$PWD/$tap_venv/bin/tap-jsonl"
