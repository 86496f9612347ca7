package dedup_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// WatchAll sees every write made after it started, in every partition,
// under the key a listing shows (the compact key in layout 2), deletions
// included; a write made before it is not replayed; the channel closes with
// its context.
func TestWatchAll(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "WATCHALL", Partitions: 4, Layout: intent.LayoutCompact})
	require.NoError(t, err)

	before := partKey("refund", 0)
	_, err = l.Claim(ctx, dedup.ClaimRequest{Key: before, Fingerprint: "fp", Holder: "w1", Session: "a"})
	require.NoError(t, err)

	r, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "WATCHALL"}, dedup.Bind())
	require.NoError(t, err)
	wctx, stop := context.WithCancel(ctx)
	changes, err := r.WatchAll(wctx)
	require.NoError(t, err)

	// Keys spread over the partitions: each is claimed then completed.
	want := map[string][]intent.Status{}
	for i := 1; i <= 8; i++ {
		key := partKey("refund", i)
		c, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "fp", Holder: "w1", Session: "a"})
		require.NoError(t, err)
		_, err = c.Lease.Complete(ctx, json.RawMessage(`{}`), 1)
		require.NoError(t, err)
		sk, err := intent.LedgerKey(key, intent.LayoutCompact)
		require.NoError(t, err)
		want[sk] = []intent.Status{intent.StatusPending, intent.StatusCompleted}
	}
	forgotten, err := intent.LedgerKey(partKey("refund", 1), intent.LayoutCompact)
	require.NoError(t, err)
	_, err = l.Forget(ctx, partKey("refund", 1))
	require.NoError(t, err)

	got := map[string][]intent.Status{}
	revs := map[string]uint64{}
	deleted := false
	for !deleted || len(got) < len(want) || !complete(got) {
		select {
		case c := <-changes:
			require.NotEqual(t, before, c.Key, "a write made before the watch is not replayed")
			require.Greater(t, c.Revision, revs[c.Key], "a key's writes arrive in order")
			revs[c.Key] = c.Revision
			if !c.Deleted && c.Record.Status == intent.StatusForgotten {
				require.Equal(t, forgotten, c.Key, "a forget shows as its forgotten record")
				deleted = true
				continue
			}
			require.Equal(t, "a", c.Record.Session)
			got[c.Key] = append(got[c.Key], c.Record.Status)
		case <-ctx.Done():
			t.Fatalf("watch saw %v, deleted %v; want %v", got, deleted, want)
		}
	}
	// The ledger keeps one message per key: a pending record completed
	// before the watch delivered it is skipped, never shown after its
	// successor.
	for k, seen := range got {
		if len(seen) == 1 {
			seen = append([]intent.Status{intent.StatusPending}, seen...)
		}
		require.Equal(t, want[k], seen, k)
	}

	stop()
	for range changes { // closed once the watches stop
	}
}

// complete reports whether every key reached completed.
func complete(got map[string][]intent.Status) bool {
	for _, s := range got {
		if s[len(s)-1] != intent.StatusCompleted {
			return false
		}
	}
	return true
}
