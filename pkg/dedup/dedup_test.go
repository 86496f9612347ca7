package dedup_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// backend is a JetStream deployment the ledger suite runs against.
type backend struct {
	name     string
	replicas int
	start    func(t *testing.T) []*server.Server
}

var backends = []backend{
	{"R1", 1, func(t *testing.T) []*server.Server { return []*server.Server{natstest.RunServer(t)} }},
	{"R3", 3, func(t *testing.T) []*server.Server { return natstest.RunCluster(t, 3) }},
}

// mode is how the suite's ledgers write: each write on its own, or
// group-committed in atomic batches.
type mode struct {
	name    string
	bucket  string
	atomic  bool // the bucket allows atomic publish
	opts    []dedup.Option
	batched bool
	// partitions is the ledger's partition count; 0 for one bucket.
	partitions int
	// layout is the ledger's key layout; 0 for a new ledger's default
	// (compact keys).
	layout int
	// r1Only runs the mode on the single server only.
	r1Only bool
}

// suiteAckWait is the suite's batch acknowledgement wait: long, since a
// batch acknowledged late on a loaded machine would otherwise be settled by
// a read, which is not what most of the suite tests (lostack_test.go tests
// the default's).
const suiteAckWait = 30 * time.Second

var modes = []mode{
	{name: "Unbatched", bucket: "LEDGER_TEST"},
	// Min 1: even a lone write goes out as an atomic batch, so that every
	// suite test runs the batch protocol.
	{name: "Batched", bucket: "LEDGER_BATCH", atomic: true, batched: true,
		opts: []dedup.Option{dedup.WithBatching(dedup.BatchConfig{Min: 1, AckWait: suiteAckWait})}},
	// Four partitions, each with its own group commit: every operation
	// must reach its key's partition.
	{name: "Partitioned", bucket: "LEDGER_PARTS", atomic: true, batched: true, partitions: 4,
		opts: []dedup.Option{dedup.WithBatching(dedup.BatchConfig{Min: 1, AckWait: suiteAckWait})}},
	// Keys stored as they are (layout 1, a ledger made before compact
	// keys), partitioned and batched so that every path that builds a KV
	// subject runs; on one server, to keep the suite short.
	{name: "FullKeys", bucket: "LEDGER_FULL", atomic: true, batched: true, partitions: 2, layout: intent.LayoutFull, r1Only: true,
		opts: []dedup.Option{dedup.WithBatching(dedup.BatchConfig{Min: 1, AckWait: suiteAckWait})}},
}

// TestLedger runs the ledger suite on a single server (R1 bucket) and on a
// 3-node cluster (R3 bucket), each with ledgers that write one write at a
// time and with ledgers that group-commit. Each backend's servers are shared
// by its subtests, each mode's bucket by its subtests, which use distinct
// keys.
func TestLedger(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			servers := b.start(t)
			for _, m := range modes {
				if m.r1Only && b.replicas > 1 {
					continue
				}
				t.Run(m.name, func(t *testing.T) {
					t.Parallel()
					env := newEnv(t, servers, b.replicas, m)
					for _, tc := range suite {
						t.Run(tc.name, func(t *testing.T) {
							t.Parallel()
							tc.run(t, env.setup(t))
						})
					}
				})
			}
		})
	}
}

// env is one backend and mode with its ledger bucket, shared by a suite run.
type env struct {
	servers []*server.Server
	mode    mode
}

func newEnv(t *testing.T, servers []*server.Server, replicas int, m mode) *env {
	js := jetStream(t, servers[0].ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kvs, layout, err := dedup.EnsurePartitions(ctx, js, dedup.BucketConfig{Bucket: m.bucket, Replicas: replicas, AtomicPublish: m.atomic,
		Partitions: m.partitions, Layout: m.layout})
	require.NoError(t, err)
	require.Len(t, kvs, max(1, m.partitions))
	if m.layout == 0 {
		m.layout = intent.DefaultLayout
	}
	require.Equal(t, m.layout, layout)
	return &env{servers: servers, mode: m}
}

// testBundle is what a suite test works with.
type testBundle struct {
	ctx context.Context
	// key is the test's key, a derived key (<tool>.<64 hex>), so that a
	// compact layout stores it compacted; sub gives the test more.
	key string
	sub func(name string) string
	// ledgers are ledgers over the same bucket on distinct connections,
	// spread over the backend's servers (followers included on R3).
	ledgers []*dedup.Ledger
	// ledger is ledgers[0].
	ledger *dedup.Ledger
	// kvFor is the bucket holding a key (its partition's), for what an
	// operator (or the TTL) does to it; stored is the key's KV key there.
	kvFor  func(key string) jetstream.KeyValue
	stored func(key string) string
	// at returns a ledger (on its own connection) whose clock is offset by d,
	// to judge leases as if d had passed.
	at func(d time.Duration, opts ...dedup.Option) *dedup.Ledger
	// clocked returns a ledger (on its own connection) on the clock now.
	clocked func(now func() time.Time) *dedup.Ledger
	// retaining returns a ledger (on its own connection) that keeps final
	// records for ttl.
	retaining func(ttl time.Duration) *dedup.Ledger
	// batched reports that the ledgers group-commit their writes.
	batched bool
	// plain is a ledger that writes one write at a time whatever the mode,
	// to set a scene quickly.
	plain *dedup.Ledger
	// plainAt is at for plain ledgers.
	plainAt func(d time.Duration) *dedup.Ledger
}

func (e *env) setup(t *testing.T) *testBundle {
	t.Helper()
	// The suite's servers share the machine's cores with every other
	// package's tests: a request may take long, and no step of the suite
	// asserts how long. The test's own context (the test binary's
	// -timeout) bounds it.
	ctx := t.Context()
	openWith := func(i int, cfg dedup.BucketConfig, opts ...dedup.Option) *dedup.Ledger {
		js, err := jetstream.New(natstest.Connect(t, e.servers[i%len(e.servers)].ClientURL()), jetstream.WithDefaultTimeout(time.Minute))
		require.NoError(t, err)
		cfg.Bucket = e.mode.bucket
		l, err := dedup.Open(ctx, js, cfg, append(opts, dedup.Bind())...)
		require.NoError(t, err)
		require.Equal(t, max(1, e.mode.partitions), l.Partitions())
		require.Equal(t, e.mode.layout, l.Layout())
		t.Cleanup(l.Close)
		return l
	}
	openPlain := func(i int, opts ...dedup.Option) *dedup.Ledger {
		return openWith(i, dedup.BucketConfig{}, opts...)
	}
	open := func(i int, opts ...dedup.Option) *dedup.Ledger {
		return openPlain(i, append(opts, e.mode.opts...)...)
	}
	b := &testBundle{ctx: ctx, key: keyFor(t), sub: func(name string) string { return keyFor(t, name) }, batched: e.mode.batched}
	for i := range 4 {
		b.ledgers = append(b.ledgers, open(i))
	}
	b.ledger = b.ledgers[0]
	opjs := jetStream(t, e.servers[0].ClientURL())
	b.kvFor = func(key string) jetstream.KeyValue {
		kv, err := opjs.KeyValue(ctx, dedup.PartitionBucket(e.mode.bucket, intent.Partition(key, max(1, e.mode.partitions))))
		require.NoError(t, err)
		return kv
	}
	b.stored = func(key string) string {
		sk, err := intent.LedgerKey(key, e.mode.layout)
		require.NoError(t, err)
		return sk
	}
	n := 0
	b.at = func(d time.Duration, opts ...dedup.Option) *dedup.Ledger {
		n++
		return open(n, append(opts, dedup.WithClock(func() time.Time { return time.Now().Add(d) }))...)
	}
	b.clocked = func(now func() time.Time) *dedup.Ledger {
		n++
		return open(n, dedup.WithClock(now))
	}
	b.retaining = func(ttl time.Duration) *dedup.Ledger {
		n++
		return openWith(n, dedup.BucketConfig{TTL: ttl}, e.mode.opts...)
	}
	b.plain = openPlain(1)
	b.plainAt = func(d time.Duration) *dedup.Ledger {
		n++
		return openPlain(n, dedup.WithClock(func() time.Time { return time.Now().Add(d) }))
	}
	return b
}

func jetStream(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, url))
	require.NoError(t, err)
	return js
}

// keyFor derives a distinct derived key (<tool>.<64 hex>) from the test's
// name and the given names.
func keyFor(t *testing.T, names ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(append([]string{t.Name()}, names...), "/")))
	return "test." + hex.EncodeToString(sum[:])
}

// req is a claim request for b.key with fingerprint "fp-1".
func (b *testBundle) req(holder string) dedup.ClaimRequest {
	return dedup.ClaimRequest{
		Key:         b.key,
		Tool:        "send_email",
		Fingerprint: "fp-1",
		Holder:      holder,
		Lease:       time.Minute,
		IntentSeq:   7,
		CallID:      "call-1",
	}
}

// acquire claims b.key as holder and requires Acquired.
func (b *testBundle) acquire(t *testing.T, holder string) *dedup.Lease {
	t.Helper()
	res, err := b.ledger.Claim(b.ctx, b.req(holder))
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, res.Outcome)
	require.NotNil(t, res.Lease)
	return res.Lease
}

// waitResult is what a Wait running in a goroutine returned.
type waitResult struct {
	rec Record
	rev uint64
	err error
}

// Record is dedup.Record, for brevity.
type Record = dedup.Record

// waitAsync runs Wait on key in a goroutine; the result arrives on the channel.
func (b *testBundle) waitAsync(ctx context.Context, l *dedup.Ledger) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		rec, rev, err := l.Wait(ctx, b.key)
		ch <- waitResult{rec, rev, err}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan waitResult) waitResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return")
		return waitResult{}
	}
}

var suite = []struct {
	name string
	run  func(t *testing.T, b *testBundle)
}{
	{"ClaimOnce", func(t *testing.T, b *testBundle) {
		before := time.Now()
		ls := b.acquire(t, "w1")
		rec := ls.Record()
		require.Equal(t, intent.StatusPending, rec.Status)
		require.Equal(t, "w1", rec.Holder)
		require.Equal(t, "send_email", rec.Tool)
		require.Equal(t, "fp-1", rec.Fingerprint)
		require.Equal(t, 1, rec.Attempt)
		require.Equal(t, uint64(7), rec.IntentSeq)
		require.Equal(t, "call-1", rec.CallID)
		require.WithinRange(t, rec.LeaseUntil, before.Add(time.Minute), time.Now().Add(time.Minute))
		require.False(t, rec.LeaseExpired(time.Now()))

		got, rev, err := b.ledgers[1].Get(b.ctx, b.key)
		require.NoError(t, err)
		require.Equal(t, ls.Revision(), rev)
		require.Equal(t, "w1", got.Holder)

		res, err := b.ledgers[2].Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Busy, res.Outcome)
		require.Nil(t, res.Lease)
		require.Equal(t, "w1", res.Record.Holder)
		require.Equal(t, ls.Revision(), res.Revision)
	}},
	{"ConcurrentClaimsOneWinner", func(t *testing.T, b *testBundle) {
		const n = 20
		outcomes := make([]dedup.Outcome, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				res, err := b.ledgers[i%len(b.ledgers)].Claim(b.ctx, b.req(fmt.Sprintf("w%d", i)))
				outcomes[i], errs[i] = res.Outcome, err
			})
		}
		close(start)
		wg.Wait()
		count := map[dedup.Outcome]int{}
		for i := range n {
			require.NoError(t, errs[i])
			count[outcomes[i]]++
		}
		require.Equal(t, map[dedup.Outcome]int{dedup.Acquired: 1, dedup.Busy: n - 1}, count)
	}},
	{"CompleteThenClaimIsDone", func(t *testing.T, b *testBundle) {
		ls := b.acquire(t, "w1")
		rec, err := ls.Complete(b.ctx, json.RawMessage(`{"id":42}`), 2)
		require.NoError(t, err)
		require.Equal(t, intent.StatusCompleted, rec.Status)
		require.False(t, rec.CompletedAt.IsZero())
		require.True(t, rec.LeaseUntil.IsZero())

		res, err := b.ledgers[1].Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Done, res.Outcome)
		require.Nil(t, res.Lease)
		require.Equal(t, intent.StatusCompleted, res.Record.Status)
		require.JSONEq(t, `{"id":42}`, string(res.Record.Result))
		require.Equal(t, 2, res.Record.Attempts)
		require.Equal(t, ls.Revision(), res.Revision)
	}},
	{"OtherFingerprintIsConflict", func(t *testing.T, b *testBundle) {
		ls := b.acquire(t, "w1")
		other := b.req("w2")
		other.Fingerprint = "fp-2"

		res, err := b.ledgers[1].Claim(b.ctx, other)
		require.NoError(t, err)
		require.Equal(t, dedup.Conflict, res.Outcome, "conflict while pending")
		require.Equal(t, "fp-1", res.Record.Fingerprint)

		_, err = ls.Complete(b.ctx, json.RawMessage(`true`), 1)
		require.NoError(t, err)
		res, err = b.at(time.Hour).Claim(b.ctx, other)
		require.NoError(t, err)
		require.Equal(t, dedup.Conflict, res.Outcome, "conflict once completed")
		require.Nil(t, res.Lease)
	}},
	{"FailThenClaimIsDone", func(t *testing.T, b *testBundle) {
		ls := b.acquire(t, "w1")
		_, err := ls.Fail(b.ctx, intent.Error{Code: intent.CodeEffectFailed, Message: "mailbox unavailable"}, 3)
		require.NoError(t, err)

		res, err := b.ledgers[1].Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Done, res.Outcome)
		require.Equal(t, intent.StatusFailed, res.Record.Status)
		require.Equal(t, &intent.Error{Code: intent.CodeEffectFailed, Message: "mailbox unavailable"}, res.Record.Error)
		require.Equal(t, 3, res.Record.Attempts)
	}},
	{"ReleaseThenClaimIsAcquired", func(t *testing.T, b *testBundle) {
		ls := b.acquire(t, "w1")
		require.NoError(t, ls.Release(b.ctx, 2))
		rec, _, err := b.ledger.Get(b.ctx, b.key)
		require.NoError(t, err)
		require.True(t, rec.Released())
		require.Equal(t, 2, rec.Attempts)

		res, err := b.ledgers[1].Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome, "a released key is acquired, not taken over")
		require.Equal(t, "w2", res.Record.Holder)
		require.Equal(t, 2, res.Record.Attempt)
		require.Equal(t, 2, res.Record.Attempts, "invocations survive the release")
		require.Greater(t, res.Revision, ls.Revision())
		require.ErrorIs(t, ls.Release(b.ctx, 2), dedup.ErrLeaseDone)
	}},
	{"DeletedKeyIsAcquiredAfresh", func(t *testing.T, b *testBundle) {
		b.acquire(t, "w1")
		require.NoError(t, b.kvFor(b.key).Delete(b.ctx, b.stored(b.key)))
		res, err := b.ledgers[1].Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)
		require.Equal(t, 1, res.Record.Attempt)
	}},
	{"ReadFirstSameOutcomes", func(t *testing.T, b *testBundle) {
		readFirst := func(holder, fp string) dedup.ClaimRequest {
			r := b.req(holder)
			r.Fingerprint, r.ReadFirst = fp, true
			return r
		}
		// No record yet: read, then create.
		res, err := b.ledger.Claim(b.ctx, readFirst("w1", "fp-1"))
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)
		res2, err := b.ledgers[1].Claim(b.ctx, readFirst("w2", "fp-1"))
		require.NoError(t, err)
		require.Equal(t, dedup.Busy, res2.Outcome)
		require.Equal(t, res.Revision, res2.Revision)
		_, err = res.Lease.Complete(b.ctx, json.RawMessage(`{"ok":true}`), 1)
		require.NoError(t, err)
		res, err = b.ledgers[2].Claim(b.ctx, readFirst("w3", "fp-1"))
		require.NoError(t, err)
		require.Equal(t, dedup.Done, res.Outcome)
		require.JSONEq(t, `{"ok":true}`, string(res.Record.Result))
		res, err = b.ledgers[1].Claim(b.ctx, readFirst("w3", "fp-2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Conflict, res.Outcome)
		// Over a delete marker: a fresh record, by compare-and-set.
		require.NoError(t, b.kvFor(b.key).Delete(b.ctx, b.stored(b.key)))
		res, err = b.ledger.Claim(b.ctx, readFirst("w4", "fp-1"))
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)
		require.Equal(t, 1, res.Record.Attempt)
	}},
	{"ExpiredLeaseOneTakerWins", func(t *testing.T, b *testBundle) {
		old := b.acquire(t, "w0")
		const n = 10
		takers := make([]*dedup.Ledger, n)
		for i := range takers {
			takers[i] = b.at(2 * time.Minute) // past the one-minute lease
		}
		results := make([]dedup.ClaimResult, n)
		errs := make([]error, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				results[i], errs[i] = takers[i].Claim(b.ctx, b.req(fmt.Sprintf("w%d", i+1)))
			})
		}
		close(start)
		wg.Wait()
		var winner dedup.ClaimResult
		count := map[dedup.Outcome]int{}
		for i := range n {
			require.NoError(t, errs[i])
			count[results[i].Outcome]++
			if results[i].Outcome == dedup.TookOver {
				winner = results[i]
			}
		}
		require.Equal(t, map[dedup.Outcome]int{dedup.TookOver: 1, dedup.Busy: n - 1}, count)
		require.Equal(t, 2, winner.Record.Attempt)
		require.NotEqual(t, "w0", winner.Record.Holder)
		require.Equal(t, old.Record().CreatedAt, winner.Record.CreatedAt)
		for _, r := range results {
			if r.Outcome == dedup.Busy {
				require.Equal(t, winner.Record.Holder, r.Record.Holder, "losers see the winner")
			}
		}
	}},
	{"ConfirmedTakeover", func(t *testing.T, b *testBundle) {
		old := b.acquire(t, "w0")
		later := b.at(2*time.Minute, dedup.WithConfirmedTakeover())
		res, err := later.Claim(b.ctx, b.req("w1"))
		require.NoError(t, err)
		require.Equal(t, dedup.Busy, res.Outcome, "expired, not yet confirmed")
		require.True(t, res.Record.LeaseExpired(time.Now().Add(2*time.Minute)))

		// The holder was only cut off: it extends within the grace.
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		defer cancel()
		changed := make(chan bool, 1)
		go func() {
			ok, err := later.WaitChange(ctx, b.key, res.Revision)
			assert.NoError(t, err)
			changed <- ok
		}()
		require.NoError(t, old.Extend(b.ctx, 10*time.Minute))
		require.True(t, <-changed, "the extension is seen")
		req := b.req("w1")
		req.Confirmed = res.Revision // stale: the record moved on
		again, err := later.Claim(b.ctx, req)
		require.NoError(t, err)
		require.Equal(t, dedup.Busy, again.Outcome, "a live lease is never taken over")

		// Gone for good: unchanged for the grace, then taken over at that revision.
		gone := b.at(20*time.Minute, dedup.WithConfirmedTakeover())
		res, err = gone.Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Busy, res.Outcome)
		gctx, gcancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
		defer gcancel()
		moved, err := gone.WaitChange(gctx, b.key, res.Revision)
		require.NoError(t, err)
		require.False(t, moved)
		req = b.req("w2")
		req.Confirmed = res.Revision
		took, err := gone.Claim(b.ctx, req)
		require.NoError(t, err)
		require.Equal(t, dedup.TookOver, took.Outcome)
		_, err = old.Complete(b.ctx, json.RawMessage(`"late"`), 1)
		require.ErrorIs(t, err, dedup.ErrLeaseLost)
	}},
	{"LateAcknowledgedClaimIsLive", func(t *testing.T, b *testBundle) {
		// The holder's claim is acknowledged two leases after it was sent
		// (a lost acknowledgement settled by a read, a slow commit): its
		// clock jumps between the write and the return. Meanwhile another
		// claimant saw the record expired and unchanged for the grace.
		var reads atomic.Int32
		holder := b.clocked(func() time.Time {
			if reads.Add(1) == 1 {
				return time.Now()
			}
			return time.Now().Add(2 * time.Minute)
		})
		res, err := holder.Claim(b.ctx, b.req("w0"))
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)
		require.False(t, res.Record.LeaseExpired(time.Now().Add(2*time.Minute)), "the lease is live when Claim returns")

		hist, err := b.kvFor(b.key).History(b.ctx, b.stored(b.key))
		require.NoError(t, err)
		req := b.req("w1")
		req.Confirmed = hist[0].Revision() // the claim's own write, confirmed abandoned
		taker := b.at(2*time.Minute, dedup.WithConfirmedTakeover())
		took, err := taker.Claim(b.ctx, req)
		require.NoError(t, err)
		require.Equal(t, dedup.Busy, took.Outcome, "the holder fires at once: nobody may take its lease over")
		require.False(t, took.Record.LeaseExpired(time.Now().Add(2*time.Minute)))
		_, err = res.Lease.Complete(b.ctx, json.RawMessage(`"once"`), 1)
		require.NoError(t, err)
	}},
	{"StaleHolderCannotOverwrite", func(t *testing.T, b *testBundle) {
		old := b.acquire(t, "w1")
		res, err := b.at(2*time.Minute).Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.TookOver, res.Outcome)

		_, err = old.Complete(b.ctx, json.RawMessage(`"stale"`), 1)
		require.ErrorIs(t, err, dedup.ErrLeaseLost)
		require.EqualError(t, dedup.ErrLeaseLost, "dedup: lease lost")
		require.ErrorIs(t, old.Extend(b.ctx, time.Hour), dedup.ErrLeaseLost)
		_, err = old.Fail(b.ctx, intent.Error{Code: intent.CodeEffectFailed}, 1)
		require.ErrorIs(t, err, dedup.ErrLeaseLost)
		require.ErrorIs(t, old.Release(b.ctx, 1), dedup.ErrLeaseLost)

		got, rev, err := b.ledger.Get(b.ctx, b.key)
		require.NoError(t, err)
		require.Equal(t, res.Revision, rev, "new holder's record intact")
		require.Equal(t, intent.StatusPending, got.Status)
		require.Equal(t, "w2", got.Holder)

		rec, err := res.Lease.Complete(b.ctx, json.RawMessage(`"fresh"`), 1)
		require.NoError(t, err)
		require.Equal(t, json.RawMessage(`"fresh"`), rec.Result)
	}},
	{"ExtendKeepsLeaseAlive", func(t *testing.T, b *testBundle) {
		ls := b.acquire(t, "w1") // lease: one minute
		rev := ls.Revision()
		require.NoError(t, ls.Extend(b.ctx, 10*time.Minute))
		require.Greater(t, ls.Revision(), rev)

		res, err := b.at(2*time.Minute).Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Busy, res.Outcome, "alive past the original deadline")

		res, err = b.at(11*time.Minute).Claim(b.ctx, b.req("w3"))
		require.NoError(t, err)
		require.Equal(t, dedup.TookOver, res.Outcome, "expired past the extended deadline")
	}},
	{"LeaseIsDoneAfterComplete", func(t *testing.T, b *testBundle) {
		ls := b.acquire(t, "w1")
		_, err := ls.Complete(b.ctx, nil, 1)
		require.NoError(t, err)
		require.ErrorIs(t, ls.Extend(b.ctx, time.Minute), dedup.ErrLeaseDone)
		_, err = ls.Complete(b.ctx, nil, 1)
		require.ErrorIs(t, err, dedup.ErrLeaseDone)
		require.ErrorIs(t, ls.Release(b.ctx, 1), dedup.ErrLeaseDone)
		require.ErrorIs(t, ls.Extend(b.ctx, 0), dedup.ErrInvalid)
	}},
	{"WaitReturnsCompleted", func(t *testing.T, b *testBundle) {
		ls := b.acquire(t, "w1")
		ch := b.waitAsync(b.ctx, b.ledgers[2])
		select {
		case r := <-ch:
			t.Fatalf("Wait returned before Complete: %+v", r)
		default:
		}
		_, err := ls.Complete(b.ctx, json.RawMessage(`{"ok":true}`), 1)
		require.NoError(t, err)
		r := receive(t, ch)
		require.NoError(t, r.err)
		require.Equal(t, intent.StatusCompleted, r.rec.Status)
		require.JSONEq(t, `{"ok":true}`, string(r.rec.Result))
		require.Equal(t, ls.Revision(), r.rev)
	}},
	{"WaitBeforeClaim", func(t *testing.T, b *testBundle) {
		ch := b.waitAsync(b.ctx, b.ledgers[1])
		ls := b.acquire(t, "w1")
		_, err := ls.Fail(b.ctx, intent.Error{Code: intent.CodeEffectFailed, Message: "no"}, 1)
		require.NoError(t, err)
		r := receive(t, ch)
		require.NoError(t, r.err)
		require.Equal(t, intent.StatusFailed, r.rec.Status)
	}},
	{"WaitReturnsReleased", func(t *testing.T, b *testBundle) {
		ls := b.acquire(t, "w1")
		ch := b.waitAsync(b.ctx, b.ledgers[1])
		require.NoError(t, ls.Release(b.ctx, 1))
		r := receive(t, ch)
		require.NoError(t, r.err)
		require.True(t, r.rec.Released(), "the waiter sees the release and may claim")

		_, _, err := b.ledgers[2].Wait(b.ctx, b.key)
		require.NoError(t, err, "an already released record ends the wait at once")
	}},
	{"WaitReturnsDeleted", func(t *testing.T, b *testBundle) {
		b.acquire(t, "w1")
		ch := b.waitAsync(b.ctx, b.ledgers[1])
		require.NoError(t, b.kvFor(b.key).Delete(b.ctx, b.stored(b.key)))
		r := receive(t, ch)
		require.ErrorIs(t, r.err, dedup.ErrReleased)

		_, _, err := b.ledgers[2].Wait(b.ctx, b.key)
		require.ErrorIs(t, err, dedup.ErrReleased, "latest entry already a delete marker")
	}},
	{"WaitReturnsOnLeaseExpiry", func(t *testing.T, b *testBundle) {
		req := b.req("w1")
		req.Lease = 300 * time.Millisecond
		res, err := b.ledger.Claim(b.ctx, req)
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)

		rec, rev, err := b.ledgers[1].Wait(b.ctx, b.key)
		require.NoError(t, err)
		require.Equal(t, res.Revision, rev)
		require.Equal(t, intent.StatusPending, rec.Status)
		require.True(t, rec.LeaseExpired(time.Now()))

		took, err := b.ledgers[1].Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.TookOver, took.Outcome)
	}},
	{"WaitHonoursContext", func(t *testing.T, b *testBundle) {
		b.acquire(t, "w1")
		ctx, cancel := context.WithTimeout(b.ctx, 100*time.Millisecond)
		defer cancel()
		_, _, err := b.ledgers[1].Wait(ctx, b.key)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}},
	{"BackToBackWrites", func(t *testing.T, b *testBundle) {
		// A replicated stream may refuse a compare-and-set on a key whose
		// previous write was just acknowledged; that must not look like a
		// lost lease.
		cycles := 50
		if b.batched {
			cycles = 25 // each write is a batch of its own, with its fixed cost
		}
		for i := range cycles {
			res, err := b.ledger.Claim(b.ctx, b.req("w1"))
			require.NoError(t, err, "cycle %d", i)
			require.Equal(t, dedup.Acquired, res.Outcome, "cycle %d", i)
			require.NoError(t, res.Lease.Extend(b.ctx, time.Minute), "cycle %d", i)
			require.NoError(t, res.Lease.Release(b.ctx, 0), "cycle %d", i)
		}
	}},
	{"GetMissingIsNotFound", func(t *testing.T, b *testBundle) {
		_, _, err := b.ledger.Get(b.ctx, b.key)
		require.ErrorIs(t, err, dedup.ErrNotFound)
	}},
	{"ApprovalFiresOnce", func(t *testing.T, b *testBundle) {
		ls := b.acquire(t, "w1")
		ch := b.waitAsync(b.ctx, b.ledgers[1])
		parked, err := ls.AwaitApproval(b.ctx, json.RawMessage(`{"tool":"send_email","args":{}}`))
		require.NoError(t, err)
		require.Equal(t, intent.StatusAwaitingApproval, parked.Status)
		r := receive(t, ch)
		require.NoError(t, r.err)
		require.Equal(t, intent.StatusAwaitingApproval, r.rec.Status, "waiters are answered awaiting_approval")

		dup, err := b.ledgers[2].Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Done, dup.Outcome, "a duplicate is answered, not fired")

		_, _, err = b.ledger.Approve(b.ctx, b.key, "fp-other", "ops", "", time.Hour)
		require.ErrorIs(t, err, dedup.ErrFingerprintMismatch)
		// Two approvals racing: both succeed, one write.
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rec, _, err := b.ledgers[i].Approve(b.ctx, b.key, "fp-1", "ops", "ok", time.Hour)
				assert.NoError(t, err)
				assert.Equal(t, intent.StatusApproved, rec.Status)
			}()
		}
		wg.Wait()
		// Several workers claim the approved key: exactly one may fire.
		results := make([]dedup.ClaimResult, 4)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := b.ledgers[i].Claim(b.ctx, b.req(fmt.Sprintf("w%d", i)))
				assert.NoError(t, err)
				results[i] = res
			}()
		}
		wg.Wait()
		winners := 0
		for _, res := range results {
			if res.Outcome == dedup.Acquired {
				winners++
				require.True(t, res.Record.Approved(time.Now()), "the approval travels with the lease")
				require.JSONEq(t, `{"tool":"send_email","args":{}}`, string(res.Record.Intent))
			} else {
				require.Equal(t, dedup.Busy, res.Outcome)
			}
		}
		require.Equal(t, 1, winners)
		_, _, err = b.ledger.Deny(b.ctx, b.key, "ops", "too late")
		require.ErrorIs(t, err, dedup.ErrWrongState, "a firing operation cannot be denied")
	}},
	{"DenyAnswersDenied", func(t *testing.T, b *testBundle) {
		ls := b.acquire(t, "w1")
		_, err := ls.AwaitApproval(b.ctx, json.RawMessage(`{}`))
		require.NoError(t, err)
		rec, _, err := b.ledgers[1].Deny(b.ctx, b.key, "ops", "not this customer")
		require.NoError(t, err)
		require.Equal(t, intent.StatusDenied, rec.Status)
		require.Equal(t, &intent.Error{Code: intent.CodeDenied, Message: "denied by ops: not this customer"}, rec.Error)
		res, err := b.ledgers[2].Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Done, res.Outcome)
		_, _, err = b.ledger.Approve(b.ctx, b.key, "", "ops", "", time.Hour)
		require.ErrorIs(t, err, dedup.ErrWrongState)
		_, _, err = b.ledger.Deny(b.ctx, "no.such.key", "", "")
		require.ErrorIs(t, err, dedup.ErrNotFound)
	}},
	{"HoldThenResolve", func(t *testing.T, b *testBundle) {
		b.acquire(t, "w0")
		took, err := b.at(2*time.Minute).Claim(b.ctx, b.req("w1"))
		require.NoError(t, err)
		require.Equal(t, dedup.TookOver, took.Outcome)
		held, err := took.Lease.Hold(b.ctx, "holder w0 vanished mid-effect")
		require.NoError(t, err)
		require.Equal(t, intent.StatusUncertain, held.Status)
		require.Equal(t, 1, held.Attempts, "the vanished holder's attempt may have reached the effect")
		require.Equal(t, "w0", took.Previous.Holder, "the takeover names the holder that vanished")
		res, err := b.ledgers[1].Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Done, res.Outcome, "uncertain is answered, never fired again on its own")

		ch := b.waitAsync(b.ctx, b.ledgers[2])
		require.Equal(t, intent.StatusUncertain, receive(t, ch).rec.Status)
		_, _, err = b.ledger.Resolve(b.ctx, b.key, true, json.RawMessage(`{"x`), "ops", "")
		require.ErrorIs(t, err, dedup.ErrInvalid)
		rec, _, err := b.ledger.Resolve(b.ctx, b.key, true, json.RawMessage(`{"sent":true}`), "ops", "provider says delivered")
		require.NoError(t, err)
		require.Equal(t, intent.StatusCompleted, rec.Status)
		got, _, err := b.ledgers[3].Get(b.ctx, b.key)
		require.NoError(t, err)
		require.JSONEq(t, `{"sent":true}`, string(got.Result))
		require.Equal(t, "resolve", got.Decision.Op)
		_, _, err = b.ledger.Resolve(b.ctx, b.key, false, nil, "ops", "")
		require.ErrorIs(t, err, dedup.ErrWrongState, "only uncertain records are resolved")
	}},
	{"OnlyFinalRecordsExpire", func(t *testing.T, b *testBundle) {
		l := b.retaining(time.Second)
		claim := func(key string) *dedup.Lease {
			req := b.req("w1")
			req.Key = key
			res, err := l.Claim(b.ctx, req)
			require.NoError(t, err)
			require.Equal(t, dedup.Acquired, res.Outcome)
			return res.Lease
		}
		done, failed, denied, pending, parked := b.sub("done"), b.sub("failed"), b.sub("denied"), b.sub("pending"), b.sub("parked")
		_, err := claim(done).Complete(b.ctx, json.RawMessage(`1`), 1)
		require.NoError(t, err)
		_, err = claim(failed).Fail(b.ctx, intent.Error{Code: intent.CodeEffectFailed, Message: "no"}, 1)
		require.NoError(t, err)
		_, err = claim(denied).AwaitApproval(b.ctx, json.RawMessage(`{}`))
		require.NoError(t, err)
		_, _, err = l.Deny(b.ctx, denied, "ops", "")
		require.NoError(t, err)
		claim(pending)
		_, err = claim(parked).AwaitApproval(b.ctx, json.RawMessage(`{}`))
		require.NoError(t, err)
		for _, key := range []string{done, failed, denied} {
			require.Eventually(t, func() bool {
				_, _, err := b.ledger.Get(b.ctx, key)
				return errors.Is(err, dedup.ErrNotFound)
			}, 20*time.Second, 50*time.Millisecond, "a final record expires after the retention: %s", key)
		}
		for key, st := range map[string]intent.Status{pending: intent.StatusPending, parked: intent.StatusAwaitingApproval} {
			rec, _, err := b.ledger.Get(b.ctx, key)
			require.NoError(t, err, "an unresolved record never expires: %s", key)
			require.Equal(t, st, rec.Status)
		}
	}},
	{"RecordRetentionBeatsTheLedgers", func(t *testing.T, b *testBundle) {
		// The ledger keeps final records for a day; a tool's retention of
		// a second, stored on its record, expires its final records, and
		// leaves its unresolved ones alone.
		claim := func(key string, retention time.Duration) *dedup.Lease {
			req := b.req("w1")
			req.Key, req.Retention = key, retention
			res, err := b.ledger.Claim(b.ctx, req)
			require.NoError(t, err)
			require.Equal(t, dedup.Acquired, res.Outcome)
			return res.Lease
		}
		short, long, parked := b.sub("short"), b.sub("long"), b.sub("parked")
		rec, err := claim(short, time.Second).Complete(b.ctx, json.RawMessage(`1`), 1)
		require.NoError(t, err)
		require.EqualValues(t, 1, rec.RetentionSeconds, "stored on the record")
		_, err = claim(long, 0).Complete(b.ctx, json.RawMessage(`1`), 1)
		require.NoError(t, err)
		_, err = claim(parked, time.Second).AwaitApproval(b.ctx, json.RawMessage(`{}`))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			_, _, err := b.ledger.Get(b.ctx, short)
			return errors.Is(err, dedup.ErrNotFound)
		}, 20*time.Second, 50*time.Millisecond, "a final record expires after its own retention")
		for key, st := range map[string]intent.Status{long: intent.StatusCompleted, parked: intent.StatusAwaitingApproval} {
			rec, _, err := b.ledger.Get(b.ctx, key)
			require.NoError(t, err, "kept: %s", key)
			require.Equal(t, st, rec.Status)
		}
	}},
	{"BudgetCountsNewOperationsOnce", func(t *testing.T, b *testBundle) {
		// Mid-window on every claimant's clock, so that the test never
		// straddles two windows.
		now := time.Now().Truncate(time.Hour).Add(30 * time.Minute)
		clock := func() time.Time { return now }
		ledgers := []*dedup.Ledger{b.clocked(clock), b.clocked(clock), b.clocked(clock)}
		budget := &dedup.Budget{Scope: t.Name(), Max: 3, Window: time.Hour}
		claim := func(l *dedup.Ledger, key string, bud *dedup.Budget) dedup.ClaimResult {
			req := b.req("w")
			req.Key, req.Budget = key, bud
			res, err := l.Claim(b.ctx, req)
			require.NoError(t, err)
			return res
		}
		// Eight distinct operations at once over three claimants: exactly
		// three are counted and acquired, the others refused with nothing
		// written.
		keys := make([]string, 8)
		results := make([]dedup.ClaimResult, len(keys))
		var wg sync.WaitGroup
		for i := range keys {
			keys[i] = b.sub(fmt.Sprint("op", i))
			wg.Go(func() { results[i] = claim(ledgers[i%len(ledgers)], keys[i], budget) })
		}
		wg.Wait()
		var acquired []string
		for i, res := range results {
			switch res.Outcome {
			case dedup.Acquired:
				acquired = append(acquired, keys[i])
				require.False(t, res.OverBudget)
			case dedup.OverBudget:
				require.Equal(t, now.Truncate(time.Hour).Add(time.Hour), res.RetryAt.Local(), "the window's end")
				require.Nil(t, res.Lease)
				_, _, err := b.ledger.Get(b.ctx, keys[i])
				require.ErrorIs(t, err, dedup.ErrNotFound, "a refused operation leaves no record")
			default:
				t.Fatalf("claim %d: %s", i, res.Outcome)
			}
		}
		require.Len(t, acquired, 3, "a budget of 3")

		// A replay of a counted operation never spends: it finds the
		// record. Nor does its claim once its record is gone, within the
		// window: the count has it already.
		res := claim(ledgers[1], acquired[0], budget)
		require.Equal(t, dedup.Busy, res.Outcome, "held: a replay, not a refusal")
		require.NoError(t, b.kvFor(acquired[1]).Purge(b.ctx, b.stored(acquired[1])))
		require.Equal(t, dedup.Acquired, claim(ledgers[2], acquired[1], budget).Outcome, "counted once per window")
		// The count is not a record: no listing shows it.
		page, err := ledgers[0].List(b.ctx, dedup.Query{Limit: 1000})
		require.NoError(t, err)
		for _, r := range page.Records {
			require.NotContains(t, r.Key, "_budget.", "a count listed as a record")
		}

		// Another scope has its own count; a parking budget creates the
		// record, uncounted, and says so.
		other := *budget
		other.Scope += "/other"
		require.Equal(t, dedup.Acquired, claim(ledgers[0], b.sub("other"), &other).Outcome)
		parking := *budget
		parking.Park = true
		parked := claim(ledgers[0], b.sub("parked"), &parking)
		require.Equal(t, dedup.Acquired, parked.Outcome)
		require.True(t, parked.OverBudget, "over the budget: park it")
		require.Equal(t, dedup.OverBudget, claim(ledgers[1], b.sub("refused"), budget).Outcome, "parking counted nothing, and the window is still full")

		// An operation the budget never counted (its record was made
		// without one) is no new operation: a full window does not refuse
		// its replay.
		require.Equal(t, dedup.Acquired, claim(ledgers[0], b.sub("before"), nil).Outcome)
		require.Equal(t, dedup.Busy, claim(ledgers[1], b.sub("before"), budget).Outcome, "a replay, not a refusal")

		// The next window has a count of its own.
		later := func() time.Time { return now.Add(time.Hour) }
		require.Equal(t, dedup.Acquired, claim(b.clocked(later), b.sub("refused"), budget).Outcome)
	}},
	{"TransitionIsCAS", func(t *testing.T, b *testBundle) {
		ls := b.acquire(t, "w1")
		rec := ls.Record()
		rec.Status = intent.StatusUncertain
		rev, err := b.ledger.Transition(b.ctx, b.key, ls.Revision(), rec)
		require.NoError(t, err)
		require.Greater(t, rev, ls.Revision())

		_, err = b.ledger.Transition(b.ctx, b.key, ls.Revision(), rec)
		require.ErrorIs(t, err, dedup.ErrRevisionMismatch)
		_, err = ls.Complete(b.ctx, nil, 1)
		require.ErrorIs(t, err, dedup.ErrLeaseLost)

		res, err := b.ledgers[1].Claim(b.ctx, b.req("w2"))
		require.NoError(t, err)
		require.Equal(t, dedup.Done, res.Outcome, "uncertain is answered")
		require.Equal(t, intent.StatusUncertain, res.Record.Status)
	}},
}

func TestClaimRequestValidation(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{})
	require.NoError(t, err)
	require.Equal(t, []string{"IDEM_LEDGER"}, l.Buckets(), "the default bucket")

	valid := dedup.ClaimRequest{Key: "k", Fingerprint: "f", Holder: "h"}
	for name, mutate := range map[string]func(*dedup.ClaimRequest){
		"NoKey":         func(r *dedup.ClaimRequest) { r.Key = "" },
		"NoFingerprint": func(r *dedup.ClaimRequest) { r.Fingerprint = "" },
		"NoHolder":      func(r *dedup.ClaimRequest) { r.Holder = "" },
		"NegativeLease": func(r *dedup.ClaimRequest) { r.Lease = -time.Second },
		"NegRetention":  func(r *dedup.ClaimRequest) { r.Retention = -time.Second },
		"BudgetNoTool":  func(r *dedup.ClaimRequest) { r.Budget = &dedup.Budget{Max: 1, Window: time.Hour} },
		"BadBudget":     func(r *dedup.ClaimRequest) { r.Tool, r.Budget = "t", &dedup.Budget{Max: 0, Window: time.Hour} },
	} {
		r := valid
		mutate(&r)
		_, err := l.Claim(ctx, r)
		require.ErrorIs(t, err, dedup.ErrInvalid, name)
	}
	res, err := l.Claim(ctx, valid)
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, res.Outcome)
	require.WithinDuration(t, time.Now().Add(dedup.DefaultLease), res.Record.LeaseUntil, 5*time.Second)
}

func TestEnsureBucket(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for name, cfg := range map[string]dedup.BucketConfig{
		"BadName":       {Bucket: "a.b"},
		"TooManyCopies": {Replicas: 7},
		"NegativeTTL":   {TTL: -time.Hour},
		"BadStorage":    {Storage: jetstream.StorageType(9)},
	} {
		_, err := dedup.EnsureBucket(ctx, js, cfg)
		require.ErrorIs(t, err, dedup.ErrInvalid, name)
	}

	cfg := dedup.BucketConfig{Bucket: "L", TTL: time.Hour, Storage: jetstream.MemoryStorage}
	kv, err := dedup.EnsureBucket(ctx, js, cfg)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "k", []byte("v"))
	require.NoError(t, err)
	kv, err = dedup.EnsureBucket(ctx, js, cfg) // idempotent, keeps data
	require.NoError(t, err)
	e, err := kv.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(e.Value()))
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Zero(t, st.TTL(), "no age limit: only final records expire, by their own TTL")
	require.Equal(t, "L", st.Bucket())
	info, err := js.Stream(ctx, "KV_L")
	require.NoError(t, err)
	require.True(t, info.CachedInfo().Config.AllowMsgTTL, "per-message TTLs are allowed")
}

func TestOutcomeString(t *testing.T) {
	t.Parallel()
	for o, want := range map[dedup.Outcome]string{
		dedup.Acquired: "acquired", dedup.TookOver: "took_over", dedup.Done: "done",
		dedup.Busy: "busy", dedup.Conflict: "conflict", dedup.Outcome(0): "outcome(0)",
	} {
		require.Equal(t, want, o.String())
	}
}

func TestRecordLeaseExpired(t *testing.T) {
	t.Parallel()
	now := time.Now()
	pending := dedup.Record{Status: intent.StatusPending, LeaseUntil: now}
	require.True(t, pending.LeaseExpired(now))
	require.False(t, pending.LeaseExpired(now.Add(-time.Nanosecond)))
	done := dedup.Record{Status: intent.StatusCompleted}
	require.False(t, done.LeaseExpired(now))
}

// TestSentinels checks every sentinel's prefix and that wrapping keeps it matchable.
func TestSentinels(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		dedup.ErrNotFound, dedup.ErrLeaseLost, dedup.ErrLeaseDone, dedup.ErrRevisionMismatch,
		dedup.ErrReleased, dedup.ErrContended, dedup.ErrInvalid,
	} {
		require.True(t, strings.HasPrefix(err.Error(), "dedup: "), err.Error())
		require.True(t, errors.Is(fmt.Errorf("claim k: %w", err), err))
	}
}

// More waiters than the server's default of 1000 consumers per stream can
// wait on the ledger at once.
func TestManyWaitersAtOnce(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	// 1100 watches start at once: on a loaded machine a consumer create may
	// take longer than the default request timeout.
	js, err := jetstream.New(natstest.Connect(t, s.ClientURL()), jetstream.WithDefaultTimeout(time.Minute))
	require.NoError(t, err)
	// kv.Watch creates its consumer with the jetstream package's legacy
	// context, which ignores WithDefaultTimeout: the request gets the
	// deadline of ctx, the test's own, or else 5 s.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if d, ok := t.Deadline(); ok {
		var stop context.CancelFunc
		ctx, stop = context.WithDeadline(ctx, d)
		defer stop()
	}
	kv, err := dedup.EnsureBucket(ctx, js, dedup.BucketConfig{Bucket: "MANY"})
	require.NoError(t, err)
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "MANY"}, dedup.Bind())
	require.NoError(t, err)
	res, err := l.Claim(ctx, dedup.ClaimRequest{Key: "k", Tool: "t", Fingerprint: "f", Holder: "h", Lease: time.Minute})
	require.NoError(t, err)
	const n = 1100
	errs := make(chan error, n)
	started := make(chan struct{}, n)
	for range n {
		go func() {
			w, err := kv.Watch(ctx, "k") // what every Wait holds while it waits
			started <- struct{}{}
			if err == nil {
				defer func() { _ = w.Stop() }()
				<-ctx.Done()
			}
			errs <- err
		}()
	}
	for range n {
		<-started
	}
	_, err = res.Lease.Complete(ctx, json.RawMessage(`1`), 1)
	require.NoError(t, err)
	cancel()
	for range n {
		require.NoError(t, <-errs)
	}
}
