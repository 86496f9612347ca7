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

// Peek reads a record by a direct get, never by the leader's message get,
// and finds nothing in a key without a live record or on a stream that
// serves no direct gets.
func TestPeekReadsByADirectGet(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	direct := jetStream(t, s.ClientURL())
	kv, err := dedup.EnsureBucket(ctx, direct, dedup.BucketConfig{Bucket: "PEEK"})
	require.NoError(t, err)
	var directGets, leaderGets atomic.Int32
	js := relayed(t, s, "PEEKING", func(subject string, _ *nats.Msg) bool {
		switch {
		case strings.HasPrefix(subject, "DIRECT.GET."):
			directGets.Add(1)
		case strings.HasPrefix(subject, "STREAM.MSG.GET."):
			leaderGets.Add(1)
		}
		return false
	})
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "PEEK"}, dedup.Bind())
	require.NoError(t, err)

	_, _, ok := l.Peek(ctx, "k.1")
	require.False(t, ok, "no record")
	res, err := l.Claim(ctx, dedup.ClaimRequest{Key: "k.1", Tool: "t", Fingerprint: "f", Holder: "w1", Lease: time.Minute})
	require.NoError(t, err)
	_, err = res.Lease.Complete(ctx, json.RawMessage(`"done"`), 1)
	require.NoError(t, err)
	directGets.Store(0)
	leaderGets.Store(0)
	rec, rev, ok := l.Peek(ctx, "k.1")
	require.True(t, ok)
	require.Equal(t, json.RawMessage(`"done"`), rec.Result)
	latest, err := kv.Get(ctx, "k.1")
	require.NoError(t, err)
	require.Equal(t, latest.Revision(), rev)
	require.Equal(t, int32(1), directGets.Load(), "one direct get")
	require.Zero(t, leaderGets.Load(), "no leader read")

	require.NoError(t, kv.Delete(ctx, "k.1"))
	_, _, ok = l.Peek(ctx, "k.1")
	require.False(t, ok, "a delete marker is no record")

	// A stream without direct gets: nothing found, the caller watches.
	_, err = direct.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "PEEKNODIRECT"})
	require.NoError(t, err)
	st, err := direct.Stream(ctx, "KV_PEEKNODIRECT")
	require.NoError(t, err)
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = false
	_, err = direct.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	nodirect, err := dedup.Open(ctx, direct, dedup.BucketConfig{Bucket: "PEEKNODIRECT"}, dedup.Bind())
	require.NoError(t, err)
	res, err = nodirect.Claim(ctx, dedup.ClaimRequest{Key: "k.2", Tool: "t", Fingerprint: "f", Holder: "w1", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, res.Outcome)
	_, _, ok = nodirect.Peek(ctx, "k.2")
	require.False(t, ok, "no direct get is served")
}
