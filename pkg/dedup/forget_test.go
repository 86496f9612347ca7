package dedup_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Forget replaces a final record with a forgotten one (who, why, the old
// fingerprint) so that the key is claimed afresh over it. It
// refuses an unresolved one unless forced, saying what forcing risks, and
// refuses one that may be firing now (a live lease, an approval) even
// forced; an unknown key is not found.
func TestForget(t *testing.T) {
	t.Parallel()
	b := newListBundle(t, []*server.Server{backends[0].start(t)[0]}, 1, "FORGET_TEST", intent.LayoutFull)
	lease := b.claim(t, "send_email.f1", "send_email", "s")

	_, err := b.ledger.Forget(b.ctx, "send_email.f1")
	require.ErrorIs(t, err, dedup.ErrInFlight, "a live lease: the holder may be firing")
	_, err = b.ledger.Forget(b.ctx, "send_email.f1", dedup.Forced())
	require.ErrorIs(t, err, dedup.ErrInFlight, "forced too")
	_, err = lease.Complete(b.ctx, json.RawMessage(`{"id":1}`), 1)
	require.NoError(t, err)

	completed, _, err := b.ledger.Get(b.ctx, "send_email.f1")
	require.NoError(t, err)
	rec, err := b.ledger.Forget(b.ctx, "send_email.f1", dedup.ForgetBy("ops", "refunded by hand"))
	require.NoError(t, err)
	require.Equal(t, intent.StatusCompleted, rec.Status, "it returns what it replaced")
	tomb, _, err := b.ledger.Get(b.ctx, "send_email.f1")
	require.NoError(t, err, "the forgotten record shows who forgot it")
	require.Equal(t, intent.StatusForgotten, tomb.Status)
	require.Equal(t, completed.Fingerprint, tomb.Fingerprint, "the old fingerprint")
	require.Equal(t, "s", tomb.Session)
	require.Equal(t, &dedup.Decision{Op: intent.ControlForget, By: "ops", Reason: "refunded by hand", At: tomb.UpdatedAt}, tomb.Decision)
	require.Empty(t, tomb.Result)
	require.Regexp(t, `^forgotten by ops at \S+: refunded by hand$`, tomb.ForgottenText())
	_, err = b.ledger.Forget(b.ctx, "send_email.f1")
	require.ErrorIs(t, err, dedup.ErrNotFound, "forgotten already")
	again := b.claim(t, "send_email.f1", "send_email", "s") // Acquired again: it may run again
	require.Equal(t, 1, again.Record().Attempt, "claimed anew")
	require.Nil(t, again.Record().Decision)
	_, err = b.ledger.Forget(b.ctx, "send_email.f1", dedup.Forced())
	require.ErrorIs(t, err, dedup.ErrInFlight, "the new claim is live")

	_, err = b.ledger.Forget(b.ctx, "send_email.none")
	require.ErrorIs(t, err, dedup.ErrNotFound)

	// Unresolved records, each refused with what forgetting it risks, then
	// forgotten forced (the ones nobody can be firing: at once).
	for _, c := range []struct {
		key, risk string
		make      func(*dedup.Lease)
	}{
		{"send_email.released", "released after a transient failure", func(ls *dedup.Lease) { require.NoError(t, ls.Release(b.ctx, 1)) }},
		{"send_email.parked", "awaiting approval", func(ls *dedup.Lease) {
			_, err := ls.AwaitApproval(b.ctx, json.RawMessage(`{}`))
			require.NoError(t, err)
		}},
		{"send_email.unsure", "may have fired it", func(ls *dedup.Lease) {
			_, err := ls.Hold(b.ctx, "holder vanished")
			require.NoError(t, err)
		}},
	} {
		c.make(b.claim(t, c.key, "send_email", "s"))
		_, err := b.ledger.Forget(b.ctx, c.key)
		require.ErrorIs(t, err, dedup.ErrUnresolved, c.key)
		require.ErrorContains(t, err, c.risk)
		_, err = b.ledger.Forget(b.ctx, c.key, dedup.Forced())
		require.NoError(t, err, c.key)
		tomb, _, err := b.ledger.Get(b.ctx, c.key)
		require.NoError(t, err, c.key)
		require.Equal(t, intent.StatusForgotten, tomb.Status, c.key)
	}

	// Approved: a worker fires it now.
	ls := b.claim(t, "send_email.ok", "send_email", "s")
	_, err = ls.AwaitApproval(b.ctx, json.RawMessage(`{}`))
	require.NoError(t, err)
	_, _, err = b.ledger.Approve(b.ctx, "send_email.ok", "", "ada", "", time.Hour)
	require.NoError(t, err)
	_, err = b.ledger.Forget(b.ctx, "send_email.ok", dedup.Forced())
	require.ErrorIs(t, err, dedup.ErrInFlight)

	// Past its lease: the holder may be stalled, not gone.
	b.claim(t, "send_email.f2", "send_email", "s")
	b.advance(2 * time.Minute)
	_, err = b.ledger.Forget(b.ctx, "send_email.f2")
	require.ErrorIs(t, err, dedup.ErrUnresolved)
	require.ErrorContains(t, err, "stalled")
}

// A forced forget of a record pending past its lease meets the takeover's
// bar: the record must stay unchanged for one more lease. A holder that was
// only stalled and writes meanwhile (its heartbeat) keeps its record, and
// its completion lands; one that is gone loses it after the lease.
func TestForcedForgetConfirmsTheHolderGone(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "FORCED"})
	require.NoError(t, err)
	const lease = time.Second
	claim := func(key string) *dedup.Lease {
		res, err := l.Claim(ctx, dedup.ClaimRequest{Key: key, Tool: "send_email", Fingerprint: "fp", Holder: "w1", Lease: lease})
		require.NoError(t, err)
		require.Equal(t, dedup.Acquired, res.Outcome)
		// The holder stalls: its lease runs out.
		time.Sleep(time.Until(res.Record.LeaseUntil))
		return res.Lease
	}
	stream, err := js.Stream(ctx, "KV_FORCED")
	require.NoError(t, err)
	consumers := func() int {
		info, err := stream.Info(ctx)
		require.NoError(t, err)
		return info.State.Consumers
	}

	// Stalled: it wakes while the forget watches its record.
	stalled := claim("send_email.stalled")
	forgot := make(chan error, 1)
	go func() {
		_, err := l.Forget(ctx, "send_email.stalled", dedup.Forced())
		forgot <- err
	}()
	var err2 error
	require.Eventually(t, func() bool {
		select {
		case err2 = <-forgot:
			return true // judged without watching
		default:
			return consumers() > 0 // the forget watches the record
		}
	}, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, err2, "not refused before the holder woke")
	require.NoError(t, stalled.Extend(ctx, lease), "the holder wakes and extends its lease")
	if err2 == nil {
		err2 = <-forgot
	}
	require.ErrorIs(t, err2, dedup.ErrInFlight)
	_, err = stalled.Complete(ctx, json.RawMessage(`{"sent":1}`), 1)
	require.NoError(t, err, "the record is still the holder's")

	// Gone: forgotten once one more lease passed unchanged.
	claim("send_email.gone")
	start := time.Now()
	rec, err := l.Forget(ctx, "send_email.gone", dedup.Forced())
	require.NoError(t, err)
	require.Equal(t, intent.StatusPending, rec.Status)
	require.GreaterOrEqual(t, time.Since(start), lease, "after one more lease")
	tomb, _, err := l.Get(ctx, "send_email.gone")
	require.NoError(t, err)
	require.Equal(t, intent.StatusForgotten, tomb.Status)
}

// Migrate gives a record pending past its lease the same bar: a holder that
// writes it within one more lease is alive, and the ledger is not migrated.
func TestMigrateConfirmsStaleLeases(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	js := jetStream(t, s.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := dedup.Open(ctx, js, dedup.BucketConfig{Bucket: "MIGSTALE", Layout: intent.LayoutFull})
	require.NoError(t, err)
	const lease = 3 * time.Second
	res, err := l.Claim(ctx, dedup.ClaimRequest{Key: "send_email.s1", Tool: "send_email", Fingerprint: "fp", Holder: "w1", Lease: lease})
	require.NoError(t, err)
	time.Sleep(time.Until(res.Record.LeaseUntil)) // the holder stalls past its lease

	// Migrate reads the ledger with a consumer it deletes afterwards: once
	// it is deleted, the record was judged.
	nc := natstest.Connect(t, s.ClientURL())
	scanned, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.DELETED.KV_MIGSTALE.*")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	migrated := make(chan error, 1)
	go func() {
		_, err := dedup.Migrate(ctx, js, "MIGSTALE", dedup.MigrateConfig{Layout: intent.LayoutCompact})
		migrated <- err
	}()
	_, err = scanned.NextMsgWithContext(ctx)
	require.NoError(t, err)
	require.NoError(t, res.Lease.Extend(ctx, lease), "the holder wakes")
	require.ErrorIs(t, <-migrated, dedup.ErrInFlight)
	layout, err := dedup.RecordedLayout(ctx, js, "MIGSTALE")
	require.NoError(t, err)
	require.Equal(t, intent.LayoutFull, layout, "a refused migration changes nothing")

	_, err = res.Lease.Complete(ctx, json.RawMessage(`{}`), 1)
	require.NoError(t, err)
	_, err = dedup.Migrate(ctx, js, "MIGSTALE", dedup.MigrateConfig{Layout: intent.LayoutCompact})
	require.NoError(t, err)
}
