#!/bin/sh
# A Postgres ledger table to hold idemgate's durable rows against: each
# intent is a claim (INSERT ... ON CONFLICT DO NOTHING) and its completion
# (UPDATE), each committed on its own, from CLIENTS connections for DURATION
# seconds, with fsync on and off, on a throwaway cluster in a temporary
# directory (removed afterwards). It prints one line per setting:
#
#   postgres-ledger fsync=on clients=64: 12345 intents/s
#
# Run it beside `make bench` (docs/performance.md) and give the fsync=on rates
# to the bench by connections: make bench BENCHFLAGS='-pg-rate 64=12345,256=6789'. Needs PostgreSQL's
# server binaries (Debian: postgresql-15); run as root, it runs Postgres as
# the postgres user.
#
# Settings (environment): CLIENTS (default "64"; several, e.g. "64 256"),
# DURATION (seconds, default 10), FSYNC (default "on off"), PGBIN (default
# the newest /usr/lib/postgresql/*/bin).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-10}
FSYNC=${FSYNC:-on off}
. "$here/pgcluster.sh"
pg_cluster pgledger
cp "$here/pgledger.sql" "$dir/ledger.sql"

for fsync in $FSYNC; do
	for clients in $CLIENTS; do
		as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/log" -w -o "-c fsync=$fsync -c max_connections=$((clients + 10)) \
			-c shared_buffers=256MB -c listen_addresses='' -c unix_socket_directories=$dir" start >/dev/null
		PGOPTIONS='-c client_min_messages=warning' as_pg "$PGBIN/psql" -q -h "$dir" -U postgres -v ON_ERROR_STOP=1 -c '
			DROP TABLE IF EXISTS ledger;
			CREATE TABLE ledger (
				key text PRIMARY KEY, status text NOT NULL, fingerprint text NOT NULL, holder text,
				lease_until timestamptz, attempt int NOT NULL, attempts int NOT NULL DEFAULT 0, result jsonb,
				created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, completed_at timestamptz);
			CHECKPOINT;' postgres
		tps=$(as_pg "$PGBIN/pgbench" -h "$dir" -U postgres -n -M prepared -c "$clients" -j 2 -T "$DURATION" \
			-f "$dir/ledger.sql" postgres 2>"$dir/pgbench.err" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
		[ -n "$tps" ] || { cat "$dir/pgbench.err" >&2; exit 1; }
		printf 'postgres-ledger fsync=%s clients=%s: %.0f intents/s\n' "$fsync" "$clients" "$tps"
		as_pg "$PGBIN/pg_ctl" -D "$dir/data" -w stop >/dev/null
	done
done
