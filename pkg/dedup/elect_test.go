package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The first to elect wins until the election's TTL runs out, then the next
// one does; the election is a key of partition 0 that no listing shows, even
// when its holder reads as a record.
func TestElect(t *testing.T) {
	t.Parallel()
	js := jetStream(t, natstest.RunServer(t).ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "ELECT", Partitions: 2})
	require.NoError(t, err)
	key := keyFor(t, "elect")
	listed, err := intent.LedgerKey(key, l.Layout()) // as a listing shows it
	require.NoError(t, err)
	_, err = l.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "fp", Holder: "h", Lease: time.Minute})
	require.NoError(t, err)

	const ttl = time.Second
	holder := `{"status":"pending","tool":"scan","holder":"w1"}` // reads as a record
	start := time.Now()
	won, err := l.Elect(ctx, "scan", holder, ttl)
	require.NoError(t, err)
	require.True(t, won, "the first wins")
	won, err = l.Elect(ctx, "scan", "w2", ttl)
	require.NoError(t, err)
	require.False(t, won, "the second loses while the first's election lasts")
	won, err = l.Elect(ctx, "other", "w2", ttl)
	require.NoError(t, err)
	require.True(t, won, "another election is its own")

	kvs, _, err := dedup.BindPartitions(ctx, js, "ELECT")
	require.NoError(t, err)
	e, err := kvs[0].Get(ctx, "_scan")
	require.NoError(t, err)
	require.Equal(t, holder, string(e.Value()), "the key _scan of partition 0 holds the winner")

	page, err := l.List(ctx, dedup.Query{})
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	require.Equal(t, listed, page.Records[0].Key, "only the record is listed")
	var walked []string
	require.NoError(t, l.Walk(ctx, dedup.Query{}, func(r dedup.Listed) bool {
		walked = append(walked, r.Key)
		return true
	}))
	require.Equal(t, []string{listed}, walked, "only the record is walked")

	require.Eventually(t, func() bool {
		won, err := l.Elect(ctx, "scan", "w2", ttl)
		require.NoError(t, err)
		return won
	}, 10*time.Second, 50*time.Millisecond, "the next wins once the TTL ran out")
	require.GreaterOrEqual(t, time.Since(start), ttl, "not before")

	for name, tc := range map[string]struct {
		name string
		ttl  time.Duration
		says string
	}{
		"Empty":    {name: "", ttl: ttl, says: `elect ""`},
		"Dotted":   {name: "a.b", ttl: ttl, says: `elect "a.b"`},
		"Upper":    {name: "Scan", ttl: ttl, says: `elect "Scan"`},
		"ShortTTL": {name: "scan", ttl: 500 * time.Millisecond, says: "ttl 500ms"},
	} {
		_, err := l.Elect(ctx, tc.name, "w1", tc.ttl)
		require.ErrorIs(t, err, dedup.ErrInvalid, name)
		require.ErrorContains(t, err, tc.says, name)
	}
}

// Ready answers while the ledger is there, and gives the server's error once
// it is gone.
func TestReady(t *testing.T) {
	t.Parallel()
	js := jetStream(t, natstest.RunServer(t).ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "READY", Layout: intent.LayoutCompact})
	require.NoError(t, err)
	require.NoError(t, l.Ready(ctx))
	require.NoError(t, js.DeleteKeyValue(ctx, "READY"))
	require.ErrorIs(t, l.Ready(ctx), jetstream.ErrStreamNotFound)
}
