# Sourced by the benches/levers scripts: a throwaway cluster for counting
# instructions. Needs `name` (the script's name, for messages and the
# directory). Sets root, bin, scratch, as_server, started and psql(); the
# cluster stops and its directory goes when the script exits. The scripts
# stop and start the server themselves around their single-user runs.
root=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
bin=${PGBIN:-/usr/lib/postgresql/15/bin}
command -v valgrind >/dev/null || { echo "$name: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
scratch=$(mktemp -d "/tmp/$name.XXXXXX")
as_server=()
if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$scratch"
    as_server=(runuser -u postgres --)
fi
started=""
cleanup() {
    [ -z "$started" ] || "${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$scratch"
}
trap cleanup EXIT
"${as_server[@]}" "$bin/initdb" -D "$scratch/data" -U postgres -A trust -E UTF8 --no-instructions >/dev/null
"${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -l "$scratch/server.log" -w \
    -o "-c fsync=off -c listen_addresses='' -c unix_socket_directories='$scratch' -p 5432" start >/dev/null
started=yes
export PGHOST=$scratch PGPORT=5432 PGUSER=postgres
unset PGDATABASE PGSERVICE PGOPTIONS PGHOSTADDR
psql() { "$bin/psql" -qAtX -v ON_ERROR_STOP=1 "$@"; }
