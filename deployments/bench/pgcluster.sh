# Sourced by pgledger.sh and river.sh: a throwaway PostgreSQL cluster in a
# temporary directory, $dir (its data in $dir/data, its socket in $dir),
# stopped and removed when the script exits. as_pg runs a command as the
# postgres user when the script runs as root. PGBIN (default the newest
# /usr/lib/postgresql/*/bin) names the server binaries.
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[ -x "$PGBIN/initdb" ] || { echo "$(basename "$0"): no PostgreSQL server binaries (set PGBIN)" >&2; exit 2; }

as_pg() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# pg_cluster NAME makes the cluster in /tmp/NAME.XXXXXX.
pg_cluster() {
	dir=$(mktemp -d "/tmp/$1.XXXXXX")
	trap pg_cleanup EXIT INT TERM
	[ "$(id -u)" = 0 ] && chown postgres "$dir"
	as_pg "$PGBIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >/dev/null
}

pg_cleanup() {
	as_pg "$PGBIN/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
	rm -rf "$dir"
}
