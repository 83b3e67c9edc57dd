# Sourced by benchmarks/soak and benchmarks/soak_peer: the soak's throwaway
# PostgreSQL 15 (fsync on), the same for gendurable and its peer, unless
# DATABASE_URL is set. Sets DATABASE_URL and appends the server's stop to
# `cleanup` (the caller's EXIT trap runs it).
#
# autovacuum_naptime = 5: how often the autovacuum launcher looks at each
# database is the server's setting, not a table's; at thousands of jobs a
# second the default minute lets millions of dead rows pile up between runs
# (docs/operations.md, Autovacuum on a busy table).
if [ -z "${DATABASE_URL:-}" ]; then
    soak_dir=$(mktemp -d /tmp/gendurable-soak-XXXX)
    pg_bin=${PG_BIN:-/usr/lib/postgresql/15/bin}
    as_pg=()
    [ "$(id -u)" = 0 ] && as_pg=(runuser -u postgres --) && chown postgres "$soak_dir"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "${as_pg[@]}" "$pg_bin/initdb" -D "$soak_dir/data" -U postgres --auth=trust -E UTF8 >/dev/null
    cat >> "$soak_dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$soak_dir'
max_connections = 300
shared_buffers = '1GB'
autovacuum_naptime = 5
CONF
    "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$soak_dir/data" -l "$soak_dir/server.log" -w start >/dev/null
    export DATABASE_URL="postgresql://postgres@127.0.0.1:$port/postgres"
    cleanup="${as_pg[*]} $pg_bin/pg_ctl -D $soak_dir/data -m fast -w stop; rm -rf $soak_dir; ${cleanup:-}"
fi
