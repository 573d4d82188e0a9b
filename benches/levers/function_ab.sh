#!/usr/bin/env bash
# The SQL functions of one version of migrations/ and sql/functions/ against those of another,
# beside the fast paths and the floors they are to be measured by, on one
# server, runs interleaved (docs/PERFORMANCE.md, "One SQL path"). Made for
# the change that removes the fast paths of migration 7: its question is
# whether lease.renew, lease.acquire and lease.release, lease.inspect and
# lease.admit alone are now as fast as the fast paths were.
#
#   benches/levers/function_ab.sh [-r ROUNDS] [-s SECONDS] [-b REV] [-a REV] [-o FILE]
#
#   -r ROUNDS   rounds (default 5); each round runs every workload once, in
#               a new shuffled order
#   -s SECONDS  pgbench's -T for each run (default 5)
#   -b REV      the git revision whose migrations/*/up.sql (and sql/functions/*.sql) make the database
#               `before` (default 8dace47, the last commit with the fast paths)
#   -a REV      the revision for the database `after`; without it, the working
#               tree's migrations/*/up.sql and sql/functions/*.sql
#   -o FILE     write the report there too
#
# It starts its own throwaway PostgreSQL server in a temporary directory
# (binaries from PGBIN, default /usr/lib/postgresql/15/bin; as user postgres
# when run as root, since initdb refuses root): fsync=off, shared_buffers
# 256MB, synchronous_commit and everything else at their defaults, no TCP
# (a Unix socket in the directory). It ignores PGHOST and PGPORT, and stops
# and removes the server at the end. Two databases, each migration file run
# with `psql -1` in order: `before` and `after`. In `before` it also creates
# its own tables (ab_floor, ab_floor_read) and schema `ab` (a copy table
# ab.leases with lease.leases' columns and primary key, and two minimal
# SECURITY DEFINER functions); keys and resources are named ab-*.
#
# Workloads, one client each (pgbench -n -M prepared -c 1 -T SECONDS, the
# values bound as parameters, as the Rust client binds them):
#
#   plain_update        UPDATE ab_floor SET n = n + 1 WHERE id = 1 (the durable floor)
#   plain_select        SELECT n FROM ab_floor_read WHERE id = 1
#   definer_renew       ab.renew: one UPDATE with renew's WHERE in a PL/pgSQL
#                       SECURITY DEFINER function with a pinned search_path,
#                       RETURNS TABLE (status, expires_at): the function
#                       boundary and nothing else
#   definer_read        ab.inspect: the same for a one-row read
#   before_fast_renew   UPDATE lease.fast_renew ... RETURNING expires_at, then
#                       lease.renew only if no row (the Rust client's renew)
#   before_renew, after_renew         SELECT * FROM lease.renew(...)
#   before_inspect, after_inspect     SELECT * FROM lease.inspect(key)
#   before_fast_cycle   fast_acquire then fast_release, each with the
#                       function after no row (the Rust client's cycle)
#   before_cycle, after_cycle         lease.acquire then lease.release
#   before_fast_denial  fast_acquire (no row) then lease.acquire, of a key
#                       held by another owner (the Rust client's denial)
#   before_denial, after_denial       lease.acquire only
#   before_admit, after_admit         SELECT lease.admit(resource, key, epoch)
#                                     of the held key
#
# A cycle is two transactions (acquire, release), as for the peers in
# benches/compare.sh; its latency is the pair's. Before measuring, each path is
# run once with psql to check that it does what the workload assumes (the
# fast paths return a row, the denial is a denial, ...); the before_fast_*
# workloads are left out when the before revision has no lease.fast_renew.
#
# Report (markdown, stdout): per workload the median over rounds of the mean
# latency (pgbench's latency average, from its tps for sub-µs digits), the
# fastest and slowest round, the median tps, and the server CPU per call
# (median over rounds): the CPU time of the run's backend, which the
# postmaster adds to its own children's time (/proc/<postmaster>/stat,
# cutime + cstime) when the backend exits, divided by the transactions; it
# includes the backend's start (about 1-2 ms per run) and any autovacuum
# worker that exits during the run. Then the ratios of the medians.
#
# A default run takes about 8 minutes (17 workloads x 5 rounds x 5 s, plus
# a few seconds to set up). On a machine shared with other work, prefer
# more rounds to longer ones, and read the min/max columns before a ratio.
set -euo pipefail
rounds=5
seconds=5
before_rev=8dace47
after_rev=""
out=""
while getopts "r:s:b:a:o:" opt; do
    case "$opt" in
        r) rounds=$OPTARG ;;
        s) seconds=$OPTARG ;;
        b) before_rev=$OPTARG ;;
        a) after_rev=$OPTARG ;;
        o) out=$OPTARG ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || { echo "usage: $0 [-r ROUNDS] [-s SECONDS] [-b REV] [-a REV] [-o FILE]" >&2; exit 2; }

root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
bin=${PGBIN:-/usr/lib/postgresql/15/bin}
before_commit=$(git -C "$root" rev-parse --short "$before_rev^{commit}")
if [ -n "$after_rev" ]; then
    after_commit=$(git -C "$root" rev-parse --short "$after_rev^{commit}")
fi

# The throwaway server. initdb refuses root, so as root the server runs as
# postgres and owns the directory; psql and pgbench run as the caller.
scratch=$(mktemp -d /tmp/function_ab.XXXXXX)
as_server=()
if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$scratch"
    as_server=(runuser -u postgres --)
fi
server_started=""
cleanup() {
    if [ -n "$server_started" ]; then
        (cd "$scratch" && "${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -m immediate stop >/dev/null 2>&1) || true
    fi
    rm -rf "$scratch"
}
trap cleanup EXIT
mkdir "$scratch/sql"
server_started=yes
(
    cd "$scratch"
    "${as_server[@]}" "$bin/initdb" -D "$scratch/data" -U postgres -A trust -E UTF8 --no-instructions >/dev/null
    "${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -l "$scratch/server.log" -w \
        -o "-c fsync=off -c shared_buffers=256MB -c listen_addresses='' -c unix_socket_directories='$scratch' -p 5432" \
        start >/dev/null
) || { echo "function_ab.sh: the server did not start:" >&2; cat "$scratch/server.log" >&2 2>/dev/null; exit 1; }
export PGHOST=$scratch PGPORT=5432 PGUSER=postgres
unset PGDATABASE PGSERVICE PGOPTIONS PGHOSTADDR
postmaster=$(head -n 1 "$scratch/data/postmaster.pid")
psql() { "$bin/psql" -qAtX -v ON_ERROR_STOP=1 "$@"; }

psql -d postgres -c "CREATE DATABASE before" -c "CREATE DATABASE after"

# Each migration file in one transaction, in order; $1 the database, $2 a
# revision or "" for the working tree.
install() {
    local db=$1 rev=$2 m
    if [ -n "$rev" ]; then
        # The migrations, then (from the layout with sql/functions/ on)
        # the files of functions.
        for m in $(git -C "$root" ls-tree --name-only "$rev" migrations/ | sed 's|$|/up.sql|') \
                 $(git -C "$root" ls-tree --name-only "$rev" sql/functions/); do
            git -C "$root" show "$rev:$m" |
                PGOPTIONS="-c client_min_messages=warning" psql -d "$db" -1 -f - >/dev/null ||
                { echo "function_ab.sh: $m of $rev does not install into $db" >&2; exit 1; }
        done
    else
        for m in "$root"/migrations/*/up.sql "$root"/sql/functions/*.sql; do
            PGOPTIONS="-c client_min_messages=warning" psql -d "$db" -1 -f "$m" >/dev/null ||
                { echo "function_ab.sh: ${m#"$root"/} (working tree) does not install into $db" >&2; exit 1; }
        done
    fi
}
install before "$before_commit"
install after "${after_commit:-}"

# Keys, the same in both databases: ab-held (renew, inspect, admit) and
# ab-den (denial), held for 100 years; ab-cyc (the cycle) granted once and
# released, so that every cycle grants a FREE key.
for db in before after; do
    got=$(psql -d "$db" <<'SQL'
SET client_min_messages = warning;
SELECT acquired FROM lease.acquire('ab-held', 'ab-owner', interval '100 years');
SELECT acquired FROM lease.acquire('ab-den', 'ab-holder', interval '100 years');
SELECT acquired FROM lease.acquire('ab-cyc', 'ab-owner', interval '30 s');
SELECT status FROM lease.release('ab-cyc', 'ab-owner', (SELECT epoch FROM lease.inspect('ab-cyc')));
SQL
)
    [ "$got" = "$(printf 't\nt\nt\nok')" ] ||
        { echo "function_ab.sh: could not set up the keys in $db:" >&2; echo "$got" >&2; exit 1; }
done
epoch_before=$(psql -d before -c "SELECT epoch FROM lease.inspect('ab-held')")
epoch_after=$(psql -d after -c "SELECT epoch FROM lease.inspect('ab-held')")
has_fast=$(psql -d before -c "SELECT to_regclass('lease.fast_renew') IS NOT NULL")

# The floors and the minimal definer functions, in `before`.
psql -d before >/dev/null <<'SQL'
SET client_min_messages = warning;
CREATE TABLE ab_floor (id int PRIMARY KEY, n bigint NOT NULL);
INSERT INTO ab_floor SELECT g, 0 FROM generate_series(1, 64) g;
CREATE TABLE ab_floor_read (id int PRIMARY KEY, n bigint NOT NULL);
INSERT INTO ab_floor_read SELECT g, 0 FROM generate_series(1, 64) g;
CREATE SCHEMA ab;
CREATE TABLE ab.leases (LIKE lease.leases INCLUDING DEFAULTS, PRIMARY KEY (key_hash));
INSERT INTO ab.leases SELECT * FROM lease.leases WHERE key = 'ab-held';

CREATE FUNCTION ab.renew(key text, owner text, epoch bigint, ttl interval)
RETURNS TABLE (status text, expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE ab.leases AS l
       SET expires_at = clock_timestamp() + renew.ttl
     WHERE l.key_hash = sha256(convert_to(renew.key, 'UTF8')) AND l.key = renew.key
       AND l.owner = renew.owner AND l.epoch = renew.epoch
       AND l.expires_at > clock_timestamp()
    RETURNING l.expires_at INTO renew.expires_at;
    status := CASE WHEN FOUND THEN 'ok' ELSE 'lost' END;
    RETURN NEXT;
END;
$$;

CREATE FUNCTION ab.inspect(key text)
RETURNS TABLE (held boolean, owner text, epoch bigint, expires_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
        SELECT l.owner IS NOT NULL AND l.expires_at > clock_timestamp(), l.owner, l.epoch, l.expires_at
          FROM ab.leases AS l
         WHERE l.key_hash = sha256(convert_to(inspect.key, 'UTF8')) AND l.key = inspect.key;
END;
$$;
SQL

# Each path once, as the workloads will run it: the answers they assume.
check() {
    local db=$1 epoch=$2 want=$3 got
    got=$(psql -d "$db" -v key=ab-held -v owner=ab-owner -v epoch="$epoch")
    [ "$got" = "$want" ] ||
        { printf 'function_ab.sh: a path in %s does not do what its workload assumes:\nwant:\n%s\ngot:\n%s\n' \
              "$db" "$want" "$got" >&2; exit 1; }
}
functions_sql="SELECT status FROM lease.renew('ab-held', 'ab-owner', :epoch, interval '1 hour');
SELECT held FROM lease.inspect('ab-held');
SELECT epoch AS e FROM lease.acquire('ab-cyc', 'ab-owner', interval '30 s') \\gset
SELECT status FROM lease.release('ab-cyc', 'ab-owner', :e);
SELECT acquired FROM lease.acquire('ab-den', 'ab-other', interval '1 hour');
SELECT true FROM lease.admit('ab-res-0', 'ab-held', :epoch);"
functions_want=$(printf 'ok\nt\nok\nf\nt')
check after "$epoch_after" "$functions_want" <<<"$functions_sql"
check before "$epoch_before" "$functions_want" <<<"$functions_sql"
check before "$epoch_before" "$(printf 'ok\nt')" <<'SQL'
SELECT status FROM ab.renew('ab-held', 'ab-owner', :epoch, interval '1 hour');
SELECT held FROM ab.inspect('ab-held');
SQL
if [ "$has_fast" = t ]; then
    check before "$epoch_before" "$(printf 'renewed\nreleased')" <<'SQL'
UPDATE lease.fast_renew SET key = 'ab-held', owner = 'ab-owner', epoch = :epoch, ttl = interval '1 hour'
RETURNING 'renewed';
UPDATE lease.fast_acquire SET key = 'ab-cyc', owner = 'ab-owner', ttl = interval '30 s' RETURNING epoch AS e \gset
UPDATE lease.fast_release SET key = 'ab-cyc', owner = 'ab-owner', epoch = :e RETURNING 'released';
UPDATE lease.fast_acquire SET key = 'ab-den', owner = 'ab-other', ttl = interval '1 hour' RETURNING 'granted';
SQL
fi

# The pgbench scripts. Values are pgbench variables (-D), so that -M
# prepared binds them as parameters.
sql=$scratch/sql
echo 'UPDATE ab_floor SET n = n + 1 WHERE id = 1;' > "$sql/plain_update"
echo 'SELECT n FROM ab_floor_read WHERE id = 1;' > "$sql/plain_select"
echo 'SELECT * FROM ab.renew(:held, :owner, :epoch, :ttl);' > "$sql/definer_renew"
echo 'SELECT * FROM ab.inspect(:held);' > "$sql/definer_read"
cat > "$sql/fast_renew" <<'EOF'
\set done 0
UPDATE lease.fast_renew SET key = :held, owner = :owner, epoch = :epoch, ttl = :ttl RETURNING expires_at, 1 AS done \aset
\if :done = 0
SELECT * FROM lease.renew(:held, :owner, :epoch, :ttl);
\endif
EOF
echo 'SELECT * FROM lease.renew(:held, :owner, :epoch, :ttl);' > "$sql/renew"
echo 'SELECT * FROM lease.inspect(:held);' > "$sql/inspect"
cat > "$sql/fast_cycle" <<'EOF'
\set e 0
UPDATE lease.fast_acquire SET key = :cyc, owner = :owner, ttl = :cttl RETURNING epoch AS e, expires_at \aset
\if :e = 0
SELECT coalesce(epoch, 0) AS e FROM lease.acquire(:cyc, :owner, :cttl) \gset
\endif
\set done 0
UPDATE lease.fast_release SET key = :cyc, owner = :owner, epoch = :e RETURNING released::int AS done \aset
\if :done = 0
SELECT * FROM lease.release(:cyc, :owner, :e);
\endif
EOF
cat > "$sql/cycle" <<'EOF'
SELECT epoch AS e FROM lease.acquire(:cyc, :owner, :cttl) \gset
SELECT * FROM lease.release(:cyc, :owner, :e);
EOF
cat > "$sql/fast_denial" <<'EOF'
\set e 0
UPDATE lease.fast_acquire SET key = :den, owner = :other, ttl = :ttl RETURNING epoch AS e, expires_at \aset
\if :e = 0
SELECT * FROM lease.acquire(:den, :other, :ttl);
\endif
EOF
echo 'SELECT * FROM lease.acquire(:den, :other, :ttl);' > "$sql/denial"
echo "SELECT lease.admit('ab-res-' || :client_id, :held, :epoch);" > "$sql/admit"

# workload  database  script
workloads="plain_update before plain_update
plain_select before plain_select
definer_renew before definer_renew
definer_read before definer_read
before_fast_renew before fast_renew
before_renew before renew
after_renew after renew
before_inspect before inspect
after_inspect after inspect
before_fast_cycle before fast_cycle
before_cycle before cycle
after_cycle after cycle
before_fast_denial before fast_denial
before_denial before denial
after_denial after denial
before_admit before admit
after_admit after admit"
if [ "$has_fast" != t ]; then
    workloads=$(grep -v '^before_fast_' <<<"$workloads")
fi

# Server CPU: the postmaster's reaped children's time (utime + stime of the
# backends that exited), read when no client backend is left to reap.
hz=$(getconf CLK_TCK)
reaped_ticks() { awk '{ print $16 + $17 }' "/proc/$postmaster/stat"; }
settle() {
    local tries pid busy
    for tries in $(seq 1000); do
        busy=""
        for pid in $(pgrep -P "$postmaster" || true); do
            if [ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" = Z ] ||
                tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q '\[local\]'; then
                busy=yes
                break
            fi
        done
        [ -n "$busy" ] || return 0
        sleep 0.01
    done
    echo "function_ab.sh: a client backend did not exit" >&2
    exit 1
}

run() {
    local name=$1 db=$2 script=$3 epoch t0 t1 log=$scratch/pgbench.log
    epoch=$epoch_before
    [ "$db" = after ] && epoch=$epoch_after
    settle
    t0=$(reaped_ticks)
    "$bin/pgbench" -n -M prepared -c 1 -j 1 -T "$seconds" -d "$db" -f "$sql/$script" \
        -D held=ab-held -D owner=ab-owner -D epoch="$epoch" -D "ttl=1 hour" \
        -D cyc=ab-cyc -D "cttl=30 s" -D den=ab-den -D other=ab-other > "$log" 2>&1 ||
        { echo "function_ab.sh: pgbench failed for $name:" >&2; cat "$log" >&2; exit 1; }
    settle
    t1=$(reaped_ticks)
    if grep -q '^number of failed transactions: [1-9]' "$log"; then
        echo "function_ab.sh: failed transactions in $name:" >&2; cat "$log" >&2; exit 1
    fi
    awk -v w="$name" -v t0="$t0" -v t1="$t1" -v hz="$hz" '
        /^number of transactions actually processed:/ { n = $6 }
        /^latency average/ { lat = $4 * 1000 }
        /^tps/ { tps = $3 }
        END {
            if (!n || !tps) { print "function_ab.sh: no result for " w > "/dev/stderr"; exit 1 }
            printf "%s %.2f %.1f %.2f\n", w, 1e6 / tps, tps, (t1 - t0) * 1e6 / hz / n
        }' "$log" >> "$scratch/results"
}

names=$(awk '{ print $1 }' <<<"$workloads")
for r in $(seq "$rounds"); do
    echo "function_ab.sh: round $r of $rounds" >&2
    for name in $(shuf -e $names); do
        run $(grep "^$name " <<<"$workloads")
    done
done

{
    version=$(psql -d postgres -c "SELECT version()")
    settings=$(psql -d postgres -c "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name)
                                      FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'shared_buffers',
                                           'full_page_writes', 'wal_level', 'max_wal_size', 'autovacuum', 'jit')")
    if [ -n "$after_rev" ]; then
        after_label=$after_commit
    else
        after_label="the working tree"
        if [ -n "$(git -C "$root" status --porcelain -- migrations sql)" ]; then
            after_label="$after_label (migrations/ or sql/ differ from $(git -C "$root" rev-parse --short HEAD))"
        fi
    fi
    echo "## function_ab: before $before_commit, after $after_label"
    echo
    echo "- $(date -u +%Y-%m-%dT%H:%M:%SZ); server: $version"
    echo "- CPU: $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo), $(nproc) CPUs"
    echo "- settings: $settings (scratch server of function_ab.sh)"
    echo "- $rounds interleaved rounds (shuffled order) x $seconds s per workload; pgbench -n -M prepared -c 1"
    echo "- latency: mean per transaction (a cycle is two), median over rounds [min, max]; CPU: server backend CPU per transaction, median over rounds"
    echo
    echo "| workload | latency µs | min | max | tps | CPU µs |"
    echo "|---|---:|---:|---:|---:|---:|"
    for name in $names; do
        awk -v w="$name" '$1 == w { lat[++n] = $2; tps[n] = $3; cpu[n] = $4 }
            END { printf "| %s | %.1f | %.1f | %.1f | %.0f | %.1f |\n", w, median(lat, n), lo(lat, n), hi(lat, n), median(tps, n), median(cpu, n) }
            function sort(a, n,    i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } }
            function median(a, n) { sort(a, n); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
            function lo(a, n) { sort(a, n); return a[1] }
            function hi(a, n) { sort(a, n); return a[n] }' "$scratch/results"
    done
    echo
    echo "| ratio (of the medians) | latency | CPU |"
    echo "|---|---:|---:|"
    awk '{ lat[$1] = lat[$1] " " $2; cpu[$1] = cpu[$1] " " $4 }
        END {
            n = split("after_renew/before_fast_renew after_renew/definer_renew after_inspect/definer_read after_cycle/before_fast_cycle after_denial/before_fast_denial after_admit/before_admit", rs, " ")
            for (i = 1; i <= n; i++) {
                split(rs[i], p, "/")
                if (lat[p[1]] == "" || lat[p[2]] == "") { printf "| %s | n/a | n/a |\n", p[1] " / " p[2]; continue }
                printf "| %s | %.2f | %.2f |\n", p[1] " / " p[2], median(lat[p[1]]) / median(lat[p[2]]), ratio(median(cpu[p[1]]), median(cpu[p[2]]))
            }
        }
        function ratio(a, b) { return b > 0 ? a / b : 0 }
        function median(list,    a, n, i, j, t) {
            n = split(list, a, " ")
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
            return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }' "$scratch/results"
} > "$scratch/report"
cat "$scratch/report"
[ -z "$out" ] || cp "$scratch/report" "$out"
