package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The client reads a ledger in the layout it records: a compact ledger's
// record is found by its key (Get, Watch, Records, Forget). A ledger that
// records a layout the client does not know is refused at once, naming the
// layout — Get and a watch alike, never a wait on keys the ledger does not
// hold.
func TestClientReadsTheRecordedLayout(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s.ClientURL())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ledger, err := dedup.Open(ctx, js, dedup.BucketConfig{})
	require.NoError(t, err)
	require.Equal(t, intent.LayoutCompact, ledger.Layout())
	key := "send_email.ea5b3b5ecc3fa233989582335bb7067cd6c904cb4d46baf4530950de5b22b7f6"
	res, err := ledger.Claim(ctx, dedup.ClaimRequest{Key: key, Tool: "send_email", Fingerprint: "fp", Holder: "w1"})
	require.NoError(t, err)
	_, err = res.Lease.Complete(ctx, json.RawMessage(`{"id":7}`), 1)
	require.NoError(t, err)

	cl, err := client.New(natstest.Connect(t, s.ClientURL()))
	require.NoError(t, err)
	rec, err := cl.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, intent.StatusCompleted, rec.Status)
	rec, err = cl.Watch(ctx, key)
	require.NoError(t, err)
	require.JSONEq(t, `{"id":7}`, string(rec.Result))
	page, err := cl.Records(ctx, dedup.Query{})
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	stored, err := intent.LedgerKey(key, intent.LayoutCompact)
	require.NoError(t, err)
	require.Equal(t, stored, page.Records[0].Key, "a listing shows the stored key")
	rec, err = cl.Get(ctx, stored)
	require.NoError(t, err, "which reads the record too")
	require.Equal(t, intent.StatusCompleted, rec.Status)

	st, err := js.Stream(ctx, "KV_IDEM_LEDGER")
	require.NoError(t, err)
	sc := st.CachedInfo().Config
	sc.Metadata["idemgate.layout"] = "9"
	_, err = js.UpdateStream(ctx, sc)
	require.NoError(t, err)
	fresh, err := client.New(natstest.Connect(t, s.ClientURL()))
	require.NoError(t, err)
	_, err = fresh.Get(ctx, key)
	require.ErrorIs(t, err, dedup.ErrLayout)
	require.ErrorContains(t, err, `layout "9"`)
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	_, err = fresh.Watch(wctx, key)
	require.ErrorIs(t, err, dedup.ErrLayout, "refused at once, not waited on")
	require.NoError(t, wctx.Err())
}

// A client that stays up across a migration of the ledger (more
// partitions, compact keys) reads it in its new shape: a record read
// before is found again (the read that misses looks at the shape), a
// listing shows every partition's records, and a watch begun before the
// migration, on a key whose place it moved, is answered from the new
// place.
func TestClientFollowsAMigration(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js, err := jetstream.New(natstest.Connect(t, s.ClientURL()))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	complete := func(l *dedup.Ledger, key string) {
		t.Helper()
		res, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Tool: "send_email", Fingerprint: "fp", Holder: "w1"})
		require.NoError(t, err)
		_, err = res.Lease.Complete(ctx, json.RawMessage(`{"key":"`+key+`"}`), 1)
		require.NoError(t, err)
	}
	before, err := dedup.Open(ctx, js, dedup.BucketConfig{Partitions: 1, Layout: intent.LayoutFull})
	require.NoError(t, err)
	done := "send_email.ea5b3b5ecc3fa233989582335bb7067cd6c904cb4d46baf4530950de5b22b7f6"  // partition 6 of 8
	later := "send_email.ce38c54c4bbe279ce756074e2c49ff6aebe42475738cabac230b43af6fff4559" // partition 4 of 8
	complete(before, done)

	cl, err := client.New(natstest.Connect(t, s.ClientURL()))
	require.NoError(t, err)
	_, err = cl.Get(ctx, done)
	require.NoError(t, err, "read in the ledger's first shape")
	watched := make(chan error, 1)
	go func() {
		rec, err := cl.Watch(ctx, later)
		if err == nil && string(rec.Result) != `{"key":"`+later+`"}` {
			err = fmt.Errorf("watch answered %s", rec.Result)
		}
		watched <- err
	}()

	forgetter, err := client.New(natstest.Connect(t, s.ClientURL()))
	require.NoError(t, err)
	_, err = forgetter.Get(ctx, done)
	require.NoError(t, err, "opened in the ledger's first shape")
	rep, err := dedup.Migrate(ctx, js, "IDEM_LEDGER", dedup.MigrateConfig{Partitions: 8, Layout: intent.LayoutCompact})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Moved)

	rec, err := cl.Get(ctx, done)
	require.NoError(t, err, "found in its new place")
	require.Equal(t, intent.StatusCompleted, rec.Status)
	after, err := dedup.Open(ctx, js, dedup.BucketConfig{})
	require.NoError(t, err)
	require.Equal(t, 8, after.Partitions())
	third := "send_email.0f5c2b1c9b7c3e4d5a6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5"
	complete(after, third)
	_, err = forgetter.Forget(ctx, third)
	require.NoError(t, err, "a Forget that misses in the shape it opened looks at the ledger again")
	complete(after, later)
	require.NoError(t, <-watched, "the watch follows the key to its new place")
	page, err := cl.Records(ctx, dedup.Query{})
	require.NoError(t, err)
	require.Len(t, page.Records, 2, "a listing reads every partition")
	_, err = cl.Forget(ctx, done)
	require.NoError(t, err, "Forget writes with the ledger the client reopened")
	rec, _, err = after.Get(ctx, done)
	require.NoError(t, err)
	require.Equal(t, intent.StatusForgotten, rec.Status)
}
