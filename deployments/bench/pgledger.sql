-- One intent through a Postgres ledger table: claim the key (an insert that
-- does nothing when the key exists), then record the result on it. Each
-- statement commits on its own, as each of idemgate's ledger writes is
-- acknowledged on its own. The key is 75 bytes, like idemgate's
-- <tool>.<64 hex>; the result about 250 bytes of JSON, like the bench's.
\set r random(1, 4611686018427387903)
INSERT INTO ledger (key, status, fingerprint, holder, lease_until, attempt, created_at, updated_at)
  VALUES ('bench_noop.' || md5(:r::text) || md5((:r::bigint + 1)::text), 'pending', md5(:r::text) || md5((:r::bigint + 2)::text),
          'pgbench', now() + interval '30 seconds', 1, now(), now())
  ON CONFLICT (key) DO NOTHING;
UPDATE ledger SET status = 'completed', attempts = 1, lease_until = NULL, updated_at = now(), completed_at = now(),
       result = ('{"i":' || :r::bigint || ',"pad":"' || repeat('x', 196) || '","run":"pgbench"}')::jsonb
  WHERE key = 'bench_noop.' || md5(:r::text) || md5((:r::bigint + 1)::text) AND status = 'pending';
