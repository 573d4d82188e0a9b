#!/usr/bin/env bash
# What each guarantee of the fast paths costs, and what is left without any
# of them (docs/PERFORMANCE.md, "What bounds the targets we miss").
#
#   benches/levers/guarantee_cost.sh [-n CALLS] [-r ROUNDS]
#
# Builds stripped copies of the three fast paths of migration
# 2026-11-30-000007 (views with the same kind of rule, in a scratch schema
# `lever_gc`) that keep only the row match and the row write, then adds the
# guarantees back one at a time, in this order:
#
#   row         the row match and write: key digest, key, owner, epoch, expiry;
#               for the grant the FOR UPDATE SKIP LOCKED lock (G6), which
#               ShedLock's INSERT ... ON CONFLICT DO UPDATE also takes
#   +input      the owner and ttl checks (§1.4)
#   +generation the grant's epoch floor from the lineage row, with its checks
#               that this server checked the row and that no newer timeline
#               exists (§1.2, §1.7)
#   +namespace  the namespace gate (§4): whether lease.namespaces has a row,
#               and the rule look-up when it has
#   +durable    synchronous_commit raised to on (§1.4)
#   +wake       the release's wake-up of waiters (the waiting protocol)
#
# The last level is the real fast path; the real views are measured too, as
# a check. Beside them, in the same rounds: ShedLock's and pglock's SQL and
# the durable floor (plain one-row UPDATEs), each cycle two transactions as
# ours is. Prints benches/levers/cpu_per_call.sh's lines: server CPU per
# call (one renew, or one acquire and its release), minimum and median of
# ROUNDS rounds.
#
# Connects with psql's usual environment to a database where leasehold is
# installed, as a role that may create schemas and rules on lease.leases'
# owner's behalf (a scratch server's superuser). Run the server with
# fsync=off for CPU figures. Drops `lever_gc` at the end.
set -euo pipefail
calls=10000
rounds=5
while getopts "n:r:" opt; do
    case "$opt" in
        n) calls=$OPTARG ;;
        r) rounds=$OPTARG ;;
        *) exit 2 ;;
    esac
done
here=$(dirname "$0")

# The pieces of the rules, read from migration 2026-11-30-000007 itself so
# that the stripped copies measure exactly the text the real rules run:
# `piece FIRST LAST` prints the first run of the migration's lines from one
# matching the regular expression FIRST to the next one matching LAST, and
# fails when there is none (the migration changed: update the patterns).
migration="$here/../../migrations/2026-11-30-000007_fast_paths/up.sql"
piece() {
    local text
    text=$(awk -v first="$1" -v last="$2" '
        !done && !on && $0 ~ first { on = 1 }
        on { print; if ($0 ~ last) { on = 0; done = 1 } }' "$migration")
    [ -n "$text" ] || { echo "guarantee_cost.sh: no piece /$1/ in $migration" >&2; exit 1; }
    printf '%s' "$text"
}
input_owner=$(piece "AND NEW.owner <> ''" "octet_length[(]NEW.owner[)]")
input_ttl=$(piece "AND NEW.ttl > interval '0'" "date_part[(]'year', NEW.ttl[)] = 0")
namespace=$(piece "lease._fast_allowed[(]NEW.key[)]" "lease._fast_allowed[(]NEW.key[)]")
durable=$(piece "AND [(]current_setting[(]'synchronous_commit'[)]" "OR set_config[(]'synchronous_commit'")
# The generation's sub-select, without the FROM that opens the rule's list.
generation_from=$(piece "FROM [(]SELECT GREATEST[(]lg.base" "END[)] AS g,")
generation_from=${generation_from#*FROM }
# The release's `released` column, without the statement's closing `;`.
wake=$(piece "CASE WHEN current_setting[(]'transaction_isolation'[)]" "^ *END;")
wake=${wake%;}

levels=(row input generation namespace durable wake)

# Whether level $2 includes the guarantee $1 (levels are cumulative).
has() {
    local want=$1 level=$2 l
    for l in "${levels[@]}"; do
        [ "$l" = "$want" ] && return 0
        [ "$l" = "$level" ] && return 1
    done
    return 1
}

sql=$(mktemp)
trap 'rm -f "$sql" "$sql.out"' EXIT
{
    echo "SET client_min_messages = warning;"
    echo "DROP SCHEMA IF EXISTS lever_gc CASCADE; CREATE SCHEMA lever_gc;"
    for level in "${levels[@]}"; do
        if has generation "$level"; then
            gen_from=$generation_from
            epoch="GREATEST(l.epoch + 1, (g.generation << 40) + 1)"
        else
            gen_from=""
            epoch="l.epoch + 1"
        fi
        owner_check="" ttl_check="" ns="" dur="" released="true"
        has input "$level" && { owner_check=$input_owner; ttl_check=$input_ttl; }
        has namespace "$level" && ns=$namespace
        has durable "$level" && dur=$durable
        has wake "$level" && released=$wake
        cat <<SQL
CREATE VIEW lever_gc.acquire_$level AS
    SELECT NULL::text AS key, NULL::text AS owner, NULL::interval AS ttl,
           NULL::bigint AS epoch, NULL::timestamptz AS expires_at;
CREATE RULE grant_$level AS ON UPDATE TO lever_gc.acquire_$level DO INSTEAD
    UPDATE lease.leases AS l
       SET owner = NEW.owner, epoch = $epoch,
           expires_at = clock_timestamp() + NEW.ttl, lapsed_owner = l.owner
      FROM $gen_from
           (SELECT lc.ctid FROM lease.leases AS lc
             WHERE lc.key_hash = sha256(convert_to(NEW.key, 'UTF8')) AND lc.key = NEW.key
               AND (lc.owner IS NULL OR lc.expires_at <= clock_timestamp())
               AND lc.group_id IS NULL
               FOR UPDATE SKIP LOCKED) AS c
     WHERE l.ctid = c.ctid $owner_check $ttl_check $ns $dur
    RETURNING NEW.key, NEW.owner, NEW.ttl, l.epoch, l.expires_at;
CREATE VIEW lever_gc.renew_$level AS
    SELECT NULL::text AS key, NULL::text AS owner, NULL::bigint AS epoch,
           NULL::interval AS ttl, NULL::timestamptz AS expires_at;
CREATE RULE renew_$level AS ON UPDATE TO lever_gc.renew_$level DO INSTEAD
    UPDATE lease.leases AS l
       SET expires_at = clock_timestamp() + NEW.ttl
     WHERE l.key_hash = sha256(convert_to(NEW.key, 'UTF8')) AND l.key = NEW.key
       AND l.owner = NEW.owner AND l.epoch = NEW.epoch
       AND l.expires_at > clock_timestamp() $ttl_check $ns $dur
    RETURNING NEW.key, NEW.owner, NEW.epoch, NEW.ttl, l.expires_at;
CREATE VIEW lever_gc.release_$level AS
    SELECT NULL::text AS key, NULL::text AS owner, NULL::bigint AS epoch,
           NULL::boolean AS released;
CREATE RULE release_$level AS ON UPDATE TO lever_gc.release_$level DO INSTEAD
    UPDATE lease.leases AS l
       SET owner = NULL, expires_at = NULL, lapsed_owner = NULL, epoch = l.epoch + 1
     WHERE l.key_hash = sha256(convert_to(NEW.key, 'UTF8')) AND l.key = NEW.key
       AND l.owner = NEW.owner AND l.epoch = NEW.epoch
       AND l.expires_at > clock_timestamp() AND l.group_id IS NULL $ns $dur
    RETURNING NEW.key, NEW.owner, NEW.epoch, $released;
SELECT lease.acquire('gc-cycle-$level', 'gc', interval '1 hour');
SELECT lease.release('gc-cycle-$level', 'gc', (lease.inspect('gc-cycle-$level')).epoch);
SQL
    done
    cat <<'SQL'
SELECT lease.acquire('gc-cycle-real', 'gc', interval '1 hour');
SELECT lease.release('gc-cycle-real', 'gc', (lease.inspect('gc-cycle-real')).epoch);
SELECT lease.acquire('gc-held', 'gc', interval '100 years');
CREATE TABLE lever_gc.floor (id int PRIMARY KEY, n bigint NOT NULL);
INSERT INTO lever_gc.floor VALUES (1, 0);
CREATE TABLE lever_gc.shedlock (name varchar(64) PRIMARY KEY, lock_until timestamp NOT NULL,
                                locked_at timestamp NOT NULL, locked_by varchar(255) NOT NULL);
INSERT INTO lever_gc.shedlock VALUES ('held', now() + interval '100 years', now(), 'host');
CREATE TABLE lever_gc.locks (name text PRIMARY KEY, record_version_number bigint, data bytea, owner text);
CREATE SEQUENCE lever_gc.locks_rvn;
SQL
} > "$sql"
psql -qAtX -v ON_ERROR_STOP=1 -f "$sql" >/dev/null

held_epoch=$(psql -qAtX -c "SELECT (lease.inspect('gc-held')).epoch")
labels=() statements=()
add() { labels+=("$1"); statements+=("${2//$'\n'/ }"); }
for level in "${levels[@]}"; do
    add "cycle: $level" "UPDATE lever_gc.acquire_$level SET key = 'gc-cycle-$level', owner = 'gc', ttl = '30 s' RETURNING epoch INTO v; COMMIT;
UPDATE lever_gc.release_$level SET key = 'gc-cycle-$level', owner = 'gc', epoch = v"
done
add "cycle: the real fast paths" "UPDATE lease.fast_acquire SET key = 'gc-cycle-real', owner = 'gc', ttl = '30 s' RETURNING epoch INTO v; COMMIT;
UPDATE lease.fast_release SET key = 'gc-cycle-real', owner = 'gc', epoch = v"
add "cycle: ShedLock" "INSERT INTO lever_gc.shedlock (name, lock_until, locked_at, locked_by)
VALUES ('cycle', now() + interval '30s', now(), 'host')
ON CONFLICT (name) DO UPDATE SET lock_until = now() + interval '30s', locked_at = now(), locked_by = 'host'
WHERE lever_gc.shedlock.lock_until <= now(); COMMIT;
UPDATE lever_gc.shedlock SET lock_until = GREATEST(locked_at + interval '0s', now())
WHERE name = 'cycle' AND locked_by = 'host'"
add "cycle: pglock" "v := nextval('lever_gc.locks_rvn');
INSERT INTO lever_gc.locks (name, record_version_number, data, owner) VALUES ('cycle', v, NULL, 'o')
ON CONFLICT (name) DO UPDATE SET record_version_number = v, owner = 'o'
WHERE lever_gc.locks.record_version_number IS NULL; COMMIT;
DELETE FROM lever_gc.locks WHERE name = 'cycle' AND record_version_number = v"
add "cycle: floor (two UPDATEs)" "UPDATE lever_gc.floor SET n = n + 1 WHERE id = 1; COMMIT; UPDATE lever_gc.floor SET n = n + 1 WHERE id = 1"
for level in row input namespace durable; do
    add "renew: $level" "UPDATE lever_gc.renew_$level SET key = 'gc-held', owner = 'gc', epoch = $held_epoch, ttl = '1 hour'"
done
add "renew: the real fast path" "UPDATE lease.fast_renew SET key = 'gc-held', owner = 'gc', epoch = $held_epoch, ttl = '1 hour'"
add "renew: ShedLock extend" "UPDATE lever_gc.shedlock SET lock_until = now() + interval '1 hour'
WHERE name = 'held' AND locked_by = 'host' AND lock_until > now()"
add "renew: floor (one UPDATE)" "UPDATE lever_gc.floor SET n = n + 1 WHERE id = 1"

# cpu_per_call.sh prints one line per statement, in argument order.
"$here/cpu_per_call.sh" -s -n "$calls" -r "$rounds" -b "VACUUM lease.leases, lever_gc.shedlock, lever_gc.locks, lever_gc.floor" \
    "${statements[@]}" > "$sql.out"
i=0
while IFS= read -r line; do
    printf '%-28s %s\n' "${labels[$i]}" "$(echo "$line" | awk '{print $1, $2, $3, $4, $5}')"
    i=$((i + 1))
done < "$sql.out"
rm -f "$sql.out"
psql -qAtX -c "SET client_min_messages = warning; DROP SCHEMA lever_gc CASCADE" >/dev/null
