#!/usr/bin/env bash
# What one PostgreSQL primary sustains (docs/guide/scaling.md): calls per
# second and server CPU per call for renew, the acquire-release cycle and
# inspect at several client counts; renew among many keys against few;
# heartbeats of 1,000 keys as one group, as one batch and as single
# renews; and releases with many registered waiters.
#
#   benches/capacity.sh [-s SECONDS] [-k KEYS] [-f] [-o FILE]
#
#   -s SECONDS  pgbench's -T per run (default 10)
#   -k KEYS     held keys in the big database (default 100000)
#   -f          fsync=off (default: durable, fsync and synchronous_commit on)
#   -o FILE     write the report there too
#
# It starts its own throwaway server in a temporary directory (binaries
# from PGBIN, default /usr/lib/postgresql/15/bin; as user postgres when run
# as root), shared_buffers 256MB, max_connections 200, a Unix socket only;
# it ignores PGHOST and PGPORT and removes the server at the end. Two
# databases with the working tree's migrations: `big` (KEYS held keys k1..,
# a group of 1,000 keys, 1,000 keys for batches) and `small` (1,000 held
# keys). pgbench runs on the same machine (-M prepared, -j up to the core
# count), so a run's calls per second are what server and clients reach
# together; the server's own CPU per call (backends' CPU as the postmaster
# reaps them, divided by the calls) gives the calls one core sustains.
set -euo pipefail
seconds=10
keys=100000
fsync=on
out=""
while getopts "s:k:fo:" opt; do
    case "$opt" in
        s) seconds=$OPTARG ;;
        k) keys=$OPTARG ;;
        f) fsync=off ;;
        o) out=$OPTARG ;;
        *) exit 2 ;;
    esac
done
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
bin=${PGBIN:-/usr/lib/postgresql/15/bin}
cores=$(nproc)

scratch=$(mktemp -d /tmp/capacity.XXXXXX)
as_server=()
if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$scratch"
    as_server=(runuser -u postgres --)
fi
cleanup() {
    (cd "$scratch" && "${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -m immediate stop >/dev/null 2>&1) || true
    rm -rf "$scratch"
}
trap cleanup EXIT
(
    cd "$scratch"
    "${as_server[@]}" "$bin/initdb" -D "$scratch/data" -U postgres -A trust -E UTF8 --no-instructions >/dev/null
    "${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -l "$scratch/server.log" -w \
        -o "-c fsync=$fsync -c synchronous_commit=$fsync -c shared_buffers=256MB -c max_connections=200 -c listen_addresses='' -c unix_socket_directories='$scratch' -p 5432" \
        start >/dev/null
) || { echo "capacity.sh: the server did not start" >&2; cat "$scratch/server.log" >&2 2>/dev/null; exit 1; }
export PGHOST=$scratch PGPORT=5432 PGUSER=postgres
unset PGDATABASE PGSERVICE PGOPTIONS PGHOSTADDR
postmaster=$(head -n 1 "$scratch/data/postmaster.pid")
psql() { "$bin/psql" -qAtX -v ON_ERROR_STOP=1 "$@"; }
psql -d postgres -c "CREATE DATABASE big" -c "CREATE DATABASE small"
for db in big small; do
    for m in "$root"/migrations/*/up.sql "$root"/sql/functions/*.sql; do
        PGOPTIONS="-c client_min_messages=warning" psql -d "$db" -1 -f "$m" >/dev/null
    done
done

# Held keys k1..kN (epoch 1, owner cap), the group and the batch keys.
psql -d big -c "SELECT count(*) FROM generate_series(1, $keys) g, LATERAL lease.acquire('k' || g, 'cap', interval '100 years') a WHERE a.acquired" >/dev/null
psql -d small -c "SELECT count(*) FROM generate_series(1, 1000) g, LATERAL lease.acquire('k' || g, 'cap', interval '100 years') a WHERE a.acquired" >/dev/null
group=$(psql -d big <<'SQL'
SELECT count(*) FROM generate_series(1, 1000) g, LATERAL lease.acquire('g' || g, 'cap', interval '100 years') a WHERE a.acquired \g /dev/null
SELECT DISTINCT group_id FROM lease.join_group(
    (SELECT array_agg('g' || g ORDER BY g) FROM generate_series(1, 1000) g), 'cap',
    (SELECT array_agg(1::bigint) FROM generate_series(1, 1000) g), interval '1 hour');
SQL
)
psql -d big -c "SELECT count(*) FROM generate_series(1, 1000) g, LATERAL lease.acquire('m' || g, 'cap', interval '100 years') a WHERE a.acquired" >/dev/null
epoch=$(psql -d big -c "SELECT epoch FROM lease.inspect('k1')")
[ "$epoch" = 1 ] || { echo "capacity.sh: k1 has epoch $epoch, expected 1" >&2; exit 1; }
psql -d big -c "VACUUM ANALYZE" -c "CHECKPOINT"
psql -d small -c "VACUUM ANALYZE"

mkdir "$scratch/sql"
cat > "$scratch/sql/renew_big.sql" <<SQL
\set k random(1, $keys)
SELECT status FROM lease.renew('k' || :k, 'cap', 1, interval '100 years');
SQL
cat > "$scratch/sql/renew_small.sql" <<'SQL'
\set k random(1, 1000)
SELECT status FROM lease.renew('k' || :k, 'cap', 1, interval '100 years');
SQL
cat > "$scratch/sql/inspect.sql" <<SQL
\set k random(1, $keys)
SELECT held FROM lease.inspect('k' || :k);
SQL
# Two transactions: a grant of a random key of its own range per client
# (no denials), then its release.
cat > "$scratch/sql/cycle.sql" <<'SQL'
\set k random(1, 100000)
SELECT coalesce(epoch, 0) AS e FROM lease.acquire('c' || :client_id || '-' || :k, 'o' || :client_id, interval '30 s') \gset
SELECT status FROM lease.release('c' || :client_id || '-' || :k, 'o' || :client_id, :e);
SQL
cat > "$scratch/sql/group.sql" <<SQL
SELECT members FROM lease.renew_group($group, 'cap', interval '1 hour');
SQL
cat > "$scratch/sql/batch.sql" <<'SQL'
SELECT count(*) FROM lease.renew_many(
    (SELECT array_agg('m' || g ORDER BY g) FROM generate_series(1, 1000) g), 'cap',
    (SELECT array_agg(1::bigint) FROM generate_series(1, 1000) g), interval '100 years');
SQL

hz=$(getconf CLK_TCK)
reaped_ticks() { awk '{ print $16 + $17 }' "/proc/$postmaster/stat"; }
# Waits until no client backend of database $1 is left (their CPU is then
# in the postmaster's reaped time).
settle() {
    for _ in $(seq 1 200); do
        [ "$(psql -d postgres -c "SELECT count(*) FROM pg_stat_activity WHERE datname = '$1' AND backend_type = 'client backend'")" = 0 ] && return
        sleep 0.05
    done
}
report=""
row() { report+="$1"$'\n'; echo "$1" >&2; }
row "| workload | clients | calls/s | server CPU per call (µs) | calls/s per core (server CPU) |"
row "|---|---:|---:|---:|---:|"
# $1 label, $2 database, $3 script, $4 clients, $5 calls per transaction
run() {
    local label=$1 db=$2 script=$3 clients=$4 per=$5 before after tps calls cpu jobs
    jobs=$(( clients < cores ? clients : cores ))
    settle "$db"
    before=$(reaped_ticks)
    tps=$("$bin/pgbench" -n -M prepared -c "$clients" -j "$jobs" -T "$seconds" -f "$scratch/sql/$script" "$db" 2>/dev/null |
        awk '/^tps = / { print $3 }')
    settle "$db"
    after=$(reaped_ticks)
    calls=$(awk -v t="$tps" -v p="$per" -v s="$seconds" 'BEGIN { printf "%.0f", t * p * s }')
    cpu=$(awk -v b="$before" -v a="$after" -v hz="$hz" -v c="$calls" 'BEGIN { printf "%.1f", (a - b) / hz * 1e6 / c }')
    row "| $label | $clients | $(awk -v t="$tps" -v p="$per" 'BEGIN { printf "%.0f", t * p }') | $cpu | $(awk -v c="$cpu" 'BEGIN { printf "%.0f", 1e6 / c }') |"
}
# Warm-up, not reported: the first change of each page after the load's
# checkpoint writes a full page image; measured runs start after that.
"$bin/pgbench" -n -M prepared -c "$cores" -j "$cores" -T "$seconds" -f "$scratch/sql/renew_big.sql" big >/dev/null 2>&1
"$bin/pgbench" -n -M prepared -c "$cores" -j "$cores" -T "$seconds" -f "$scratch/sql/renew_small.sql" small >/dev/null 2>&1
for c in 1 4 16 64; do run "renew, $keys keys" big renew_big.sql "$c" 1; done
run "renew, 1000 keys" small renew_small.sql 1 1
run "renew, 1000 keys" small renew_small.sql 16 1
for c in 1 4 16 64; do run "acquire + release" big cycle.sql "$c" 2; done
for c in 1 16; do run "inspect, $keys keys" big inspect.sql "$c" 1; done
run "heartbeat: renew_group of 1000 keys (per call)" big group.sql 1 1
run "heartbeat: renew_many of 1000 keys (per call)" big batch.sql 1 1
# Waiters: 10,000 registrations on other keys (as 100 listener sessions
# with 100 keys each would leave), then one on a key of each cycle's range.
psql -d big -c "INSERT INTO lease.waiters (key_hash, backend_pid) SELECT sha256(convert_to('w' || g, 'UTF8')), 1000000 + g % 100 FROM generate_series(1, 10000) g"
run "acquire + release, 10000 waiters on other keys" big cycle.sql 16 2
psql -d big -c "INSERT INTO lease.waiters (key_hash, backend_pid) SELECT sha256(convert_to('c' || c || '-' || g, 'UTF8')), 2000000 + c FROM generate_series(1, 16) c, generate_series(1, 100000) g ON CONFLICT DO NOTHING"
run "acquire + release, a waiter on every key (each release notifies)" big cycle.sql 16 2

header="# Capacity of one primary ($(date -u +%Y-%m-%dT%H:%MZ))

PostgreSQL $("$bin/postgres" --version | awk '{ print $3 }'), $cores cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), fsync=$fsync, synchronous_commit=$fsync, $seconds s per run, pgbench -M prepared on the same machine; benches/capacity.sh at $(git -C "$root" rev-parse --short HEAD).
"
printf '%s\n%s' "$header" "$report"
[ -z "$out" ] || printf '%s\n%s' "$header" "$report" > "$out"
