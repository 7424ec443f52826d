# Sourced by ./test.sh and the benchmark scripts: a local S3 and DynamoDB
# server (moto's server mode, at the version the tests were verified
# against) in a virtualenv under target/, on a free port of 127.0.0.1,
# checked for readiness and stopped when the sourcing script exits. Exports
# SKIPPR_TEST_AWS_ENDPOINT. Sourcing scripts add their own cleanup to
# `skippr_cleanup`.
MOTO_VERSION=5.2.5
moto_venv=target/moto-venv
if ! "$moto_venv/bin/python" -c "import sys, moto; sys.exit(moto.__version__ != '$MOTO_VERSION')" 2>/dev/null; then
    rm -rf "$moto_venv"
    python3 -m venv "$moto_venv"
    "$moto_venv/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION"
fi
moto_port=$("$moto_venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$moto_venv/bin/moto_server" -H 127.0.0.1 -p "$moto_port" >target/moto.log 2>&1 &
moto_pid=$!
skippr_cleanup="${skippr_cleanup:-}kill $moto_pid 2>/dev/null;"
trap 'eval "$skippr_cleanup"' EXIT
"$moto_venv/bin/python" - "$moto_port" <<'PY'
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
export SKIPPR_TEST_AWS_ENDPOINT="http://127.0.0.1:$moto_port"
