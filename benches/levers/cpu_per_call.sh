#!/usr/bin/env bash
# Server CPU time per call of SQL expressions, for weighing one change to the
# SQL against another (docs/PERFORMANCE.md, "How costs are counted").
#
#   benches/levers/cpu_per_call.sh [-n CALLS] [-r ROUNDS] [-b SQL] [-s] EXPRESSION...
#
# -s takes each argument as a statement to run as it is (for example
# "UPDATE ab_floor SET n = n + 1 WHERE id = 1"), instead of an expression to PERFORM. The loop declares
# one bigint variable, v, so that a call can pass a value to the next
# statement of the same argument (for example "UPDATE ... RETURNING epoch
# INTO v; COMMIT; UPDATE ... SET epoch = v": an acquire and its release).
#
# -b SQL runs before each measurement, outside it (for example
# "VACUUM FULL lease.leases", so that rows rewritten by earlier rounds do
# not make later ones slower).
#
# Each EXPRESSION (for example "lease.renew('held-1', 'o1', 1, '1 hour')") runs
# CALLS times in a DO loop that commits after every call, so each call is its
# own transaction, as it is for an application; the backend's user + system
# CPU time is read from /proc before and after, which leaves out the client,
# the network and waits for other processes. It prints the minimum and the
# median over ROUNDS rounds, in µs per call; the minimum is the figure least
# disturbed by other work on the machine. The expressions are measured in
# turn within each round, so slow drift of the machine hits all of them.
#
# Connects with psql's usual environment (PGHOST, PGPORT, PGUSER,
# PGDATABASE) and must run on the server's host (it reads /proc/<pid>/stat).
# Commits are only as expensive as the server makes them: for CPU figures run
# the server with fsync=off (the functions raise synchronous_commit to on).
set -euo pipefail
calls=20000
rounds=5
before=""
run="PERFORM"
while getopts "n:r:b:s" opt; do
    case "$opt" in
        n) calls=$OPTARG ;;
        r) rounds=$OPTARG ;;
        b) before=$OPTARG ;;
        s) run="" ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-n CALLS] [-r ROUNDS] [-b SQL] [-s] EXPRESSION..." >&2; exit 2; }
ticks_per_second=$(getconf CLK_TCK)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# Backend CPU ticks (utime + stime) of the pid in $scratch/pid into file $1.
cat > "$scratch/ticks.sh" <<'TICKS'
#!/usr/bin/env bash
awk '{print $14 + $15}' "/proc/$(cat "$(dirname "$0")/pid")/stat" > "$1"
TICKS
chmod +x "$scratch/ticks.sh"

measure() {
    if [ -n "$before" ]; then
        psql -qAtX -v ON_ERROR_STOP=1 -c "$before" >/dev/null
    fi
    psql -qAtX -v ON_ERROR_STOP=1 >/dev/null <<SQL
\o $scratch/pid
SELECT pg_backend_pid();
\o
DO \$\$ DECLARE v bigint; BEGIN FOR i IN 1..200 LOOP $run $1; COMMIT; END LOOP; END \$\$;
\! $scratch/ticks.sh $scratch/t0
DO \$\$ DECLARE v bigint; BEGIN FOR i IN 1..$calls LOOP $run $1; COMMIT; END LOOP; END \$\$;
\! $scratch/ticks.sh $scratch/t1
SQL
    awk -v t0="$(cat "$scratch/t0")" -v t1="$(cat "$scratch/t1")" -v hz="$ticks_per_second" -v n="$calls" \
        'BEGIN { printf "%.1f", (t1 - t0) * 1e6 / hz / n }'
}

declare -A samples
for _ in $(seq "$rounds"); do
    for expression in "$@"; do
        samples[$expression]+="$(measure "$expression") "
    done
done
for expression in "$@"; do
    echo "${samples[$expression]}" | tr ' ' '\n' | grep . | sort -n |
        awk -v e="$expression" '{ v[NR] = $1 } END { printf "min %6.1f  median %6.1f µs/call  %s\n", v[1], v[int((NR + 1) / 2)], e }'
done
