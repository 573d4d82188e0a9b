#!/usr/bin/env bash
# leasehold's SQL suites in PostgreSQL's own harness: pg_regress for each
# public function's contract (regress/sql, expected output in
# regress/expected), and isolationtester specs for the concurrency rules
# (isolation/specs, expected output in isolation/expected).
#
#   sql/tests/run.sh regress|isolation DATABASE [OUTPUT_DIR]
#
# Runs against DATABASE, which must exist with leasehold installed, on the
# server libpq's PGHOST, PGPORT and PGUSER name (pg_regress's
# --use-existing: it creates and drops nothing). The role must be a
# superuser: the files create roles and read lease.leases. Results and
# diffs go to OUTPUT_DIR (default: a temporary directory, kept on failure).
# The harness is PostgreSQL's own, found in PG_REGRESS_DIR (the directory
# of pg_regress and of pg_isolation_regress with isolationtester), else in
# the newest /usr/lib/postgresql/*/lib/pgxs/src/test; on Debian or Ubuntu
# it comes with postgresql-client. It runs against servers of other majors
# too. `cargo test --test leasehold sql_suites` runs both on a database of
# its own.
set -euo pipefail
suite=${1:?usage: sql/tests/run.sh regress|isolation DATABASE [OUTPUT_DIR]}
database=${2:?usage: sql/tests/run.sh regress|isolation DATABASE [OUTPUT_DIR]}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${3:-$(mktemp -d "/tmp/leasehold-sql-$suite.XXXXXX")}
find_tool() {
    local name=$1 sub=$2 dir
    if [ -n "${PG_REGRESS_DIR:-}" ]; then
        for dir in "$PG_REGRESS_DIR" "$PG_REGRESS_DIR/$sub"; do
            [ -x "$dir/$name" ] && { echo "$dir/$name"; return; }
        done
    fi
    dir=$(ls -d /usr/lib/postgresql/*/lib/pgxs/src/test/"$sub" 2>/dev/null | sort -V | tail -n 1)
    [ -n "$dir" ] && [ -x "$dir/$name" ] && { echo "$dir/$name"; return; }
    echo "sql/tests/run.sh: $name not found: set PG_REGRESS_DIR, or install postgresql-client (Debian, Ubuntu)" >&2
    exit 2
}
case $suite in
    regress)
        tool=$(find_tool pg_regress regress)
        tests=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/regress/schedule")
        inputdir=$here/regress ;;
    isolation)
        tool=$(find_tool pg_isolation_regress isolation)
        tests=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/isolation/schedule")
        inputdir=$here/isolation ;;
    *) echo "sql/tests/run.sh: no suite $suite (regress or isolation)" >&2; exit 2 ;;
esac
# pg_regress's own psql settings, set here so every server major prints alike.
export PGTZ=UTC PGDATESTYLE='ISO, YMD' PGOPTIONS='-c client_min_messages=warning'
# shellcheck disable=SC2086 # one test name per word
if "$tool" --use-existing --dbname="$database" --inputdir="$inputdir" \
        --outputdir="$out" --bindir="$(dirname "$(command -v psql)")" $tests; then
    [ $# -ge 3 ] || rm -rf "$out"
else
    status=$?
    echo "sql/tests/run.sh: $suite failed; results and regression.diffs in $out" >&2
    exit "$status"
fi
