package dedup_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The key layout is recorded at creation on every partition and read at
// open: a new ledger is compact, a bucket made before layouts (no record)
// is layout 1, another layout than the recorded one is refused with both
// named, 0 adopts the recorded one, and a layout this version does not
// know is refused, naming it.
func TestLayoutRecorded(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	kvs, layout, err := dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: "NEWLY", Partitions: 2})
	require.NoError(t, err)
	require.Equal(t, intent.LayoutCompact, layout, "a new ledger has compact keys")
	for _, kv := range kvs {
		st, err := kv.Status(ctx)
		require.NoError(t, err)
		require.Equal(t, "2", st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Metadata["idemgate.layout"], "on every partition: %s", kv.Bucket())
	}
	got, err := dedup.RecordedLayout(ctx, js, "NEWLY")
	require.NoError(t, err)
	require.Equal(t, intent.LayoutCompact, got)

	// A bucket made before layouts, and a ledger of layout 1, both open as
	// layout 1 and refuse layout 2.
	_, err = dedup.EnsureBucket(ctx, js, dedup.BucketConfig{Bucket: "OLD"})
	require.NoError(t, err)
	for _, bucket := range []string{"OLD", "FULL"} {
		if bucket == "FULL" {
			_, layout, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: bucket, Layout: intent.LayoutFull})
			require.NoError(t, err)
			require.Equal(t, intent.LayoutFull, layout)
		}
		got, err := dedup.RecordedLayout(ctx, js, bucket)
		require.NoError(t, err)
		require.Equal(t, intent.LayoutFull, got, bucket)
		l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: bucket}, dedup.Bind())
		require.NoError(t, err)
		require.Equal(t, intent.LayoutFull, l.Layout(), bucket)
		_, layout, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: bucket})
		require.NoError(t, err)
		require.Equal(t, intent.LayoutFull, layout, "%s: 0 adopts the recorded layout", bucket)
		_, _, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: bucket, Layout: intent.LayoutCompact})
		require.ErrorIs(t, err, dedup.ErrLayout, bucket)
		require.ErrorContains(t, err, "has key layout 1")
		require.ErrorContains(t, err, "started with 2")
		_, err = dedup.Open(ctx, js, dedup.BucketConfig{Bucket: bucket, Layout: intent.LayoutCompact})
		require.ErrorIs(t, err, dedup.ErrLayout, bucket)
	}
	_, _, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: "NEWLY", Layout: intent.LayoutFull})
	require.ErrorIs(t, err, dedup.ErrLayout)
	require.ErrorContains(t, err, "has key layout 2")

	// A layout recorded by a later version is refused by every reader.
	s0, err := js.Stream(ctx, "KV_NEWLY")
	require.NoError(t, err)
	sc := s0.CachedInfo().Config
	sc.Metadata["idemgate.layout"] = "3"
	_, err = js.UpdateStream(ctx, sc)
	require.NoError(t, err)
	_, err = dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "NEWLY"}, dedup.Bind())
	require.ErrorIs(t, err, dedup.ErrLayout)
	require.ErrorContains(t, err, `key layout "3"`)
	_, _, err = dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: "NEWLY"})
	require.ErrorIs(t, err, dedup.ErrLayout)

	_, err = dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "BADLAYOUT", Layout: 5})
	require.ErrorIs(t, err, dedup.ErrInvalid)
	_, err = dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "FULL", Layout: intent.LayoutCompact}, dedup.Bind())
	require.ErrorIs(t, err, dedup.ErrLayout, "bound, too, a ledger opens only in the layout it records")
	require.ErrorContains(t, err, "has key layout 1")
}

// A compact ledger stores every derived key under its compact KV key, in
// its partition's bucket, and nothing under the key itself: the raw
// bucket's keys are the compact ones, every operation (claim, leader read,
// wait, forget) finds the record by its key and by its compact key, which a
// listing shows. A claim of a key of the compact shape that is not derived
// is refused, so that it cannot stand for another operation's record; other
// keys are stored as they are.
func TestCompactKeysStored(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "COMPACT", Partitions: 2}, dedup.WithBatching(dedup.BatchConfig{Min: 1}))
	require.NoError(t, err)
	defer l.Close()
	require.Equal(t, intent.LayoutCompact, l.Layout())
	kvs, _, err := dedup.BindPartitions(ctx, js, "COMPACT")
	require.NoError(t, err)

	want := map[int][]string{} // partition: its compact keys
	var keys []string
	for i := range 12 {
		key := partKey("send_email", i)
		keys = append(keys, key)
		res, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Tool: "send_email", Fingerprint: "fp", Holder: "w1"})
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)
		if i%2 == 0 {
			_, err = res.Lease.Complete(ctx, json.RawMessage(`{"n":1}`), 1)
			require.NoError(t, err)
		}
		stored, err := intent.LedgerKey(key, intent.LayoutCompact)
		require.NoError(t, err)
		require.Len(t, stored, len("send_email.")+22)
		want[intent.Partition(key, 2)] = append(want[intent.Partition(key, 2)], stored)

		rec, rev, err := l.Get(ctx, key)
		require.NoError(t, err)
		byStored, storedRev, err := l.Get(ctx, stored)
		require.NoError(t, err, "the compact key reads the same record")
		require.Equal(t, rec.Status, byStored.Status)
		require.Equal(t, rev, storedRev)
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		_, wrev, err := l.WaitFor(wctx, key, func(dedup.Record) bool { return true })
		wcancel()
		require.NoError(t, err, "a watch of the key sees its record")
		require.Equal(t, rev, wrev)
	}
	for p, kv := range kvs {
		got, err := kv.Keys(ctx)
		require.NoError(t, err)
		require.ElementsMatch(t, want[p], got, "partition %d holds the compact keys, and only them", p)
		raw, err := kv.Get(ctx, want[p][0])
		require.NoError(t, err)
		require.NotContains(t, string(raw.Value()), `"key"`, "the record body is the record alone, as in layout 1")
	}

	page, err := l.List(ctx, dedup.Query{})
	require.NoError(t, err)
	var listed []string
	for _, r := range page.Records {
		listed = append(listed, r.Key)
	}
	require.ElementsMatch(t, slices.Concat(want[0], want[1]), listed, "a listing shows the compact keys")

	// A record under a full derived key is not where this layout keeps it:
	// not listed.
	p0 := kvs[intent.Partition(keys[0], 2)]
	_, err = p0.Put(ctx, keys[0], []byte(`{"status":"completed","fingerprint":"fp","attempt":1,"attempts":1,"created_at":"2025-01-06T10:00:00Z","updated_at":"2025-01-06T10:00:00Z"}`))
	require.NoError(t, err)
	page, err = l.List(ctx, dedup.Query{})
	require.NoError(t, err)
	require.Len(t, page.Records, len(keys), "the record under a full key is skipped")

	// A claim of the compact shape is refused for a key that is not derived.
	bad := "send_email.AAAAAAAAAAAAAAAAAAAAAA"
	_, err = l.Claim(ctx, dedup.ClaimRequest{Key: bad, Fingerprint: "fp", Holder: "w1"})
	require.ErrorIs(t, err, dedup.ErrInvalid)
	require.ErrorContains(t, err, "compact ledger key")
	_, _, err = l.Get(ctx, bad)
	require.ErrorIs(t, err, dedup.ErrNotFound, "a compact key is looked up as it is")

	// Other keys are stored as they are.
	res, err := l.Claim(ctx, dedup.ClaimRequest{Key: "ops.note-1", Fingerprint: "fp", Holder: "w1"})
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, res.Outcome)
	_, err = kvs[intent.Partition("ops.note-1", 2)].Get(ctx, "ops.note-1")
	require.NoError(t, err)

	// Forget writes its forgotten record under the compact KV key.
	_, err = l.Forget(ctx, keys[2])
	require.NoError(t, err)
	stored2, err := intent.LedgerKey(keys[2], intent.LayoutCompact)
	require.NoError(t, err)
	e, err := kvs[intent.Partition(keys[2], 2)].Get(ctx, stored2)
	require.NoError(t, err)
	require.Contains(t, string(e.Value()), `"status":"forgotten"`)
}
