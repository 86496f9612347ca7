package client_test

import (
	"context"
	"encoding/json"
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
	sc.Metadata[dedup.LayoutMetadata] = "9"
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
