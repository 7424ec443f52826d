# Sourced by ./test.sh and the benchmark scripts: real Singer taps from
# PyPI, pinned with the Singer SDK they were verified with, in one
# virtualenv under target/: tap-jsonl (files) and MeltanoLabs' tap-postgres
# (an SDK tap that bookmarks on a replication key; 0.8.3 is the last on
# the SDK tap-jsonl needs). Exports SKIPPR_TEST_TAP_JSONL and
# SKIPPR_TEST_TAP_POSTGRES (their executables).
TAP_JSONL_VERSION=0.3.1
TAP_POSTGRES_VERSION=0.8.3
SINGER_SDK_VERSION=0.53.7
tap_venv=target/singer-venv
if ! "$tap_venv/bin/python" -c "
import sys
from importlib.metadata import version
sys.exit(version('tap-jsonl') != '$TAP_JSONL_VERSION' or version('singer-sdk') != '$SINGER_SDK_VERSION'
         or version('meltanolabs-tap-postgres') != '$TAP_POSTGRES_VERSION')" 2>/dev/null; then
    rm -rf "$tap_venv"
    python3 -m venv "$tap_venv"
    "$tap_venv/bin/pip" install --quiet --disable-pip-version-check \
        "tap-jsonl==$TAP_JSONL_VERSION" "singer-sdk==$SINGER_SDK_VERSION" \
        "meltanolabs-tap-postgres==$TAP_POSTGRES_VERSION"
fi
export SKIPPR_TEST_TAP_JSONL="$PWD/$tap_venv/bin/tap-jsonl"
export SKIPPR_TEST_TAP_POSTGRES="$PWD/$tap_venv/bin/tap-postgres"
