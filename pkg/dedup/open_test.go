package dedup_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A bad option or configuration makes Open fail at once, with ErrInvalid and
// before it sends anything: on a closed connection, where any request would
// fail, the error is still the option's.
func TestOpenRefusesBadOptionsAtOnce(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.RunServer(t).ClientURL())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	nc.Close()
	ctx := t.Context()
	for name, tc := range map[string]struct {
		cfg  dedup.BucketConfig
		opts []dedup.Option
		says string
	}{
		"BatchTooLarge":   {opts: []dedup.Option{dedup.WithBatching(dedup.BatchConfig{Max: dedup.MaxBatch + 1})}, says: "batch max 1001"},
		"TooManyInFlight": {opts: []dedup.Option{dedup.WithBatching(dedup.BatchConfig{InFlight: dedup.MaxBatchInFlight + 1})}, says: "batches in flight 9"},
		"NoReceiptFunc":   {opts: []dedup.Option{dedup.WithReceipts("w1", nil)}, says: "receipts"},
		"NoClock":         {opts: []dedup.Option{dedup.WithClock(nil)}, says: "clock"},
		"BadBucketName":   {cfg: dedup.BucketConfig{Bucket: "a.b"}, says: `bucket name "a.b"`},
		"BadPartitions":   {cfg: dedup.BucketConfig{Partitions: 3}, says: "partitions 3"},
		"BadLayout":       {cfg: dedup.BucketConfig{Layout: 7}, says: "layout 7"},
		"ShortRetention":  {cfg: dedup.BucketConfig{TTL: time.Millisecond}, says: "ttl 1ms"},
		"BadBound":        {cfg: dedup.BucketConfig{Partitions: 3}, opts: []dedup.Option{dedup.Bind()}, says: "partitions 3"},
	} {
		_, err := dedup.Open(ctx, js, tc.cfg, tc.opts...)
		require.ErrorIs(t, err, dedup.ErrInvalid, name)
		require.ErrorContains(t, err, tc.says, name)
	}
	_, err = dedup.Open(ctx, nil, dedup.BucketConfig{})
	require.ErrorIs(t, err, dedup.ErrInvalid)
}

// Bound, a ledger opens in the shape it records: a partition count or key
// layout that is asked for must be the recorded one; final records keep the
// retention the caller gives.
func TestOpenBound(t *testing.T) {
	t.Parallel()
	js := jetStream(t, natstest.RunServer(t).ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "BOUND", Partitions: 2})
	require.NoError(t, err)

	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "BOUND", Partitions: 2, TTL: time.Hour}, dedup.Bind())
	require.NoError(t, err)
	require.Equal(t, 2, l.Partitions())
	_, err = dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "BOUND", Partitions: 4}, dedup.Bind())
	require.ErrorIs(t, err, dedup.ErrPartitions)
	require.ErrorContains(t, err, "has 2 partitions")

	key := partKey("refund", 1)
	res, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "fp", Holder: "w1"})
	require.NoError(t, err)
	_, err = res.Lease.Complete(ctx, json.RawMessage(`1`), 1)
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, l.Buckets()[intent.Partition(key, 2)])
	require.NoError(t, err)
	stored, err := intent.LedgerKey(key, l.Layout())
	require.NoError(t, err)
	e, err := kv.Get(ctx, stored)
	require.NoError(t, err)
	msg, err := js.Stream(ctx, "KV_"+kv.Bucket())
	require.NoError(t, err)
	raw, err := msg.GetMsg(ctx, e.Revision())
	require.NoError(t, err)
	require.Equal(t, "1h0m0s", raw.Header.Get(jetstream.MsgTTLHeader), "a final record kept for the bound ledger's TTL")
}
