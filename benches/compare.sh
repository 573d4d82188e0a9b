#!/usr/bin/env bash
# leasehold beside ShedLock and pglock, in one run (issue 44): what each
# lease call costs the server, and the acquire -> release cycle's throughput
# on a durable server. docs/guide/benchmarks.md explains every row.
#
#   benches/compare.sh [--calls N] [--seconds S] [--clients "1 4 16"]
#                      [--instructions-only | --throughput-only]
#
# Part 1, server instructions per call, counted by valgrind (callgrind) as
# benches/levers/instructions.sh counts them: with the server stopped, a
# single-user backend (fsync off) runs PREPARE and then 50 calls, and
# again 50 + N calls (default N = 200), each statement its own transaction,
# commit included; (second count - first count) / N is one call, with the
# backend's start and the plans' first use subtracted out. A call of two or
# three statements (a cycle) counts all of them. Rows: leasehold's calls
# as its Rust client sends them (renew, denied acquire, acquire -> release
# of a key used before and of a never-seen key, lease.inspect, and
# lease.key_state where the migrations have it, admit, admit_held,
# renew_many of 100 keys, renew_group of 100 members); the SQL ShedLock
# (database-time variant) and cirello pglock send for the same jobs, as
# benches/side_by_side.rs models it; the floor (a plain UPDATE of a
# lease-shaped row, without and with lease.leases' CHECK) and minimal
# PL/pgSQL SECURITY DEFINER functions (a renew and a read of the row).
# Each table of keys holds 1,000 other keys, analyzed. Every leasehold
# call's answers are checked (a renew answers ok, a release of the
# predicted epoch answers ok, ...), and each peer's statements are run
# once with psql first to check they do what the row says. Needs valgrind.
#
# Part 2, pgbench -M prepared throughput of the acquire -> release cycle
# (leasehold, ShedLock, pglock, the scripts of benches/side_by_side.rs) on
# the same cluster restarted durable (fsync on, synchronous_commit on), at
# 1, 4 and 16 clients, S seconds each (default 10), one pgbench thread per
# client.
#
# Runs as root or as any other user. Both parts use one throwaway cluster
# in a directory under /tmp (removed at the end), built
# with the working tree's migrations/*/up.sql and sql/functions/*.sql. Server binaries come from
# PGBIN (default /usr/lib/postgresql/15/bin; as user postgres when run as
# root, since initdb refuses root); psql and pgbench from PGBIN when they
# are there, else from /usr/lib/postgresql/15/bin or PATH (any version
# from 14 on talks to any server here). The report (date, PostgreSQL
# version, machine, both tables) goes to stdout and to
# bench-results/<timestamp>-compare.md; progress goes to stderr.
#
# Takes about 4 minutes with the defaults on a 2-core machine: 2 to 4
# for part 1 (40 callgrind runs, each bounded at 30 minutes) and 2 for
# part 2 (9 runs of 10 s, each bounded at its length + 2 minutes).
set -euo pipefail

usage() {
    sed -n '6,7p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
calls=200
seconds=10
clients="1 4 16"
instructions=yes
throughput=yes
args="$*"
while [ $# -gt 0 ]; do
    case "$1" in
        --calls) calls=${2:?}; shift 2 ;;
        --seconds) seconds=${2:?}; shift 2 ;;
        --clients) clients=${2:?}; clients=${clients//,/ }; shift 2 ;;
        --instructions-only) throughput=""; shift ;;
        --throughput-only) instructions=""; shift ;;
        -h|--help) usage ;;
        *) echo "compare.sh: unknown argument $1" >&2; usage ;;
    esac
done
[[ $calls =~ ^[1-9][0-9]*$ && $seconds =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --calls and --seconds take a positive number" >&2; exit 2; }
for c in $clients; do [[ $c =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: --clients takes positive numbers" >&2; exit 2; }; done
[ -n "$instructions$throughput" ] || { echo "compare.sh: nothing to run" >&2; exit 2; }

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
bin=${PGBIN:-/usr/lib/postgresql/15/bin}
tool() {
    local name=$1 dir
    for dir in "$bin" /usr/lib/postgresql/15/bin; do
        [ -x "$dir/$name" ] && { echo "$dir/$name"; return; }
    done
    command -v "$name" || { echo "compare.sh: no $name in $bin, /usr/lib/postgresql/15/bin or PATH" >&2; exit 1; }
}
for program in initdb pg_ctl postgres; do
    [ -x "$bin/$program" ] || { echo "compare.sh: no $bin/$program (set PGBIN)" >&2; exit 1; }
done
psql_bin=$(tool psql)
pgbench_bin=$(tool pgbench)
if [ -n "$instructions" ]; then
    command -v valgrind >/dev/null || { echo "compare.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
fi
say() { echo "compare.sh: $*" >&2; }
started_at=$(date +%s)

scratch=$(mktemp -d /tmp/compare.XXXXXX)
as_server=()
if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$scratch"
    as_server=(runuser -u postgres --)
fi
server_up=""
cleanup() {
    if [ -n "$server_up" ]; then
        (cd "$scratch" && "${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -m immediate stop >/dev/null 2>&1) || true
    fi
    rm -rf "$scratch"
}
trap cleanup EXIT

# server SETTINGS...: starts the cluster (pg_ctl waits at most 60 s).
server_start() {
    local settings=""
    for s in "$@"; do settings+=" -c $s"; done
    (cd "$scratch" && "${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -l "$scratch/server.log" -w -t 60 \
        -o "$settings -c listen_addresses='' -c unix_socket_directories='$scratch' -p 5432" start >/dev/null) ||
        { say "the server did not start:"; cat "$scratch/server.log" >&2 2>/dev/null; exit 1; }
    server_up=yes
}
server_stop() {
    (cd "$scratch" && "${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -m fast -w -t 60 stop >/dev/null)
    server_up=""
}
export PGHOST=$scratch PGPORT=5432 PGUSER=postgres
unset PGDATABASE PGSERVICE PGOPTIONS PGHOSTADDR PGPASSWORD
psql() { timeout 300 "$psql_bin" -qAtX -v ON_ERROR_STOP=1 "$@"; }

say "setting up a throwaway cluster in $scratch"
(cd "$scratch" && "${as_server[@]}" "$bin/initdb" -D "$scratch/data" -U postgres -A trust -E UTF8 --no-instructions >/dev/null)
server_start fsync=off
version=$(psql -d postgres -c "SELECT version()")
server_version=$(psql -d postgres -c "SHOW server_version")
install() {
    local db=$1 m
    psql -d postgres -c "CREATE DATABASE $db"
    for m in "$root"/migrations/*/up.sql "$root"/sql/functions/*.sql; do
        PGOPTIONS="-c client_min_messages=warning" psql -d "$db" -1 -f "$m" >/dev/null ||
            { say "${m#"$root"/} (working tree) does not install"; exit 1; }
    done
}

# The peers' statements, as benches/side_by_side.rs sends them, with the
# values as parameters. ShedLock (database-time variant): lock, unlock,
# extend. pglock: the record version number, acquire, release.
peer_tables="
CREATE TABLE shedlock (name varchar(64) PRIMARY KEY, lock_until timestamp NOT NULL, locked_at timestamp NOT NULL, locked_by varchar(255) NOT NULL);
CREATE TABLE locks (name text PRIMARY KEY, record_version_number bigint, data bytea, owner text);
CREATE SEQUENCE locks_rvn;"
shedlock_lock="INSERT INTO shedlock (name, lock_until, locked_at, locked_by) VALUES (\$1, now() + interval '30s', now(), \$2) ON CONFLICT (name) DO UPDATE SET lock_until = now() + interval '30s', locked_at = now(), locked_by = \$2 WHERE shedlock.lock_until <= now()"
shedlock_unlock="UPDATE shedlock SET lock_until = GREATEST(locked_at + interval '0s', now()) WHERE name = \$1 AND locked_by = \$2"
shedlock_extend="UPDATE shedlock SET lock_until = now() + interval '1 hour' WHERE name = \$1 AND locked_by = \$2 AND lock_until > now()"
pglock_rvn="SELECT nextval('locks_rvn') AS rvn"
pglock_acquire="INSERT INTO locks (name, record_version_number, data, owner) VALUES (\$1, \$2, NULL, \$3) ON CONFLICT (name) DO UPDATE SET record_version_number = \$2, owner = \$3 WHERE locks.record_version_number IS NULL"
pglock_release="DELETE FROM locks WHERE name = \$1 AND record_version_number = \$2"
# What leasehold's Rust client sends (src/sql/calls.rs).
lh_acquire="SELECT lease.acquire(\$1, \$2, \$3, \$4)"
lh_release="SELECT lease.release(\$1, \$2, \$3)"
lh_renew="SELECT lease.renew(\$1, \$2, \$3, \$4)"
# The probe below reads acquire's answer by column.
probe_acquire="SELECT acquired, epoch, expires_at FROM lease.acquire(\$1, \$2, \$3, \$4)"
lh_inspect="SELECT held, owner, epoch, expires_at FROM lease.inspect(\$1)"
lh_key_state="SELECT lease.key_state(\$1)"
lh_admit="SELECT true AS admitted FROM lease.admit(\$1, \$2, \$3)"
lh_admit_held="SELECT lease.admit_held(\$1, \$2, \$3, \$4)"
lh_renew_many="SELECT key, status, expires_at FROM lease.renew_many(\$1, \$2, \$3, \$4, \$5)"
lh_renew_group="SELECT status, expires_at, members FROM lease.renew_group(\$1, \$2, \$3)"
# The floor and the minimal definer functions (benches/levers/instructions.sh
# and function_ab.sh): renew's UPDATE of the key's row, alone or in a
# PL/pgSQL SECURITY DEFINER function with a pinned search_path; a read of
# the row in such a function.
floor_update='UPDATE %s SET expires_at = clock_timestamp() + $4 WHERE key_hash = sha256(convert_to($1, '"'UTF8'"')) AND key = $1 AND owner = $2 AND epoch = $3 AND expires_at > clock_timestamp() RETURNING expires_at'

if [ -n "$instructions" ]; then
    install bench
    # Keys: `held` (owner `owner`, 100 years: renew, denial, inspect, admit,
    # admit_held), `cyc` (granted and released: every cycle grants a FREE
    # row), many-1..100 (renew_many) and grp-1..100 (one group), all held.
    # Every table of keys also holds 1,000 others, analyzed, so that each
    # statement finds its row by the primary key, as in a table of any
    # size (in a table of three rows the planner scans the table, and then
    # a never-seen key each call makes every later call dearer).
    psql -d bench >/dev/null <<SQL
SET client_min_messages = warning;
SELECT lease.acquire('held', 'owner', interval '100 years');
SELECT lease.acquire('many-' || g, 'owner', interval '100 years') FROM generate_series(1, 100) g;
SELECT lease.acquire('grp-' || g, 'owner', interval '100 years') FROM generate_series(1, 100) g;
SELECT lease.acquire('other-' || g, 'owner', interval '100 years') FROM generate_series(1, 1000) g;
$peer_tables
INSERT INTO shedlock VALUES ('held', now() + interval '100 years', now(), 'host');
INSERT INTO shedlock SELECT 'other-' || g, now() + interval '100 years', now(), 'host' FROM generate_series(1, 1000) g;
INSERT INTO locks SELECT 'other-' || g, g, NULL, 'owner' FROM generate_series(1, 1000) g;
SELECT setval('locks_rvn', 1000);
CREATE SCHEMA c;
CREATE TABLE c.leases_nocheck (LIKE lease.leases INCLUDING DEFAULTS, PRIMARY KEY (key_hash));
INSERT INTO c.leases_nocheck SELECT * FROM lease.leases;
CREATE FUNCTION c.renew_minimal(key text, owner text, epoch bigint, ttl interval,
                                OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS \$\$
BEGIN
    UPDATE lease.leases AS l SET expires_at = clock_timestamp() + renew_minimal.ttl
     WHERE l.key_hash = sha256(convert_to(renew_minimal.key, 'UTF8')) AND l.key = renew_minimal.key
       AND l.owner = renew_minimal.owner AND l.epoch = renew_minimal.epoch AND l.expires_at > clock_timestamp()
    RETURNING l.expires_at INTO renew_minimal.expires_at;
    status := CASE WHEN FOUND THEN 'ok' ELSE 'lost' END;
END;
\$\$;
CREATE FUNCTION c.inspect_minimal(key text)
RETURNS TABLE (held boolean, owner text, epoch bigint, expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS \$\$
BEGIN
    RETURN QUERY
        SELECT l.owner IS NOT NULL AND l.expires_at > clock_timestamp(), l.owner::text, l.epoch::bigint, l.expires_at
          FROM lease.leases AS l
         WHERE l.key_hash = sha256(convert_to(inspect_minimal.key, 'UTF8')) AND l.key = inspect_minimal.key;
END;
\$\$;
SQL
    held_epoch=$(psql -d bench -c "SELECT epoch FROM lease.leases WHERE key = 'held'")
    # lease.key_state, where the migrations have it, is what the Rust
    # client's inspect sends; lease.inspect is the SQL-level call.
    key_state=$(psql -d bench -c "SELECT to_regprocedure('lease.key_state(text)') IS NOT NULL")
    group_id=$(psql -d bench -c "SELECT DISTINCT group_id FROM lease.join_group(ARRAY(SELECT 'grp-' || g FROM generate_series(1, 100) g), 'owner', ARRAY(SELECT l.epoch FROM generate_series(1, 100) g JOIN lease.leases l ON l.key = 'grp-' || g ORDER BY g), interval '100 years')")
    [[ $group_id =~ ^[0-9]+$ ]] || { say "join_group gave group '$group_id'"; exit 1; }
    # renew_many's arguments as the client binds them: keys, epochs and the
    # keys' digests.
    many_args=$(psql -d bench -c "SELECT format('%L, %L, %L, %L, %L', array_agg(l.key::text ORDER BY g)::text, 'owner', array_agg(l.epoch::bigint ORDER BY g)::text, '1 hour', array_agg(l.key_hash ORDER BY g)::text) FROM generate_series(1, 100) g JOIN lease.leases l ON l.key = 'many-' || g")
    # Each path once with psql, as the counts will run it: what every
    # answer will be, and how the cycle's epochs advance (the counts
    # predict them: a release names its grant's epoch).
    got=$(psql -d bench -v held="$held_epoch" -v group="$group_id" <<SQL
PREPARE acq(text, text, interval, interval) AS $probe_acquire;
PREPARE rel(text, text, bigint) AS $lh_release;
EXECUTE acq('cyc', 'owner', '30 s', '0');
SELECT epoch AS e FROM lease.leases WHERE key = 'cyc' \gset
EXECUTE rel('cyc', 'owner', :e);
SELECT epoch AS r1 FROM lease.leases WHERE key = 'cyc' \gset
EXECUTE acq('cyc', 'owner', '30 s', '0');
SELECT epoch AS e1 FROM lease.leases WHERE key = 'cyc' \gset
EXECUTE rel('cyc', 'owner', :e1);
EXECUTE acq('cyc', 'owner', '30 s', '0');
SELECT epoch AS e2 FROM lease.leases WHERE key = 'cyc' \gset
EXECUTE rel('cyc', 'owner', :e2);
SELECT 'offset', :e1 - :r1, 'step', :e2 - :e1;
EXECUTE acq('probe-new', 'owner', '30 s', '0');
EXECUTE acq('held', 'other', '30 s', '0');
SELECT status FROM lease.renew('held', 'owner', :held, '1 hour');
SELECT held FROM lease.inspect('held');
SELECT true FROM lease.admit('res', 'held', :held);
SELECT lease.admit_held('res-held', 'held', 'owner', :held) IS NOT NULL;
SELECT count(*) FILTER (WHERE status = 'ok') FROM lease.renew_many($many_args);
SELECT status, members FROM lease.renew_group(:group, 'owner', '1 hour');
SELECT status FROM c.renew_minimal('held', 'owner', :held, '1 hour');
SELECT held FROM c.inspect_minimal('held');
SQL
)
    cycle_offset=$(sed -n 's/^offset|\(-\{0,1\}[0-9]*\)|step|\(-\{0,1\}[0-9]*\)$/\1/p' <<<"$got")
    cycle_step=$(sed -n 's/^offset|\(-\{0,1\}[0-9]*\)|step|\(-\{0,1\}[0-9]*\)$/\2/p' <<<"$got")
    new_epoch=$(sed -n '8s/^t|\([0-9]*\)|.*/\1/p' <<<"$got")
    [ -n "$cycle_offset" ] && [ -n "$cycle_step" ] && [ -n "$new_epoch" ] &&
        [ "$(cut -d'|' -f1 <<<"$got" | sed 8q | tr '\n' ' ')" = "t ok t ok t ok offset t " ] &&
        [ "$(sed 1,8d <<<"$got" | tr '\n' ' ')" = "f|| ok t t t 100 ok|100 ok t " ] ||
        { printf 'compare.sh: a leasehold call does not answer as its row assumes:\n%s\n' "$got" >&2; exit 1; }
    # The peers once, with the command tags they must give.
    got=$(timeout 300 "$psql_bin" -AtX -v ON_ERROR_STOP=1 -d bench <<SQL
PREPARE sl(text, text) AS $shedlock_lock;
PREPARE su(text, text) AS $shedlock_unlock;
PREPARE se(text, text) AS $shedlock_extend;
PREPARE pr AS $pglock_rvn;
PREPARE pa(text, bigint, text) AS $pglock_acquire;
PREPARE pd(text, bigint) AS $pglock_release;
EXECUTE sl('probe', 'host');
EXECUTE su('probe', 'host');
EXECUTE sl('probe', 'host');
EXECUTE su('probe', 'host');
EXECUTE sl('held', 'other');
EXECUTE se('held', 'host');
EXECUTE pa('probe', 1, 'owner');
EXECUTE pd('probe', 1);
EXECUTE pa('probe', 2, 'owner');
EXECUTE pd('probe', 2);
SQL
)
    want=$(printf 'PREPARE\nPREPARE\nPREPARE\nPREPARE\nPREPARE\nPREPARE\nINSERT 0 1\nUPDATE 1\nINSERT 0 1\nUPDATE 1\nINSERT 0 0\nUPDATE 1\nINSERT 0 1\nDELETE 1\nINSERT 0 1\nDELETE 1')
    [ "$got" = "$want" ] || { printf 'compare.sh: a peer statement does not do what its row assumes:\nwant:\n%s\ngot:\n%s\n' "$want" "$got" >&2; exit 1; }
    psql -d bench -c "VACUUM ANALYZE" -c CHECKPOINT
fi
if [ -n "$throughput" ]; then
    install tput
    psql -d tput >/dev/null <<<"SET client_min_messages = warning; $peer_tables"
fi
server_stop

# ---------------------------------------------------------------------------
# Part 1: instructions.

# single SQL: the values a single-user backend answers (no valgrind).
single() {
    echo "$1" | timeout 120 "${as_server[@]}" "$bin/postgres" --single -D "$scratch/data" -c fsync=off bench 2>/dev/null |
        sed -n 's/^[[:space:]]*1: [a-z_]* = "\(.*\)"[[:space:]]*(typeid.*/\1/p'
}

# The rows: each function writes the input of N calls (PREPAREs, then
# the EXECUTEs, one statement a line: a transaction each) and sets
# `expect`, the answers the output must hold ("text:per call").
row_renew() {
    echo "PREPARE p(text, text, bigint, interval) AS $lh_renew;"
    for _ in $(seq "$1"); do echo "EXECUTE p('held', 'owner', $held_epoch, '1 hour');"; done
    expect=('renew = "(ok,:1')
}
row_denied() {
    echo "PREPARE p(text, text, interval, interval) AS $lh_acquire;"
    for _ in $(seq "$1"); do echo "EXECUTE p('held', 'other', '30 s', '0');"; done
    expect=('acquire = "(f,,)":1')
}
# A key used before: the FREE row's counter now, and the epochs the grants
# will take from it.
row_cycle() {
    local r i
    r=$(single "SELECT epoch FROM lease.leases WHERE key = 'cyc'")
    [[ $r =~ ^[0-9]+$ ]] || { say "could not read cyc's counter ('$r')"; exit 1; }
    echo "PREPARE a(text, text, interval, interval) AS $lh_acquire;"
    echo "PREPARE r(text, text, bigint) AS $lh_release;"
    for i in $(seq 0 $(($1 - 1))); do
        echo "EXECUTE a('cyc', 'owner', '30 s', '0');"
        echo "EXECUTE r('cyc', 'owner', $((r + cycle_offset + i * cycle_step)));"
    done
    expect=('acquire = "(t,:1' 'release = "ok":1')
}
# A never-seen key each call: new-<N>-<i> (the two counts differ in N).
row_cycle_new() {
    local i
    echo "PREPARE a(text, text, interval, interval) AS $lh_acquire;"
    echo "PREPARE r(text, text, bigint) AS $lh_release;"
    for i in $(seq "$1"); do
        echo "EXECUTE a('new-$1-$i', 'owner', '30 s', '0');"
        echo "EXECUTE r('new-$1-$i', 'owner', $new_epoch);"
    done
    expect=('acquire = "(t,:1' 'release = "ok":1')
}
row_inspect() {
    echo "PREPARE p(text) AS $lh_inspect;"
    for _ in $(seq "$1"); do echo "EXECUTE p('held');"; done
    expect=('held = "t":1')
}
row_key_state() {
    echo "PREPARE p(text) AS $lh_key_state;"
    for _ in $(seq "$1"); do echo "EXECUTE p('held');"; done
    expect=('key_state = "(held,:1')
}
row_admit() {
    echo "PREPARE p(text, text, bigint) AS $lh_admit;"
    for _ in $(seq "$1"); do echo "EXECUTE p('res', 'held', $held_epoch);"; done
    expect=('admitted = "t":1')
}
row_admit_held() {
    echo "PREPARE p(text, text, text, bigint) AS $lh_admit_held;"
    for _ in $(seq "$1"); do echo "EXECUTE p('res-held', 'held', 'owner', $held_epoch);"; done
    expect=('admit_held = "':1)
}
row_renew_many() {
    echo "PREPARE p(text[], text, bigint[], interval, bytea[]) AS $lh_renew_many;"
    for _ in $(seq "$1"); do echo "EXECUTE p($many_args);"; done
    expect=('status = "ok":100')
}
row_renew_group() {
    echo "PREPARE p(bigint, text, interval) AS $lh_renew_group;"
    for _ in $(seq "$1"); do echo "EXECUTE p($group_id, 'owner', '1 hour');"; done
    expect=('members = "100":1')
}
row_shedlock_extend() {
    echo "PREPARE p(text, text) AS $shedlock_extend;"
    for _ in $(seq "$1"); do echo "EXECUTE p('held', 'host');"; done
    expect=()
}
row_shedlock_denied() {
    echo "PREPARE p(text, text) AS $shedlock_lock;"
    for _ in $(seq "$1"); do echo "EXECUTE p('held', 'other');"; done
    expect=()
}
row_shedlock_cycle() {
    echo "PREPARE l(text, text) AS $shedlock_lock;"
    echo "PREPARE u(text, text) AS $shedlock_unlock;"
    for _ in $(seq "$1"); do echo "EXECUTE l('cyc', 'host');"; echo "EXECUTE u('cyc', 'host');"; done
    expect=()
}
row_shedlock_cycle_new() {
    local i
    echo "PREPARE l(text, text) AS $shedlock_lock;"
    echo "PREPARE u(text, text) AS $shedlock_unlock;"
    for i in $(seq "$1"); do echo "EXECUTE l('new-$1-$i', 'host');"; echo "EXECUTE u('new-$1-$i', 'host');"; done
    expect=()
}
# pglock's record version number comes from the sequence; the statements
# after it bind one of ours (the same cost: any bigint).
row_pglock_cycle() {
    local i
    echo "PREPARE s AS $pglock_rvn;"
    echo "PREPARE a(text, bigint, text) AS $pglock_acquire;"
    echo "PREPARE d(text, bigint) AS $pglock_release;"
    for i in $(seq "$1"); do
        echo "EXECUTE s;"; echo "EXECUTE a('cyc', $i, 'owner');"; echo "EXECUTE d('cyc', $i);"
    done
    expect=('rvn = "':1)
}
row_pglock_cycle_new() {
    local i
    echo "PREPARE s AS $pglock_rvn;"
    echo "PREPARE a(text, bigint, text) AS $pglock_acquire;"
    echo "PREPARE d(text, bigint) AS $pglock_release;"
    for i in $(seq "$1"); do
        echo "EXECUTE s;"; echo "EXECUTE a('new-$1-$i', $i, 'owner');"; echo "EXECUTE d('new-$1-$i', $i);"
    done
    expect=('rvn = "':1)
}
row_floor() {
    echo "PREPARE p(text, text, bigint, interval) AS $(printf "$floor_update" c.leases_nocheck);"
    for _ in $(seq "$1"); do echo "EXECUTE p('held', 'owner', $held_epoch, '1 hour');"; done
    expect=('expires_at = "':1)
}
row_floor_check() {
    echo "PREPARE p(text, text, bigint, interval) AS $(printf "$floor_update" lease.leases);"
    for _ in $(seq "$1"); do echo "EXECUTE p('held', 'owner', $held_epoch, '1 hour');"; done
    expect=('expires_at = "':1)
}
row_definer_renew() {
    echo "PREPARE p(text, text, bigint, interval) AS SELECT c.renew_minimal(\$1, \$2, \$3, \$4);"
    for _ in $(seq "$1"); do echo "EXECUTE p('held', 'owner', $held_epoch, '1 hour');"; done
    expect=('renew_minimal = "(ok,:1')
}
# The same read called in the select list, as the Rust client calls
# lease.key_state: the reference for that row.
row_definer_read_col() {
    echo "PREPARE p(text) AS SELECT c.inspect_minimal(\$1);"
    for _ in $(seq "$1"); do echo "EXECUTE p('held');"; done
    expect=('inspect_minimal = "(t,:1')
}
row_definer_read() {
    echo "PREPARE p(text) AS SELECT * FROM c.inspect_minimal(\$1);"
    for _ in $(seq "$1"); do echo "EXECUTE p('held');"; done
    expect=('held = "t":1')
}

# count ROW N: the instructions of a single-user backend running ROW's
# input of N calls, after checking its answers.
count() {
    local row=$1 n=$2 input=$scratch/input.sql out=$scratch/out.txt err=$scratch/err.txt spec got
    expect=()
    "row_$row" "$n" > "$input"
    chmod a+r "$input"
    (cd "$scratch" && timeout 1800 "${as_server[@]}" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$bin/postgres" --single -D "$scratch/data" -c fsync=off bench) < "$input" > "$out" 2> "$err" ||
        { say "the backend failed on row $row:"; tail -n 20 "$err" >&2; exit 1; }
    if grep -E '^(ERROR|FATAL|PANIC|WARNING):' "$err" >&2; then
        say "row $row ran into the errors above"; exit 1
    fi
    for spec in "${expect[@]}"; do
        got=$(grep -cF -- "${spec%:*}" "$out" || true)
        [ "$got" -eq $((${spec##*:} * n)) ] ||
            { say "row $row: '${spec%:*}' $got times in $n calls, expected ${spec##*:} a call"; exit 1; }
    done
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$err"
}
declare -A cost
measure() {
    local row=$1 n=${2:-$calls} low high
    say "counting $row ($n calls)"
    low=$(count "$row" 50)
    high=$(count "$row" $((50 + n)))
    [[ $low =~ ^[0-9]+$ && $high =~ ^[0-9]+$ ]] || { say "row $row: no count from callgrind"; exit 1; }
    cost[$row]=$(((high - low) / n))
}
# 12,345,678
num() { [ -n "${1:-}" ] && sed ':a;s/\B[0-9]\{3\}\>/,&/;ta' <<<"$1" || echo "–"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f×", a / b }'; }

instruction_table=""
if [ -n "$instructions" ]; then
    batch_calls=$(((calls + 9) / 10))
    for row in renew shedlock_extend denied shedlock_denied cycle shedlock_cycle pglock_cycle \
               cycle_new shedlock_cycle_new pglock_cycle_new inspect definer_read admit admit_held \
               floor floor_check definer_renew renew_group; do
        measure "$row"
    done
    [ "$key_state" = f ] || { measure key_state; measure definer_read_col; }
    measure renew_many "$batch_calls"
    line() { # call leasehold shedlock pglock reference ratio
        printf '| %s | %s | %s | %s | %s | %s |\n' "$1" "$(num "${cost[$2]:-}")" "$(num "${cost[$3]:-}")" \
            "$(num "${cost[$4]:-}")" "$(num "${cost[$5]:-}")" "$6"
    }
    instruction_table=$(
        echo "| call | leasehold | ShedLock | pglock | reference | ratio |"
        echo "|---|---:|---:|---:|---:|---:|"
        line "renew, ttl 1 hour (ShedLock: extend; reference: minimal definer renew)" renew shedlock_extend - definer_renew \
            "$(ratio "${cost[renew]}" "${cost[shedlock_extend]}") ShedLock"
        line "denied acquire (ShedLock: its lock statement, which updates nothing)" denied shedlock_denied - - \
            "$(ratio "${cost[denied]}" "${cost[shedlock_denied]}") ShedLock"
        line "acquire → release, a key used before (two transactions; pglock: three)" cycle shedlock_cycle pglock_cycle - \
            "$(ratio "${cost[cycle]}" "${cost[shedlock_cycle]}") ShedLock"
        line "acquire → release, a never-seen key each call" cycle_new shedlock_cycle_new pglock_cycle_new - \
            "$(ratio "${cost[cycle_new]}" "${cost[shedlock_cycle_new]}") ShedLock"
        line "inspect (reference: minimal definer read of the row)" inspect - - definer_read \
            "$(ratio "${cost[inspect]}" "${cost[definer_read]}") reference"
        if [ "$key_state" = t ]; then
            line "key_state (the Rust client's inspect, in the select list; reference: the same read, so called)" key_state - - definer_read_col \
                "$(ratio "${cost[key_state]}" "${cost[definer_read_col]}") reference"
        fi
        line "admit (\`lease.admit\`, the guard row exists)" admit - - - "–"
        line "admit_held" admit_held - - - "–"
        line "renew_many of 100 keys ($batch_calls calls)" renew_many - - - "–"
        line "renew_group, a group of 100 keys" renew_group - - - "–"
        line "floor: plain UPDATE of a lease-shaped row (renew's WHERE, no CHECK)" - - - floor "–"
        line "the same UPDATE of lease.leases (its CHECK)" - - - floor_check "–"
    )
fi

# ---------------------------------------------------------------------------
# Part 2: throughput.

throughput_table=""
if [ -n "$throughput" ]; then
    server_start fsync=on synchronous_commit=on
    mkdir -p "$scratch/pgbench"
    # The scripts of benches/side_by_side.rs (Op::Cycle, and the peers').
    cat > "$scratch/pgbench/leasehold.sql" <<'EOF'
SELECT (lease.acquire('cyc-' || :client_id, 'o' || :client_id, interval '30s', interval '0')).epoch AS epoch \gset
SELECT lease.release('cyc-' || :client_id, 'o' || :client_id, :epoch);
EOF
    cat > "$scratch/pgbench/ShedLock.sql" <<'EOF'
INSERT INTO shedlock (name, lock_until, locked_at, locked_by) VALUES ('cyc-' || :client_id, now() + interval '30s', now(), 'host-' || :client_id) ON CONFLICT (name) DO UPDATE SET lock_until = now() + interval '30s', locked_at = now(), locked_by = 'host-' || :client_id WHERE shedlock.lock_until <= now();
UPDATE shedlock SET lock_until = GREATEST(locked_at + interval '0s', now()) WHERE name = 'cyc-' || :client_id AND locked_by = 'host-' || :client_id;
EOF
    cat > "$scratch/pgbench/pglock.sql" <<'EOF'
SELECT nextval('locks_rvn') AS rvn \gset
INSERT INTO locks (name, record_version_number, data, owner) VALUES ('cyc-' || :client_id, :rvn, NULL, 'o-' || :client_id) ON CONFLICT (name) DO UPDATE SET record_version_number = :rvn, owner = 'o-' || :client_id WHERE locks.record_version_number IS NULL;
DELETE FROM locks WHERE name = 'cyc-' || :client_id AND record_version_number = :rvn;
EOF
    chmod -R a+rX "$scratch/pgbench"
    # pgbench PEER CLIENTS SECONDS: transactions (cycles) per second.
    bench() {
        local log=$scratch/pgbench/$1-$2.log
        (cd "$scratch/pgbench" && timeout $(($3 + 120)) "$pgbench_bin" -n -M prepared -c "$2" -j "$2" -T "$3" \
            -f "$1.sql" tput) > "$log" 2>&1 ||
            { say "pgbench failed for $1 at $2 clients:"; tail -n 20 "$log" >&2; exit 1; }
        sed -n 's/^tps = \([0-9.]*\) .*without initial connection time.*/\1/p' "$log"
    }
    # Each script once: it runs without an error, and leasehold's release
    # answers ok.
    for peer in leasehold ShedLock pglock; do
        (cd "$scratch/pgbench" && timeout 60 "$pgbench_bin" -n -M prepared -c 1 -t 3 -f "$peer.sql" tput) \
            > "$scratch/pgbench/check.log" 2>&1 || { say "pgbench's $peer script fails:"; cat "$scratch/pgbench/check.log" >&2; exit 1; }
    done
    [ "$(psql -d tput -c "SELECT epoch FROM lease.leases WHERE key = 'cyc-0' AND owner IS NULL")" != "" ] ||
        { say "leasehold's cycle script did not release its key"; exit 1; }
    throughput_table=$(
        echo "| clients | leasehold | ShedLock | pglock | leasehold ÷ ShedLock | leasehold ÷ pglock |"
        echo "|---:|---:|---:|---:|---:|---:|"
        for c in $clients; do
            declare -A tps=()
            for peer in leasehold ShedLock pglock; do
                say "pgbench: $peer cycle, $c clients, $seconds s"
                tps[$peer]=$(bench "$peer" "$c" "$seconds")
                [ -n "${tps[$peer]}" ] || { say "no tps from pgbench for $peer"; exit 1; }
            done
            printf '| %s | %s | %s | %s | %s | %s |\n' "$c" \
                "$(num "$(printf '%.0f' "${tps[leasehold]}")")" "$(num "$(printf '%.0f' "${tps[ShedLock]}")")" \
                "$(num "$(printf '%.0f' "${tps[pglock]}")")" \
                "$(ratio "${tps[leasehold]}" "${tps[ShedLock]}")" "$(ratio "${tps[leasehold]}" "${tps[pglock]}")"
        done
    )
    wal_sync=$(psql -d postgres -c "SHOW wal_sync_method")
    server_stop
fi

# ---------------------------------------------------------------------------
# The report.

stamp=$(date -u +%Y-%m-%dT%H-%M-%SZ)
commit=$(git -C "$root" rev-parse --short HEAD)
dirty=$(git -C "$root" status --porcelain -- migrations/ sql/ | wc -l)
elapsed=$(($(date +%s) - started_at))
report=$(
    echo "## leasehold beside ShedLock and pglock, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "\`benches/compare.sh${args:+ $args}\`, $((elapsed / 60)) min $((elapsed % 60)) s."
    echo "Migrations: the working tree at $commit$( [ "$dirty" -eq 0 ] || echo ", with uncommitted changes to $dirty file(s) under migrations/ or sql/")."
    echo "Server: $version. Client tools: $("$pgbench_bin" --version)."
    echo "Machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), load average at the end $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "The machine is shared: a CI run may have been running on the same cores, so the pgbench figures are noisy (±20 % between runs here); callgrind's counts are not affected (they move by less than 1 %)."
    if [ -n "$instructions" ]; then
        echo
        echo "### Server instructions per call"
        echo
        echo "callgrind, single-user backend (PostgreSQL $server_version, fsync off), each statement its own transaction, commit included: (instructions of 50 + N calls − of 50 calls) ÷ N, N = $calls ($batch_calls for renew_many). leasehold sends what its Rust client sends; ShedLock and pglock what benches/side_by_side.rs models."
        echo
        echo "$instruction_table"
    fi
    if [ -n "$throughput" ]; then
        echo
        echo "### Throughput of the acquire → release cycle, cycles per second"
        echo
        echo "pgbench -M prepared, one thread per client, $seconds s per run, durable server (fsync on, synchronous_commit on, wal_sync_method $wal_sync), the same cluster; the scripts of benches/side_by_side.rs."
        echo
        echo "$throughput_table"
    fi
)
echo "$report"
mkdir -p "$root/bench-results"
echo "$report" > "$root/bench-results/$stamp-compare.md"
say "written to bench-results/$stamp-compare.md"
