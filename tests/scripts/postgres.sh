# Sourced by ./test.sh and the benchmark scripts: a local PostgreSQL server
# for the PostgreSQL sink's tests. The machine's PostgreSQL (15 in this
# image; installed with apt-get where it is missing) is initialised by
# `initdb` in a new directory under target/ (under the system's temporary
# directory when run as root), run by an unprivileged user (`postgres` when
# this script runs as root, which PostgreSQL refuses),
# listening on a free port of 127.0.0.1 and on a socket in that directory
# only, checked for readiness and stopped when the sourcing script exits.
# Exports SKIPPR_TEST_POSTGRES_URL (user `skippr`, password `skippr-test`,
# database `skippr`), SKIPPR_TEST_POSTGRES_CA (the CA of the server's TLS
# certificate) and SKIPPR_TEST_POSTGRES_RESTART (a command). Sourcing
# scripts add their own cleanup to `skippr_cleanup`.
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ]; then
    echo "postgres.sh: no PostgreSQL server here; installing Debian's package" >&2
    sudo_=""
    [ "$(id -u)" = 0 ] || sudo_=sudo
    $sudo_ apt-get install -y -q postgresql >/dev/null
    pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
pg_dir=$(mktemp -d "$PWD/target/postgres.XXXXXX")
pg_as=()
if [ "$(id -u)" = 0 ]; then
    # The server runs as `postgres`, which may not be able to reach a
    # checkout under a private directory (`mktemp -d` makes it 0700): as
    # root, its directory lives in the system's temporary directory.
    rmdir "$pg_dir"
    pg_dir=$(mktemp -d "${TMPDIR:-/tmp}/skippr-postgres.XXXXXX")
    chown postgres "$pg_dir"
    pg_as=(runuser -u postgres --)
fi
pg_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo skippr-test >"$pg_dir/pwfile"
chmod 0644 "$pg_dir/pwfile"
skippr_cleanup="${skippr_cleanup:-}${pg_as[*]} $pg_bin/pg_ctl -D $pg_dir/data -m immediate stop >/dev/null 2>&1; rm -rf $pg_dir;"
trap 'eval "$skippr_cleanup"' EXIT
"${pg_as[@]}" "$pg_bin/initdb" -D "$pg_dir/data" -U skippr --pwfile="$pg_dir/pwfile" -A scram-sha-256 \
    --no-sync >"$pg_dir/initdb.log" 2>&1 || { cat "$pg_dir/initdb.log" >&2; exit 1; }
# TLS: a CA made here and a server certificate it signs for localhost and
# 127.0.0.1, so that the sink's TLS is tested with verification on.
if ! command -v openssl >/dev/null; then
    echo "postgres.sh: no openssl here; installing Debian's package" >&2
    sudo_=""
    [ "$(id -u)" = 0 ] || sudo_=sudo
    $sudo_ apt-get install -y -q openssl >/dev/null
fi
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3 -subj /CN=skippr-test-ca \
    -keyout "$pg_dir/ca.key" -out "$pg_dir/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost \
    -keyout "$pg_dir/server.key" -out "$pg_dir/server.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$pg_dir/server.ext"
openssl x509 -req -in "$pg_dir/server.csr" -CA "$pg_dir/ca.crt" -CAkey "$pg_dir/ca.key" -CAcreateserial -days 3 \
    -extfile "$pg_dir/server.ext" -out "$pg_dir/server.crt" 2>/dev/null
chmod 0600 "$pg_dir/server.key"
if [ "$(id -u)" = 0 ]; then chown postgres "$pg_dir/server.key" "$pg_dir/server.crt"; fi
# Durability off: the tests prove what the sink does, not the server's fsync,
# and a shared CI host's disk is slow.
"${pg_as[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w -t 60 start \
    -o "-c listen_addresses=127.0.0.1 -p $pg_port -k $pg_dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 -c ssl=on -c ssl_cert_file=$pg_dir/server.crt -c ssl_key_file=$pg_dir/server.key" \
    >/dev/null || { cat "$pg_dir/server.log" >&2; exit 1; }
PGPASSWORD=skippr-test "$pg_bin/psql" -q -h 127.0.0.1 -p "$pg_port" -U skippr -d postgres \
    -c "CREATE DATABASE skippr" >/dev/null
export SKIPPR_TEST_POSTGRES_URL="postgresql://skippr:skippr-test@127.0.0.1:$pg_port/skippr"
export SKIPPR_TEST_POSTGRES_CA="$pg_dir/ca.crt"
# A fast restart (sessions terminated, the server back on the same port and
# options), for the test of a restart mid-batch. The log file keeps the new
# server from holding the caller's output open.
export SKIPPR_TEST_POSTGRES_RESTART="${pg_as[*]} $pg_bin/pg_ctl -D $pg_dir/data -l $pg_dir/server.log -w -t 60 -m fast restart"
