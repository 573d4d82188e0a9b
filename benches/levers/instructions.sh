#!/usr/bin/env bash
# Server instructions per call, counted by valgrind (callgrind), for the SQL
# functions of the working tree beside the fast path of commit 8dace47 and
# the floors they are measured by. CPU time on a shared 2-core VM moves by
# ±20 % between runs; an instruction count moves by well under 1 %, so
# this is the instrument for "what does this piece of a function cost"
# (docs/PERFORMANCE.md, "How costs are counted").
#
#   benches/levers/instructions.sh [-b REV] [-n CALLS] [-r]
#
# With -r, the rows are the calls rather than the levers: lease.renew and
# the release paths (acquire -> release, of a grant and of a heartbeat
# group's member, acquire -> both forms of force_release, five acquires ->
# release_many), each for REV's functions and for the working tree's. A
# cycle here is one statement, so one transaction (its acquire's cost is
# the same on both sides); compare the two columns, not these counts with
# benches/compare.sh's two-transaction cycle.
#
# It builds a throwaway cluster (binaries from PGBIN, default
# /usr/lib/postgresql/15/bin; as user postgres when run as root), with two
# databases: `before` (migrations of REV, default 8dace47) and `after` (the
# working tree's migrations), and a copy `c.leases_nocheck` of lease.leases
# without its CHECK constraint. Then, with the server stopped, it runs the
# backend in single-user mode under callgrind: PREPARE of the statement
# and N EXECUTEs (each its own transaction, fsync off), once with 50 and
# once with 50+N executions. The difference divided by N is the cost of one
# call, commit included, with the session's start and plan caching
# subtracted out. Needs valgrind. Takes about 4 minutes.
set -euo pipefail
before_rev=8dace47
calls=500
release_paths=""
while getopts "b:n:r" opt; do
    case "$opt" in
        b) before_rev=$OPTARG ;;
        n) calls=$OPTARG ;;
        r) release_paths=yes ;;
        *) exit 2 ;;
    esac
done
name=instructions.sh
# shellcheck source=benches/levers/scratch_cluster.sh
source "$(dirname "$0")/scratch_cluster.sh"
psql -d postgres -c "CREATE DATABASE before" -c "CREATE DATABASE after"
# The migrations, then (from the layout with sql/functions/ on) the files
# of functions.
for m in $(git -C "$root" ls-tree --name-only "$before_rev" migrations/ | sed 's|$|/up.sql|') \
         $(git -C "$root" ls-tree --name-only "$before_rev" sql/functions/); do
    git -C "$root" show "$before_rev:$m" | PGOPTIONS="-c client_min_messages=warning" psql -d before -1 -f - >/dev/null
done
for m in "$root"/migrations/*/up.sql "$root"/sql/functions/*.sql; do
    PGOPTIONS="-c client_min_messages=warning" psql -d after -1 -f "$m" >/dev/null
done
for db in before after; do
    [ "$(psql -d "$db" -c "SELECT acquired FROM lease.acquire('ab-held', 'ab-owner', interval '100 years')")" = t ]
done
psql -d after >/dev/null <<'SQL'
SET client_min_messages = warning;
CREATE SCHEMA c;
CREATE TABLE c.leases_nocheck (LIKE lease.leases INCLUDING DEFAULTS, PRIMARY KEY (key_hash));
INSERT INTO c.leases_nocheck SELECT * FROM lease.leases;
-- The lever not taken (docs/PERFORMANCE.md): the grant's columns as one
-- column of a domain over a composite type, whose CHECK is planned once per
-- session (typcache), not at every statement as a table CHECK is.
CREATE TYPE c.grant_fields AS (owner text COLLATE "C", expires_at timestamptz,
                               group_id bigint, lapsed_owner text COLLATE "C");
CREATE DOMAIN c.grant_state AS c.grant_fields CHECK (
    ((VALUE).owner IS NULL) = ((VALUE).expires_at IS NULL)
    AND ((VALUE).group_id IS NULL OR (VALUE).owner IS NOT NULL)
    AND ((VALUE).lapsed_owner IS NULL OR (VALUE).owner IS NOT NULL));
CREATE TABLE c.leases_domain (key text COLLATE "C" NOT NULL, key_hash bytea PRIMARY KEY,
                              epoch bigint NOT NULL, first_epoch bigint NOT NULL,
                              g c.grant_state NOT NULL);
INSERT INTO c.leases_domain
SELECT key, key_hash, epoch, first_epoch, ROW(owner, expires_at, group_id, lapsed_owner)::c.grant_state
  FROM lease.leases;
CREATE FUNCTION c.renew_minimal(key text, owner text, epoch bigint, ttl interval,
                                OUT status text, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE lease.leases AS l SET expires_at = clock_timestamp() + renew_minimal.ttl
     WHERE l.key_hash = sha256(convert_to(renew_minimal.key, 'UTF8')) AND l.key = renew_minimal.key
       AND l.owner = renew_minimal.owner AND l.epoch = renew_minimal.epoch AND l.expires_at > clock_timestamp()
    RETURNING l.expires_at INTO renew_minimal.expires_at;
    status := CASE WHEN FOUND THEN 'ok' ELSE 'lost' END;
END;
$$;
SQL
"${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -m fast stop >/dev/null
started=""

# count DB STATEMENT N: instructions of a single-user backend running
# PREPARE p AS STATEMENT and N EXECUTEs with the held key's arguments.
count() {
    local db=$1 stmt=$2 n=$3 input=$scratch/input.sql i
    { echo "PREPARE p(text, text, bigint, interval) AS $stmt;"
      for i in $(seq "$n"); do echo "EXECUTE p('ab-held', 'ab-owner', 1, '1 hour');"; done
    } > "$input"
    chmod a+r "$input"
    "${as_server[@]}" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$bin/postgres" --single -D "$scratch/data" -c fsync=off "$db" < "$input" 2>&1 >/dev/null |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
per_call() {
    local low high
    low=$(count "$1" "$2" 50)
    high=$(count "$1" "$2" $((50 + calls)))
    echo $(((high - low) / calls))
}
if [ -n "$release_paths" ]; then
    # Each statement runs with the held key's arguments ($1 'ab-held', $2
    # its owner, $4 '1 hour'); the cycles work on keys of their own.
    # One line each: the single-user backend ends a statement at a newline.
    many="SELECT count(*) FROM (SELECT array_agg(a.k ORDER BY a.k) AS ks, array_agg(a.epoch ORDER BY a.k) AS es"
    many+=" FROM (SELECT \$1 || '.many' || i AS k FROM generate_series(1, 5) AS i) AS x,"
    many+=" LATERAL (SELECT x.k, q.epoch FROM lease.acquire(x.k, \$2, \$4) AS q) AS a) AS s,"
    many+=" lease.release_many(s.ks, \$2, s.es) AS r WHERE r.status = 'ok'"
    names=(); stmts=(); answers=()
    row() { names+=("$1"); stmts+=("$2"); answers+=("$3"); }
    row "lease.renew" \
        "SELECT status FROM lease.renew(\$1, \$2, \$3, \$4)" \
        ok
    row "acquire → release" \
        "SELECT r.status FROM lease.acquire(\$1 || '.cycle', \$2, \$4) AS a, lease.release(\$1 || '.cycle', \$2, a.epoch) AS r" \
        ok
    row "acquire → join_group → release (a member)" \
        "SELECT r.status FROM lease.acquire(\$1 || '.member', \$2, \$4) AS a, lease.join_group(ARRAY[\$1 || '.member'], \$2, ARRAY[a.epoch], \$4) AS j, lease.release(\$1 || '.member', \$2, CASE WHEN j.status = 'ok' THEN a.epoch END) AS r" \
        ok
    row "acquire → force_release(key)" \
        "SELECT lease.force_release(\$1 || '.force') = a.epoch + 1 FROM lease.acquire(\$1 || '.force', \$2, \$4) AS a" \
        t
    row "acquire → force_release(key, epoch)" \
        "SELECT f.status FROM lease.acquire(\$1 || '.exact', \$2, \$4) AS a, lease.force_release(\$1 || '.exact', a.epoch) AS f" \
        released
    row "acquire × 5 → release_many" \
        "$many" \
        5
    "${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -l "$scratch/server.log" -w \
        -o "-c fsync=off -c listen_addresses='' -c unix_socket_directories='$scratch' -p 5432" start >/dev/null
    started=yes
    # Each statement once on each side, checking its answer (it also makes
    # every key a key used before).
    for i in "${!names[@]}"; do
        name=${names[$i]} stmt=${stmts[$i]} expect=${answers[$i]}
        for db in before after; do
            got=$(psql -d "$db" -c "PREPARE p(text, text, bigint, interval) AS $stmt" \
                       -c "EXECUTE p('ab-held', 'ab-owner', 1, '1 hour')")
            [ "$got" = "$expect" ] || { echo "instructions.sh: $db: $name answered $got, not $expect" >&2; exit 1; }
        done
    done
    "${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -m fast stop >/dev/null
    started=""
    echo "| call | before ($before_rev) | after | after − before |"
    echo "|---|---:|---:|---:|"
    for i in "${!names[@]}"; do
        name=${names[$i]} stmt=${stmts[$i]}
        b=$(per_call before "$stmt")
        a=$(per_call after "$stmt")
        echo "| $name | $b | $a | $((a - b)) ($(awk -v a="$a" -v b="$b" 'BEGIN { printf "%+.2f %%", (a - b) * 100 / b }')) |"
    done
    exit 0
fi
plain='UPDATE %s SET expires_at = clock_timestamp() + $4 WHERE key_hash = sha256(convert_to($1, '"'UTF8'"')) AND key = $1 AND owner = $2 AND epoch = $3 AND expires_at > clock_timestamp() RETURNING expires_at'
echo "| call | instructions per call |"
echo "|---|---:|"
echo "| plain UPDATE, table without the CHECK | $(per_call after "$(printf "$plain" c.leases_nocheck)") |"
echo "| plain UPDATE of lease.leases (one CHECK) | $(per_call after "$(printf "$plain" lease.leases)") |"
echo "| plain UPDATE, grant in one domain-over-composite column | $(per_call after 'UPDATE c.leases_domain SET g.expires_at = clock_timestamp() + $4 WHERE key_hash = sha256(convert_to($1, '"'UTF8'"')) AND key = $1 AND (g).owner = $2 AND epoch = $3 AND (g).expires_at > clock_timestamp() RETURNING (g).expires_at') |"
echo "| before ($before_rev): fast_renew through its rule | $(per_call before 'UPDATE lease.fast_renew SET key = $1, owner = $2, epoch = $3, ttl = $4 RETURNING expires_at') |"
echo "| before ($before_rev): lease.renew | $(per_call before 'SELECT * FROM lease.renew($1, $2, $3, $4)') |"
echo "| minimal definer renew of lease.leases | $(per_call after 'SELECT * FROM c.renew_minimal($1, $2, $3, $4)') |"
echo "| after: lease.renew | $(per_call after 'SELECT * FROM lease.renew($1, $2, $3, $4)') |"
