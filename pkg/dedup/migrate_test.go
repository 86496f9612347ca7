package dedup_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A 2-partition ledger of layout 1, with final and pending records, grown
// to 8 partitions of layout 2: every record is in its new place (counted,
// under its compact key, in its partition), keeps its TTL, and answers as
// before — a duplicate claim of a completed operation is Done with its
// result, a pending one is found as it was. A second run does nothing. A
// live lease is refused before anything changes, and a run interrupted
// after a record was written to its new place finishes when run again.
func TestMigrate(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := dedup.BucketConfig{Bucket: "MIGRATE", Partitions: 2, Layout: intent.LayoutFull, TTL: time.Hour}
	l, err := dedup.Open(ctx, js, cfg)
	require.NoError(t, err)
	// Pending records whose holders are gone: claimed an hour ago with a
	// two seconds' lease (each run confirms them gone for one more lease).
	past, err := dedup.Open(ctx, js, cfg, dedup.WithClock(func() time.Time { return time.Now().Add(-time.Hour) }))
	require.NoError(t, err)

	const n = 40
	keys := make([]string, n)
	for i := range n {
		keys[i] = partKey("send_email", 1000+i)
		req := dedup.ClaimRequest{Key: keys[i], Tool: "send_email", Fingerprint: "fp-" + strconv.Itoa(i), Holder: "w1", Lease: time.Minute}
		if i%4 == 3 {
			req.Lease = 2 * time.Second
			res, err := past.Claim(ctx, req)
			require.NoError(t, err)
			require.Equal(t, dedup.Acquired, res.Outcome)
			continue
		}
		res, err := l.Claim(ctx, req)
		require.NoError(t, err)
		_, err = res.Lease.Complete(ctx, json.RawMessage(`{"n":`+strconv.Itoa(i)+`}`), 1)
		require.NoError(t, err)
	}
	before := countRecords(t, ctx, l)
	require.Equal(t, n, before)

	// A live lease: refused, nothing changed.
	live, err := l.Claim(ctx, dedup.ClaimRequest{Key: partKey("send_email", 5000), Tool: "send_email", Fingerprint: "fp", Holder: "w2"})
	require.NoError(t, err)
	_, err = dedup.Migrate(ctx, js, "MIGRATE", dedup.MigrateConfig{Partitions: 8, Layout: intent.LayoutCompact})
	require.ErrorIs(t, err, dedup.ErrInFlight)
	parts, err := dedup.RecordedPartitions(ctx, js, "MIGRATE")
	require.NoError(t, err)
	require.Equal(t, 2, parts, "a refused migration changes nothing")
	_, err = live.Lease.Complete(ctx, json.RawMessage(`{"n":"live"}`), 1)
	require.NoError(t, err)
	keys = append(keys, partKey("send_email", 5000))

	for _, bad := range []dedup.MigrateConfig{{Partitions: 1}, {Partitions: 6}, {Layout: 3}} {
		_, err := dedup.Migrate(ctx, js, "MIGRATE", bad)
		require.ErrorIs(t, err, dedup.ErrInvalid, "%+v", bad)
	}

	rep, err := dedup.Migrate(ctx, js, "MIGRATE", dedup.MigrateConfig{Partitions: 8, Layout: intent.LayoutCompact})
	require.NoError(t, err)
	require.Equal(t, dedup.MigrateReport{FromPartitions: 2, FromLayout: intent.LayoutFull, ToPartitions: 8, ToLayout: intent.LayoutCompact,
		Records: n + 1, Moved: n + 1}, rep, "every key moves: its KV key changes")

	after, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "MIGRATE"}, dedup.Bind())
	require.NoError(t, err)
	require.Equal(t, 8, after.Partitions())
	require.Equal(t, intent.LayoutCompact, after.Layout())
	require.Equal(t, n+1, countRecords(t, ctx, after), "no record lost")
	kvs, _, err := dedup.BindPartitions(ctx, js, "MIGRATE")
	require.NoError(t, err)
	perPart := make([]int, 8)
	for i, key := range keys {
		stored, err := intent.LedgerKey(key, intent.LayoutCompact)
		require.NoError(t, err)
		p := intent.Partition(key, 8)
		perPart[p]++
		e, err := kvs[p].Get(ctx, stored)
		require.NoError(t, err, "%s under its compact key in partition %d", key, p)
		for j, kv := range kvs {
			if j != p {
				_, err := kv.Get(ctx, stored)
				require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
			}
			_, err = kv.Get(ctx, key)
			require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "nothing left under the full key")
		}
		_, err = dedup.DecodeRecord(e.Value())
		require.NoError(t, err)
		if i < n && i%4 == 3 {
			got, _, err := after.Get(ctx, key)
			require.NoError(t, err)
			require.Equal(t, intent.StatusPending, got.Status)
			require.Equal(t, "w1", got.Holder)
			continue
		}
		fp := "fp"
		if i < n {
			fp = "fp-" + strconv.Itoa(i)
		}
		res, err := after.Claim(ctx, dedup.ClaimRequest{Key: key, Tool: "send_email", Fingerprint: fp, Holder: "w3"})
		require.NoError(t, err)
		require.Equal(t, dedup.Done, res.Outcome, "the same replay: %s", key)
		want := `{"n":"live"}`
		if i < n {
			want = `{"n":` + strconv.Itoa(i) + `}`
		}
		require.JSONEq(t, want, string(res.Record.Result))
	}
	for p, c := range perPart {
		require.Positive(t, c, "partition %d holds records", p)
	}
	// A final record keeps its retention: it still carries a TTL.
	st, err := js.Stream(ctx, "KV_"+dedup.PartitionBucket("MIGRATE", intent.Partition(keys[0], 8)))
	require.NoError(t, err)
	stored0, err := intent.LedgerKey(keys[0], intent.LayoutCompact)
	require.NoError(t, err)
	msg, err := st.GetLastMsgForSubject(ctx, "$KV."+dedup.PartitionBucket("MIGRATE", intent.Partition(keys[0], 8))+"."+stored0)
	require.NoError(t, err)
	ttl, err := time.ParseDuration(msg.Header.Get(jetstream.MsgTTLHeader))
	require.NoError(t, err)
	require.True(t, ttl > 50*time.Minute && ttl <= time.Hour, "the rest of its hour: %s", ttl)

	again, err := dedup.Migrate(ctx, js, "MIGRATE", dedup.MigrateConfig{Partitions: 8, Layout: intent.LayoutCompact})
	require.NoError(t, err)
	require.Equal(t, 0, again.Moved, "a second run moves nothing")
	require.Equal(t, n+1, again.Records)
	require.Equal(t, n+1, countRecords(t, ctx, after))
}

// A run interrupted after writing a record to its new place (and before
// purging the old copy, or recording the new shape) leaves the ledger
// marked: nothing opens it; the same migration run again finishes it, and
// no record is left twice or lost.
func TestMigrateResumes(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := dedup.BucketConfig{Bucket: "RESUME", Layout: intent.LayoutFull}
	l, err := dedup.Open(ctx, js, cfg)
	require.NoError(t, err)
	keys := make([]string, 6)
	for i := range keys {
		keys[i] = partKey("refund", 7000+i)
		res, err := l.Claim(ctx, dedup.ClaimRequest{Key: keys[i], Tool: "refund", Fingerprint: "fp", Holder: "w1"})
		require.NoError(t, err)
		_, err = res.Lease.Complete(ctx, json.RawMessage(`1`), 1)
		require.NoError(t, err)
	}
	// What an interrupted run left: the mark, and keys[0] written under its
	// compact key beside its old copy.
	st, err := js.Stream(ctx, "KV_RESUME")
	require.NoError(t, err)
	sc := st.CachedInfo().Config
	sc.Metadata["idemgate.migrating"] = "1/2"
	_, err = js.UpdateStream(ctx, sc)
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, "RESUME")
	require.NoError(t, err)
	old, err := kv.Get(ctx, keys[0])
	require.NoError(t, err)
	rec, err := dedup.DecodeRecord(old.Value())
	require.NoError(t, err)
	data, err := json.Marshal(rec)
	require.NoError(t, err)
	stored0, err := intent.LedgerKey(keys[0], intent.LayoutCompact)
	require.NoError(t, err)
	_, err = kv.Create(ctx, stored0, data)
	require.NoError(t, err)

	_, err = dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "RESUME"}, dedup.Bind())
	require.ErrorIs(t, err, dedup.ErrMigrating, "nothing opens a ledger mid-migration")
	_, _, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: "RESUME"})
	require.ErrorIs(t, err, dedup.ErrMigrating, "no worker starts on it")
	_, err = dedup.Migrate(ctx, js, "RESUME", dedup.MigrateConfig{Partitions: 2, Layout: intent.LayoutCompact})
	require.ErrorIs(t, err, dedup.ErrMigrating, "another target than the interrupted run's")

	rep, err := dedup.Migrate(ctx, js, "RESUME", dedup.MigrateConfig{Layout: intent.LayoutCompact})
	require.NoError(t, err)
	require.Equal(t, 6, rep.Records)
	require.Equal(t, 6, rep.Moved)
	require.Equal(t, 1, rep.Resumed, "keys[0] was written already")
	got, err := kv.Keys(ctx)
	require.NoError(t, err)
	var want []string
	for _, k := range keys {
		sk, err := intent.LedgerKey(k, intent.LayoutCompact)
		require.NoError(t, err)
		want = append(want, sk)
	}
	require.ElementsMatch(t, want, got, "each record once, under its compact key")
	after, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "RESUME"}, dedup.Bind())
	require.NoError(t, err)
	require.Equal(t, intent.LayoutCompact, after.Layout())
	for _, k := range keys {
		res, err := after.Claim(ctx, dedup.ClaimRequest{Key: k, Tool: "refund", Fingerprint: "fp", Holder: "w2"})
		require.NoError(t, err)
		require.Equal(t, dedup.Done, res.Outcome)
	}
}

func countRecords(t *testing.T, ctx context.Context, l *dedup.Ledger) int {
	t.Helper()
	n := 0
	q := dedup.Query{Limit: dedup.MaxListLimit}
	for {
		page, err := l.List(ctx, q)
		require.NoError(t, err)
		n += len(page.Records)
		if !page.More {
			return n
		}
		q.After = page.Next
	}
}
