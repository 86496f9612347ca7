#!/bin/sh
# River (the Postgres job queue) tuned for throughput, as the yardstick of
# idemgate's unique row: N jobs unique by their key (UniqueOpts ByArgs), as
# idemgate's intents are, inserted in batches (InsertMany, parallel
# inserters) and worked by a noop worker, the rate from the first insert to
# the last completion (deployments/bench/river, a Go module of its own), on a
# throwaway cluster in a temporary directory (removed afterwards). It prints
# one line per setting:
#
#   river unique-jobs fsync=off n=20000 batch=1000 workers=256: 12345 jobs/s (cpu: river process 80 µs/job, postgres 150 µs/job)
#
# Tuned means what a River user chasing throughput picks: fsync=off,
# synchronous_commit=off and full_page_writes=off (a crash can lose or
# corrupt the cluster), max_wal_size=4GB (no checkpoint forced by WAL
# volume during the run), shared_buffers=256MB; FSYNC=on runs Postgres's
# durable defaults of the three instead. The client fetches every 2 ms at
# most and polls every 20 ms, as River's own benchmark does.
#
# Run it beside `make bench` (docs/performance.md) and give the fsync=off
# rate to the bench: make bench BENCHFLAGS='-river-rate 12345'. Needs
# PostgreSQL's server binaries (Debian: postgresql-15) and Go; run as root,
# it runs Postgres as the postgres user.
#
# Settings (environment): N (jobs, default 20000), BATCH (jobs per
# InsertMany, default 1000), INSERTERS (InsertMany calls in parallel,
# default 1: 2 or 4 were no faster on 2 cores), WORKERS (the queue's MaxWorkers, default 256, the idemgate
# worker's concurrency), FSYNC (default "off"; "on off" runs both), PGBIN
# (default the newest /usr/lib/postgresql/*/bin), GO (default go),
# RIVERFLAGS (more flags of the Go program, e.g. '-fetch-cooldown 5ms'; see
# its -h).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
N=${N:-20000}
BATCH=${BATCH:-1000}
INSERTERS=${INSERTERS:-1}
WORKERS=${WORKERS:-256}
FSYNC=${FSYNC:-off}
GO=${GO:-go}
RIVERFLAGS=${RIVERFLAGS:-}
. "$here/pgcluster.sh"
pg_cluster riverbench
(cd "$here/river" && "$GO" build -o "$dir/river" .)

run=0
for fsync in $FSYNC; do
	run=$((run + 1))
	durability="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	[ "$fsync" = on ] && durability="-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
	as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/log" -w -o "$durability -c max_connections=$((INSERTERS + 30)) \
		-c shared_buffers=256MB -c max_wal_size=4GB -c listen_addresses='' -c unix_socket_directories=$dir" start >/dev/null
	as_pg "$PGBIN/createdb" -h "$dir" -U postgres "river$run" # fresh each run, as River's tables' statistics count
	line=$(DATABASE_URL="postgres://postgres@/river$run?host=$dir" "$dir/river" -n "$N" -batch "$BATCH" \
		-inserters "$INSERTERS" -workers "$WORKERS" -pg-pid "$(head -n 1 "$dir/data/postmaster.pid")" $RIVERFLAGS)
	echo "$line" | sed "s/^river unique-jobs /&fsync=$fsync /"
	as_pg "$PGBIN/pg_ctl" -D "$dir/data" -w stop >/dev/null
done
