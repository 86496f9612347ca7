package worker

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

func TestAnswerCacheKeepsFinalRecordsForItsAge(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newAnswerCache(10*time.Second, 1<<20)
	c.now = func() time.Time { return now }

	c.put("pending", dedup.Record{Status: intent.StatusPending})
	c.put("parked", dedup.Record{Status: intent.StatusAwaitingApproval})
	c.put("uncertain", dedup.Record{Status: intent.StatusUncertain})
	require.Zero(t, c.len(), "only final records: the others change")

	c.put("done", dedup.Record{Status: intent.StatusCompleted, Result: json.RawMessage(`1`)})
	c.put("failed", dedup.Record{Status: intent.StatusFailed, Error: &intent.Error{Code: "x", Message: "no"}})
	c.put("denied", dedup.Record{Status: intent.StatusDenied})
	rec, ok := c.get("done")
	require.True(t, ok)
	require.JSONEq(t, `1`, string(rec.Result))
	_, ok = c.get("missing")
	require.False(t, ok)

	now = now.Add(10 * time.Second)
	_, ok = c.get("done")
	require.False(t, ok, "past its age")
	require.Equal(t, 2, c.len(), "an expired entry goes when met")

	c.put("big", dedup.Record{Status: intent.StatusCompleted, Result: json.RawMessage(`"` + strings.Repeat("x", maxCachedRecord) + `"`)})
	_, ok = c.get("big")
	require.False(t, ok, "too large to keep")

	var none *answerCache
	none.put("k", dedup.Record{Status: intent.StatusCompleted})
	_, ok = none.get("k")
	require.False(t, ok, "a nil cache is off")
}

// An operator forgets by the operation's key or by the key a compact
// ledger stores it under (what listings show): either drops the entry.
func TestAnswerCacheForgetsByStoredKey(t *testing.T) {
	t.Parallel()
	c := newAnswerCache(time.Minute, 1<<20)
	key := "send_email." + strings.Repeat("ab", 32)
	stored, err := intent.LedgerKey(key, intent.LayoutCompact)
	require.NoError(t, err)
	require.NotEqual(t, key, stored)
	rec := dedup.Record{Status: intent.StatusCompleted}
	for _, name := range []string{key, stored} {
		c.put(key, rec)
		c.put("my-own-key", rec)
		c.forget(name)
		_, ok := c.get(key)
		require.False(t, ok, "forgotten by %s", name)
		_, ok = c.get("my-own-key")
		require.True(t, ok, "the others stay")
	}
	c.put(key, rec)
	c.forget("my-own-key")
	c.put("other", rec)
	require.Equal(t, 2, c.len())
	c.forget(stored)
	require.Equal(t, 1, c.len(), "the index follows the entries")
	require.Empty(t, c.byStored)
}

func TestAnswerCacheEvictsLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	rec := dedup.Record{Status: intent.StatusCompleted, Result: json.RawMessage(`"` + strings.Repeat("x", 1000) + `"`)}
	c := newAnswerCache(time.Minute, 3*1600) // room for three such entries
	for _, k := range []string{"a", "b", "c"} {
		c.put(k, rec)
	}
	_, ok := c.get("a") // a is now the most recent
	require.True(t, ok)
	c.put("d", rec)
	require.Equal(t, 3, c.len())
	_, ok = c.get("b")
	require.False(t, ok, "the least recently used went")
	for _, k := range []string{"a", "c", "d"} {
		_, ok := c.get(k)
		require.True(t, ok, k)
	}
}

// A cached record keeps its receipt's signature, not the receipt, which a
// hit rebuilds; the cache's byte bound counts the receipt or the signature
// it keeps.
func TestAnswerCacheKeepsTheReceiptsSignature(t *testing.T) {
	t.Parallel()
	signer, err := audit.GenerateSigner()
	require.NoError(t, err)
	rec := dedup.Record{Status: intent.StatusCompleted, Fingerprint: "fp", Holder: "w1", Attempt: 1, Attempts: 1,
		Result: json.RawMessage(`{"ok":true}`), CompletedAt: time.Unix(1000, 5).UTC()}
	receipt, sig := audit.NewBatchSigner(signer).SignSealed(rec.OutcomeEvent("t.k", "w1"))
	rec.Receipt, rec.Signature = receipt, &dedup.Signature{Key: "t.k", Signer: sig.Signer, Sig: sig.Sig, Proof: audit.CompactProof(sig.Proof)}

	c := newAnswerCache(time.Minute, 1<<20)
	c.put("t.k", rec)
	got, ok := c.get("t.k")
	require.True(t, ok)
	require.Empty(t, string(got.Receipt), "the receipt is not kept")
	require.Equal(t, string(receipt), string(got.Answer(dedup.Caller{Key: "t.k", Fingerprint: "fp"}, true).Receipt), "a hit rebuilds it")

	whole := rec
	whole.Signature = nil
	whole.Receipt = json.RawMessage(`{"pad":"` + strings.Repeat("x", 4000) + `"}`)
	c.put("whole", whole)
	got, ok = c.get("whole")
	require.True(t, ok)
	require.Equal(t, string(whole.Receipt), string(got.Receipt), "kept whole without a signature")
	require.Greater(t, c.bytes, len(whole.Receipt), "and counted")
}

// A duplicate that reaches the worker soon after the operation finished is
// answered from the worker's memory, without reading the ledger: even a
// record deleted from the ledger meanwhile answers it (the documented bound
// of the cache). With the cache off, the same duplicate finds the key free
// and the operation runs again.
func TestDuplicateAnsweredFromTheCache(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cache time.Duration
		fired int32
	}{{"on", 0, 1}, {"off", NoAnswerCache, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			b := start(t, Config{AnswerCache: tc.cache}, &effects.Tool{Name: "send",
				Effect: effects.EffectFunc(func(ctx context.Context, c effects.Call) (effects.Outcome, error) {
					calls.Add(1)
					return effects.Outcome{Result: json.RawMessage(`"sent"`), Invocations: 1}, nil
				})})
			nc := natstest.Connect(t, b.url)
			first := sendRaw(t, nc, "send", `{"to":"a"}`)
			require.Equal(t, intent.StatusCompleted, first.Status)
			require.False(t, first.Replayed)

			js, err := jetstream.New(nc)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			kv, err := js.KeyValue(ctx, "IDEM_LEDGER")
			require.NoError(t, err)
			stored, err := intent.LedgerKey(first.Key, b.worker.store.Layout())
			require.NoError(t, err)
			require.NoError(t, kv.Delete(ctx, stored))

			again := sendRaw(t, nc, "send", `{"to":"a"}`)
			require.Equal(t, intent.StatusCompleted, again.Status)
			require.Equal(t, tc.fired, calls.Load())
			require.Equal(t, tc.fired == 1, again.Replayed)
			var hits dto.Metric
			require.NoError(t, b.worker.m.cacheHits.WithLabelValues("send").Write(&hits))
			require.Equal(t, float64(2-tc.fired), hits.GetCounter().GetValue(), "answered from the cache")
		})
	}
}

// sendRaw publishes an intent without Nats-Msg-Id, so that a repeat reaches
// the worker rather than the stream's publish dedup, and returns its answer.
func sendRaw(t *testing.T, nc *nats.Conn, tool, args string) intent.Result {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m := nats.NewMsg("idem.intents." + tool)
	m.Data = []byte(`{"tool":"` + tool + `","args":` + args + `}`)
	m.Header.Set(intent.HeaderReplyTo, inbox)
	_, err = js.PublishMsg(ctx, m)
	require.NoError(t, err)
	reply, err := sub.NextMsg(15 * time.Second)
	require.NoError(t, err)
	var res intent.Result
	require.NoError(t, json.Unmarshal(reply.Data, &res))
	return res
}

// A record of a tool whose retention is shorter than the cache's age limit
// leaves the cache when its record leaves the ledger.
func TestAnswerCacheNeverOutlivesTheRecord(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newAnswerCache(time.Minute, 1<<20)
	c.now = func() time.Time { return now }
	c.put("short", dedup.Record{Status: intent.StatusCompleted, UpdatedAt: now.Add(-time.Second), RetentionSeconds: 5})
	c.put("default", dedup.Record{Status: intent.StatusCompleted, UpdatedAt: now.Add(-time.Second)})
	now = now.Add(4 * time.Second)
	_, ok := c.get("short")
	require.False(t, ok, "its record expired at updated_at + 5s")
	_, ok = c.get("default")
	require.True(t, ok, "kept for the cache's age")
}

// BenchmarkAnswerCachePut puts final records under derived keys into a full
// cache: each put adds an entry and evicts one.
func BenchmarkAnswerCachePut(b *testing.B) {
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("t.%x", sha256.Sum256(fmt.Appendf(nil, "%d", i)))
	}
	_, ok := compactStored(keys[0])
	require.True(b, ok, "a derived key")
	rec := dedup.Record{Status: intent.StatusCompleted, Result: json.RawMessage(`1`)}
	c := newAnswerCache(time.Minute, 1024*600) // about a thousand entries
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.put(keys[i%len(keys)], rec)
	}
}
