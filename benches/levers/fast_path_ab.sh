#!/usr/bin/env bash
# The fast paths against the SQL functions, and both against ShedLock's and
# pglock's SQL, on one durable server, runs interleaved (docs/PERFORMANCE.md,
# "Fast paths without a function call"). Each round runs every workload at
# 1, 4 and 16 clients for SECONDS; the report is the median ops/s of the
# rounds and the ratios the targets name.
#
#   benches/levers/fast_path_ab.sh [-r ROUNDS] [-s SECONDS]
#
# Connects with psql's usual environment (PGHOST, PGPORT, PGUSER,
# PGDATABASE) to a database where leasehold is installed; creates its own
# tables (ab_floor, ab_shedlock, ab_locks) and keys (ab-*). Run it on a
# quiet machine: the commits are durable, so the disk is part of it.
set -euo pipefail
rounds=3
seconds=8
while getopts "r:s:" opt; do
    case "$opt" in
        r) rounds=$OPTARG ;;
        s) seconds=$OPTARG ;;
        *) exit 2 ;;
    esac
done
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

psql -qAtX -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
SET client_min_messages = warning;
DROP TABLE IF EXISTS ab_floor, ab_shedlock, ab_locks;
DROP SEQUENCE IF EXISTS ab_locks_rvn;
CREATE TABLE ab_floor (id int PRIMARY KEY, n bigint NOT NULL);
INSERT INTO ab_floor SELECT g, 0 FROM generate_series(1, 64) g;
CREATE TABLE ab_shedlock (name varchar(64) PRIMARY KEY, lock_until timestamp NOT NULL,
                          locked_at timestamp NOT NULL, locked_by varchar(255) NOT NULL);
INSERT INTO ab_shedlock SELECT 'held-' || g, now() + interval '1 hour', now(), 'host-' || g FROM generate_series(0, 63) g;
CREATE TABLE ab_locks (name text PRIMARY KEY, record_version_number bigint, data bytea, owner text);
CREATE SEQUENCE ab_locks_rvn;
SELECT count(*) FROM (SELECT lease.acquire('ab-held-' || g, 'o' || g, interval '100 years')
                        FROM generate_series(0, 63) g) AS s;
SELECT count(*) FROM (SELECT lease.acquire('ab-den-' || g, 'holder', interval '100 years')
                        FROM generate_series(0, 3) g) AS s;
SQL

key="'ab-cyc-' || :client_id"
held="'ab-held-' || :client_id"
owner="'o' || :client_id"
cat > "$scratch/floor.sql" <<'EOF'
UPDATE ab_floor SET n = n + 1 WHERE id = :client_id + 1;
EOF
cat > "$scratch/function_renew.sql" <<EOF
SELECT status FROM lease.renew($held, $owner, 1, interval '1 hour');
EOF
cat > "$scratch/fast_renew.sql" <<EOF
\set done 0
UPDATE lease.fast_renew SET key = $held, owner = $owner, epoch = 1, ttl = interval '1 hour' RETURNING 1 AS done \aset
\if :done = 0
SELECT status FROM lease.renew($held, $owner, 1, interval '1 hour');
\endif
EOF
cat > "$scratch/shedlock_extend.sql" <<'EOF'
UPDATE ab_shedlock SET lock_until = now() + interval '1 hour' WHERE name = 'held-' || :client_id AND locked_by = 'host-' || :client_id AND lock_until > now();
EOF
cat > "$scratch/function_cycle.sql" <<EOF
SELECT epoch AS e FROM lease.acquire($key, $owner, interval '30s') \gset
SELECT status FROM lease.release($key, $owner, :e);
EOF
cat > "$scratch/fast_cycle.sql" <<EOF
\set e 0
UPDATE lease.fast_acquire SET key = $key, owner = $owner, ttl = interval '30s' RETURNING epoch AS e \aset
\if :e = 0
SELECT coalesce(epoch, 0) AS e FROM lease.acquire($key, $owner, interval '30s') \gset
\endif
\set done 0
UPDATE lease.fast_release SET key = $key, owner = $owner, epoch = :e RETURNING released::int AS done \aset
\if :done = 0
SELECT status FROM lease.release($key, $owner, :e);
\endif
EOF
cat > "$scratch/shedlock_cycle.sql" <<'EOF'
INSERT INTO ab_shedlock (name, lock_until, locked_at, locked_by) VALUES ('cyc-' || :client_id, now() + interval '30s', now(), 'host-' || :client_id) ON CONFLICT (name) DO UPDATE SET lock_until = now() + interval '30s', locked_at = now(), locked_by = 'host-' || :client_id WHERE ab_shedlock.lock_until <= now();
UPDATE ab_shedlock SET lock_until = GREATEST(locked_at + interval '0s', now()) WHERE name = 'cyc-' || :client_id AND locked_by = 'host-' || :client_id;
EOF
cat > "$scratch/pglock_cycle.sql" <<'EOF'
SELECT nextval('ab_locks_rvn') AS rvn \gset
INSERT INTO ab_locks (name, record_version_number, data, owner) VALUES ('cyc-' || :client_id, :rvn, NULL, 'o-' || :client_id) ON CONFLICT (name) DO UPDATE SET record_version_number = :rvn, owner = 'o-' || :client_id WHERE ab_locks.record_version_number IS NULL;
DELETE FROM ab_locks WHERE name = 'cyc-' || :client_id AND record_version_number = :rvn;
EOF

# A denial: four keys held by somebody else, shared by all clients. What
# the Rust client sends (the fast path, then the function) against the
# function alone.
denied="'ab-den-' || (:client_id % 4)"
cat > "$scratch/function_deny.sql" <<EOF
SELECT acquired FROM lease.acquire($denied, $owner, interval '1 hour');
EOF
cat > "$scratch/fast_deny.sql" <<EOF
\set e 0
UPDATE lease.fast_acquire SET key = $denied, owner = $owner, ttl = interval '1 hour' RETURNING epoch AS e \aset
\if :e = 0
SELECT acquired FROM lease.acquire($denied, $owner, interval '1 hour');
\endif
EOF

workloads="floor function_renew fast_renew shedlock_extend function_cycle fast_cycle shedlock_cycle pglock_cycle function_deny fast_deny"
for _ in $(seq "$rounds"); do
    for clients in 1 4 16; do
        for w in $workloads; do
            tps=$(pgbench -n -M prepared -c "$clients" -j "$clients" -T "$seconds" -f "$scratch/$w.sql" 2>&1 |
                awk '/^tps/ { print $3 }')
            echo "$clients $w ${tps:?pgbench failed for $w}" >> "$scratch/results"
        done
    done
done

awk '
{ v[$1 " " $2] = v[$1 " " $2] " " $3 }
END {
    split("1 4 16", cs, " ")
    for (i = 1; i <= 3; i++) {
        c = cs[i]
        n = split("floor function_renew fast_renew shedlock_extend function_cycle fast_cycle shedlock_cycle pglock_cycle function_deny fast_deny", ws, " ")
        for (j = 1; j <= n; j++) m[ws[j]] = median(v[c " " ws[j]])
        printf "%2d clients: ops/s", c
        for (j = 1; j <= n; j++) printf "  %s %.0f", ws[j], m[ws[j]]
        printf "\n            fast/function: renew %.2f cycle %.2f denial %.2f; cycle vs ShedLock %.2f, vs pglock %.2f; renew vs ShedLock extend %.2f, vs floor %.2f\n",
            m["fast_renew"] / m["function_renew"], m["fast_cycle"] / m["function_cycle"],
            m["fast_deny"] / m["function_deny"],
            m["fast_cycle"] / m["shedlock_cycle"], m["fast_cycle"] / m["pglock_cycle"],
            m["fast_renew"] / m["shedlock_extend"], m["fast_renew"] / m["floor"]
    }
}
function median(list,    a, n, k, t, x, y) {
    n = split(list, a, " ")
    for (x = 1; x <= n; x++) for (y = x + 1; y <= n; y++) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
    k = int((n + 1) / 2)
    return a[k]
}' "$scratch/results"
