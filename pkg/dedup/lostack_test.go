package dedup_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// lostAckTimeout is the JetStream request timeout of the ledgers below: far
// longer than any wait the tests allow, so that a write waiting it out shows.
const lostAckTimeout = time.Minute

// proxied is a ledger whose connection runs through a proxy that can withhold
// or drop the server's replies, and a plain ledger on a direct connection to
// look at the bucket.
type proxied struct {
	proxy  *natstest.Proxy
	nc     *nats.Conn
	ledger *dedup.Ledger
	plain  *dedup.Ledger
	ctx    context.Context
}

func newProxied(t *testing.T, opts ...dedup.Option) *proxied {
	t.Helper()
	s := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*lostAckTimeout)
	t.Cleanup(cancel)
	direct := jetStream(t, s.ClientURL())
	cfg := dedup.BucketConfig{Bucket: "LOSTACK", AtomicPublish: true}
	_, err := dedup.EnsureBucket(ctx, direct, cfg)
	require.NoError(t, err)
	plain, err := dedup.Open(ctx, direct, cfg, dedup.Bind())
	require.NoError(t, err)

	p := natstest.NewProxy(t, s.Addr().String())
	nc := natstest.Connect(t, p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(lostAckTimeout))
	require.NoError(t, err)
	l, err := dedup.Open(ctx, js, cfg, append(opts, dedup.Bind())...)
	require.NoError(t, err)
	t.Cleanup(l.Close)
	return &proxied{proxy: p, nc: nc, ledger: l, plain: plain, ctx: ctx}
}

// cut drops the proxied connection, and what the proxy held, and returns once
// the client has reconnected (what it sent in between may be lost, as core
// NATS publishes are on a dropped connection).
func (p *proxied) cut(t *testing.T) {
	t.Helper()
	before := p.nc.Stats().Reconnects
	p.proxy.Cut()
	require.Eventually(t, func() bool {
		return p.nc.Stats().Reconnects > before && p.nc.IsConnected()
	}, 10*time.Second, 5*time.Millisecond, "the client reconnects through the proxy")
}

func (p *proxied) acquire(t *testing.T, key string) *dedup.Lease {
	t.Helper()
	res, err := p.ledger.Claim(p.ctx, dedup.ClaimRequest{Key: key, Tool: "t", Fingerprint: "f", Holder: "w1", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, res.Outcome)
	return res.Lease
}

// within runs f with a context of d and fails the test if f has not returned
// well after that (it waited for a reply that was withheld or lost).
func within(t *testing.T, d time.Duration, f func(ctx context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(d + 10*time.Second):
		t.Fatalf("the call outlived its %s context by 10 s: it waits for the lost reply", d)
		return nil
	}
}

var lostAckModes = []struct {
	name string
	opts []dedup.Option
}{
	{"Unbatched", nil},
	{"Batched", []dedup.Option{dedup.WithBatching(dedup.BatchConfig{Min: 1})}},
}

// TestUnknownWritesAreAdopted: a holder whose writes' acknowledgements are
// withheld — one landed (a heartbeat), a later one was refused because of it
// (the completion) — still holds its lease once the ledger answers again, and
// completes. Remembering only its last write of unknown outcome, it would take
// the landed heartbeat for another claimant's and give the operation up: the
// effect would then fire again after a takeover.
func TestUnknownWritesAreAdopted(t *testing.T) {
	t.Parallel()
	for _, m := range lostAckModes {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			p := newProxied(t, m.opts...)
			ls := p.acquire(t, "k")

			p.proxy.Hold()
			err := within(t, 300*time.Millisecond, func(ctx context.Context) error { return ls.Extend(ctx, time.Minute) })
			require.Error(t, err, "the extension's acknowledgement was withheld")
			require.NotErrorIs(t, err, dedup.ErrLeaseLost)
			_, err = within2(t, 300*time.Millisecond, func(ctx context.Context) (dedup.Record, error) {
				return ls.Complete(ctx, json.RawMessage(`{"sent":1}`), 1)
			})
			require.Error(t, err, "the completion's refusal was withheld")
			require.NotErrorIs(t, err, dedup.ErrLeaseLost)
			p.proxy.Release()

			rec, err := ls.Complete(p.ctx, json.RawMessage(`{"sent":1}`), 1)
			require.NoError(t, err, "the landed extension is the holder's own")
			require.Equal(t, intent.StatusCompleted, rec.Status)
			got, _, err := p.plain.Get(p.ctx, "k")
			require.NoError(t, err)
			require.Equal(t, intent.StatusCompleted, got.Status)
			require.JSONEq(t, `{"sent":1}`, string(got.Result))
		})
	}
}

// TestLostBatchAcknowledgement: a batch whose acknowledgement is lost (the
// connection dropped after the commit went out) answers its writers when
// their contexts end, and holds the queue no longer: a write after the
// reconnection is committed at once, not after the request timeout.
func TestLostBatchAcknowledgement(t *testing.T) {
	t.Parallel()
	p := newProxied(t, dedup.WithBatching(dedup.BatchConfig{Min: 1}))
	ls := p.acquire(t, "k1")

	p.proxy.Hold()
	_, err := within2(t, 300*time.Millisecond, func(ctx context.Context) (dedup.Record, error) {
		return ls.Complete(ctx, json.RawMessage(`1`), 1)
	})
	require.Error(t, err, "the batch's acknowledgement was withheld")
	require.NotErrorIs(t, err, dedup.ErrLeaseLost)
	p.cut(t)

	res, err := within2(t, 5*time.Second, func(ctx context.Context) (dedup.ClaimResult, error) {
		return p.ledger.Claim(ctx, dedup.ClaimRequest{Key: "k2", Tool: "t", Fingerprint: "f", Holder: "w1", Lease: time.Minute})
	})
	require.NoError(t, err, "a write after the lost acknowledgement is not held behind its batch")
	require.Equal(t, dedup.Acquired, res.Outcome)

	rec, err := ls.Complete(p.ctx, json.RawMessage(`1`), 1)
	require.NoError(t, err, "the completion landed or is written now, by the same lease")
	require.Equal(t, intent.StatusCompleted, rec.Status)
	got, _, err := p.plain.Get(p.ctx, "k1")
	require.NoError(t, err)
	require.Equal(t, intent.StatusCompleted, got.Status)

	// A writer that would wait as long as it takes gets an unknown outcome
	// after the batch's AckWait, not after the request timeout.
	p.proxy.Hold()
	claimed := make(chan error, 1)
	go func() {
		_, err := p.ledger.Claim(p.ctx, dedup.ClaimRequest{Key: "k3", Tool: "t", Fingerprint: "f", Holder: "w1", Lease: time.Minute})
		claimed <- err
	}()
	select {
	case err = <-claimed:
		require.Error(t, err, "the claim's acknowledgement was withheld")
	case <-time.After(lostAckTimeout / 4):
		t.Fatalf("a claim without a deadline waited past the batch's AckWait (%s) for a withheld acknowledgement", dedup.DefaultBatchAckWait)
	}
	p.cut(t)
	res, err = p.ledger.Claim(p.ctx, dedup.ClaimRequest{Key: "k3", Tool: "t", Fingerprint: "f", Holder: "w2", Lease: time.Minute})
	require.NoError(t, err)
	require.Equal(t, "w1", res.Record.Holder, "the first claim landed; its outcome was only unknown")
}

// within2 is within for a call that also returns a value.
func within2[T any](t *testing.T, d time.Duration, f func(ctx context.Context) (T, error)) (T, error) {
	t.Helper()
	var v T
	err := within(t, d, func(ctx context.Context) error {
		var err error
		v, err = f(ctx)
		return err
	})
	return v, err
}

// TestGraceNeedsAReadableLedger: a claimant's grace (WaitChange) proves a
// holder gone only if the holder could have written meanwhile. When the
// ledger stops answering during the grace — a replicated stream electing a
// leader, a server restarting — the wait ends with an error instead of
// reporting the record unchanged.
func TestGraceNeedsAReadableLedger(t *testing.T) {
	t.Parallel()
	p := newProxied(t)
	res, err := p.plain.Claim(p.ctx, dedup.ClaimRequest{Key: "k", Tool: "t", Fingerprint: "f", Holder: "w1", Lease: time.Second})
	require.NoError(t, err)
	require.Equal(t, dedup.Acquired, res.Outcome)

	type waited struct {
		moved bool
		err   error
	}
	done := make(chan waited, 1)
	go func() {
		ctx, cancel := context.WithTimeout(p.ctx, 2*time.Second)
		defer cancel()
		moved, err := p.ledger.WaitChange(ctx, "k", res.Revision)
		done <- waited{moved, err}
	}()
	time.Sleep(300 * time.Millisecond)
	p.proxy.Hold()
	select {
	case w := <-done:
		require.Error(t, w.err, "the ledger stopped answering during the grace")
		require.False(t, w.moved)
	case <-time.After(20 * time.Second):
		t.Fatal("WaitChange outlived its context")
	}
	p.cut(t)

	ctx, cancel := context.WithTimeout(p.ctx, time.Second)
	defer cancel()
	moved, err := p.ledger.WaitChange(ctx, "k", res.Revision)
	require.NoError(t, err, "readable throughout: the grace counts")
	require.False(t, moved)
}
