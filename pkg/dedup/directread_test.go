package dedup_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
)

// A refused claim reads the record with a direct get, which any replica may
// answer, only when the answer is as new as the message the refusal named:
// a lagging replica's older message (here a relay answering every direct
// get with the key's superseded claim, as a follower that has not applied
// the completion would) is never decided on, and a stream that serves no
// direct gets is read from its leader.
func TestRefusedClaimReadsNoOlderMessageThanTheRefusal(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	direct := jetStream(t, s.ClientURL())
	kv, err := dedup.EnsureBucket(ctx, direct, dedup.BucketConfig{Bucket: "DIRECTREAD"})
	require.NoError(t, err)
	plain, err := dedup.Open(ctx, direct, dedup.BucketConfig{Bucket: "DIRECTREAD"}, dedup.Bind())
	require.NoError(t, err)

	claim := func(l *dedup.Ledger, key, holder string) dedup.ClaimResult {
		t.Helper()
		res, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Tool: "t", Fingerprint: "f", Holder: holder, Lease: time.Minute})
		require.NoError(t, err)
		return res
	}
	first := claim(plain, "k.1", "w1")
	require.Equal(t, dedup.Acquired, first.Outcome)
	pending, err := kv.Get(ctx, "k.1")
	require.NoError(t, err)
	_, err = first.Lease.Complete(ctx, json.RawMessage(`"done"`), 1)
	require.NoError(t, err)

	// A duplicate on the server's own direct get is answered from it.
	require.Equal(t, dedup.Done, claim(plain, "k.1", "w2").Outcome)
	require.Equal(t, uint64(1), dedup.DirectReads(plain), "the refused claim read its record by a direct get")

	// Through a relay that answers direct gets with the pending claim.
	var stale atomic.Int32
	js := relayed(t, s, "STALE", func(subject string, m *nats.Msg) bool {
		if !strings.HasPrefix(subject, "DIRECT.GET.") {
			return false
		}
		stale.Add(1)
		h := nats.Header{}
		h.Set(jetstream.SequenceHeader, "1")
		h.Set(jetstream.SubjectHeader, pending.Key())
		_ = m.RespondMsg(&nats.Msg{Header: h, Data: pending.Value()})
		return true
	})
	lagging, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "DIRECTREAD"}, dedup.Bind())
	require.NoError(t, err)
	require.Equal(t, dedup.Done, claim(lagging, "k.1", "w3").Outcome,
		"the older message (a live lease of w1) is not taken: the record is final")
	require.Equal(t, int32(1), stale.Load(), "the direct get was asked")
	require.Zero(t, dedup.DirectReads(lagging))

	// A stream without direct gets answers no direct get: the leader read.
	_, err = direct.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "NODIRECT"})
	require.NoError(t, err)
	st, err := direct.Stream(ctx, "KV_NODIRECT")
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = false
	_, err = direct.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	nodirect, err := dedup.Open(ctx, direct, dedup.BucketConfig{Bucket: "NODIRECT"}, dedup.Bind())
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, claim(nodirect, "k.2", "w1").Outcome)
	require.Equal(t, dedup.Busy, claim(nodirect, "k.2", "w2").Outcome)
	require.Zero(t, dedup.DirectReads(nodirect))
}
