#!/usr/bin/env bash
# The raw SKIP LOCKED loop on gendurable's own table: how fast PostgreSQL
# claims and completes rows of `instances`, with all of its columns and
# indexes, when nothing else runs. Compare with the 3-column table of
# `gendurable workload raw` and with `gendurable workload w1`.
#
#   DATABASE_URL=postgres://... benchmarks/own_table.sh [rows] [loops] [batch]
#
# Creates the schema `own_table` (dropped first), fills it with `rows`
# available keyless rows, then runs `loops` pgbench clients, each claiming
# `batch` rows (status, node, attempt, attempted_at, as the pick sets them)
# and completing them (status, finished_at), one commit per statement.
set -euo pipefail
rows=${1:-100000} loops=${2:-2} batch=${3:-160}
per_loop=$((rows / batch / loops))
[ "$per_loop" -ge 1 ] || { echo "own_table.sh: $rows rows are fewer than $loops loops x $batch" >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cli="$here/../target/release/gendurable"
[ -x "$cli" ] || cargo build --release -p gendurable-cli --manifest-path "$here/../Cargo.toml"
psql -qX -v ON_ERROR_STOP=1 "$DATABASE_URL" -c "SET client_min_messages = warning" -c "DROP SCHEMA IF EXISTS own_table CASCADE"
"$cli" migrate --url "$DATABASE_URL" --schema own_table
psql -qX -v ON_ERROR_STOP=1 "$DATABASE_URL" \
    -c "INSERT INTO own_table.instances (workflow, step, state, status)
        SELECT 'Job', 'start', '{}', 'available' FROM generate_series(1, $rows)" \
    -c "VACUUM ANALYZE own_table.instances"
echo "$rows rows, $loops loops, batch $batch"
pgbench -n -f "$here/own_table.pgbench" -D "batch=$batch" -c "$loops" -j "$loops" \
    -t "$per_loop" "$DATABASE_URL" |
    awk -v b="$batch" '/^tps/ { printf "%.0f rows/s\n", $3 * b }'
psql -qAtX "$DATABASE_URL" -c "SELECT count(*) || ' completed' FROM own_table.instances
                               WHERE status = 'completed'" \
    -c "SET client_min_messages = warning" -c "DROP SCHEMA own_table CASCADE"
