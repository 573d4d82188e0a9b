#!/usr/bin/env bash
# Server instructions of writes to a fenced table beside the same writes
# to an unfenced one, counted by valgrind (callgrind) as instructions.sh
# counts calls (docs/PERFORMANCE.md, "Fenced tables").
#
#   benches/levers/fenced_tables.sh [-n CALLS]
#
# Three tables of one shape (id identity, tenant int, v int): `plain`, not
# fenced; `whole`, fenced by one key (lease.protect_table); `per_row`,
# fenced by the key 't/' || tenant (lease.protect_rows). Each row of the
# table below is one transaction, run N times by a single-user backend
# under callgrind, once after 2 warm-up runs and once after 2 + N; the
# difference divided by N is one transaction's cost, commit included. A
# fenced transaction presents its token (SELECT lease.present(...)) and
# then writes; the unfenced one writes alone, both as one autocommit
# statement and inside BEGIN … COMMIT (the ratios are against each). Needs
# valgrind. Takes about 4 minutes.
set -euo pipefail
calls=200
while getopts "n:" opt; do
    case "$opt" in
        n) calls=$OPTARG ;;
        *) exit 2 ;;
    esac
done
name=fenced_tables.sh
# shellcheck source=benches/levers/scratch_cluster.sh
source "$(dirname "$0")/scratch_cluster.sh"
psql -d postgres -c "CREATE DATABASE bench"
for m in "$root"/migrations/*/up.sql "$root"/sql/functions/*.sql; do
    PGOPTIONS="-c client_min_messages=warning" psql -d bench -1 -f "$m" >/dev/null
done
psql -d bench >/dev/null <<'SQL'
SET client_min_messages = warning;
CREATE TABLE plain (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant int NOT NULL, v int NOT NULL);
CREATE TABLE whole (LIKE plain INCLUDING ALL);
CREATE TABLE per_row (LIKE plain INCLUDING ALL);
INSERT INTO plain (tenant, v) VALUES (1, 0);
INSERT INTO whole (tenant, v) VALUES (1, 0);
INSERT INTO per_row (tenant, v) VALUES (1, 0);
SELECT lease.protect_table('whole', 'w');
SELECT lease.protect_rows('per_row', 't/', ARRAY['tenant']);
SELECT lease.acquire('w', 'bench', interval '100 years');
SELECT lease.acquire('t/1', 'bench', interval '100 years');
SQL
seq 1 10000 | awk '{ print 1 "\t" $1 }' > "$scratch/rows.tsv"
chmod a+r "$scratch/rows.tsv"
"${as_server[@]}" "$bin/pg_ctl" -D "$scratch/data" -m fast stop >/dev/null
started=""

# count TRANSACTION N: instructions of a single-user backend that prepares
# the statements below and runs TRANSACTION (lines, `;`-separated) N times.
count() {
    local lines=$1 n=$2 input=$scratch/input.sql i
    {
        echo "PREPARE present_w AS SELECT lease.present('w', 'bench', 1);"
        echo "PREPARE present_t AS SELECT lease.present('t/1', 'bench', 1);"
        for t in plain whole per_row; do
            echo "PREPARE ins_$t AS INSERT INTO $t (tenant, v) VALUES (1, 1);"
            echo "PREPARE upd_$t AS UPDATE $t SET v = v + 1 WHERE id = 1;"
            echo "PREPARE many_$t AS INSERT INTO $t (tenant, v) SELECT 1, g FROM generate_series(1, 10000) AS g;"
        done
        for i in $(seq "$n"); do echo "$lines" | tr ';' '\n'; done
    } > "$input"
    chmod a+r "$input"
    "${as_server[@]}" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$bin/postgres" --single -D "$scratch/data" -c fsync=off bench < "$input" 2>&1 >/dev/null |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
per_call() {
    local n=$2 low high
    low=$(count "$1" 2)
    high=$(count "$1" $((2 + n)))
    echo $(((high - low) / n))
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f×", a / b }'; }
row() {
    local name=$1 unfenced=$2 unfenced_tx=$3 whole=$4 per_row=$5 n=$6 u ut w r
    u=$(per_call "$unfenced" "$n")
    ut=$(per_call "$unfenced_tx" "$n")
    w=$(per_call "$whole" "$n")
    r=$(per_call "$per_row" "$n")
    echo "| $name | $u | $ut | $w ($(ratio "$w" "$u"), $(ratio "$w" "$ut")) | $r ($(ratio "$r" "$u"), $(ratio "$r" "$ut")) |"
}
copy="COPY %s (tenant, v) FROM '$scratch/rows.tsv'"
echo "| transaction | unfenced, autocommit | unfenced, BEGIN … COMMIT | whole-table fence (× autocommit, × BEGIN … COMMIT) | row fence (× autocommit, × BEGIN … COMMIT) |"
echo "|---|---:|---:|---:|---:|"
row "single-row INSERT" \
    "EXECUTE ins_plain" "BEGIN;EXECUTE ins_plain;COMMIT" \
    "BEGIN;EXECUTE present_w;EXECUTE ins_whole;COMMIT" "BEGIN;EXECUTE present_t;EXECUTE ins_per_row;COMMIT" "$calls"
row "single-row UPDATE" \
    "EXECUTE upd_plain" "BEGIN;EXECUTE upd_plain;COMMIT" \
    "BEGIN;EXECUTE present_w;EXECUTE upd_whole;COMMIT" "BEGIN;EXECUTE present_t;EXECUTE upd_per_row;COMMIT" "$calls"
[ -z "${SINGLE_ONLY:-}" ] || exit 0
# The 10,000-row transactions roll back, so every run writes into the same
# table; the unfenced one has no autocommit column for that reason.
bulk() {
    local name=$1 plain=$2 whole=$3 per_row=$4 n=$5 u w r
    u=$(per_call "BEGIN;$plain;ROLLBACK" "$n")
    w=$(per_call "BEGIN;EXECUTE present_w;$whole;ROLLBACK" "$n")
    r=$(per_call "BEGIN;EXECUTE present_t;$per_row;ROLLBACK" "$n")
    echo "| $name | – | $u | $w ($(ratio "$w" "$u")) | $r ($(ratio "$r" "$u")) |"
}
few=$(( calls / 40 > 2 ? calls / 40 : 3 ))
bulk "10,000-row INSERT … SELECT (rolled back)" "EXECUTE many_plain" "EXECUTE many_whole" "EXECUTE many_per_row" "$few"
# shellcheck disable=SC2059
bulk "10,000-row COPY FROM (rolled back)" "$(printf "$copy" plain)" "$(printf "$copy" whole)" "$(printf "$copy" per_row)" "$few"
