package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/retry"
)

var (
	// ErrInFlight: Forget (or Migrate) found the operation firing or about
	// to fire — pending with a live lease, approved, or pending past its
	// lease with a holder that wrote its record again within one more lease
	// (stalled, not gone). Removing its record then would let a retry fire it
	// a second time. Wait for its outcome.
	ErrInFlight = errors.New("dedup: operation in flight")

	// ErrUnresolved: Forget, not forced (Forced), found the operation
	// unresolved — pending, awaiting approval or uncertain. The error's
	// message says what forgetting that record risks.
	ErrUnresolved = errors.New("dedup: operation unresolved")
)

// ForgetOption changes what Forget accepts.
type ForgetOption func(*forgetOptions)

type forgetOptions struct {
	forced     bool
	by, reason string
}

// ForgetBy names who forgets the operation and why, for the forgotten
// record (see Forget). Default: no name, no reason.
func ForgetBy(by, reason string) ForgetOption {
	return func(o *forgetOptions) { o.by, o.reason = by, reason }
}

// Forced makes Forget delete an unresolved record too (pending, awaiting
// approval, uncertain), which lets the next call of the operation fire it
// again: an uncertain operation's holder may have fired it already, and an
// operation awaiting approval loses its request. A pending record is deleted
// only when nobody can be firing it — released after a transient failure,
// or with a lease that ran out and a record that then stays unchanged for
// one more lease on the caller's clock, as a takeover requires — so Forget
// waits that long (bounded by ctx). A record that is approved, or pending
// with a live lease, is refused (ErrInFlight) even so.
func Forced() ForgetOption { return func(o *forgetOptions) { o.forced = true } }

// Forget replaces key's record with a forgotten one, so that the operation
// may run again: the next intent of the key claims it as if it were new,
// writing over the forgotten record by compare-and-set exactly as over a
// delete marker. The forgotten record (a tombstone) keeps the old record's
// tool, session and fingerprint and says who forgot it, when and why
// (ForgetBy; Record.ForgottenText); it expires after the ledger's forget
// retention (WithForgetRetention), and a Wait on the key ends with
// ErrForgotten. It returns the record it replaced.
//
// A final record (completed, failed, denied) is deleted. An unresolved one is
// refused with ErrUnresolved unless Forced; a record whose holder may be
// firing right now — pending with a live lease, or approved — is refused with
// ErrInFlight, forced or not. A pending record past its lease is not proof
// that its holder is gone: a holder that is only stalled (a pause, a
// partition from NATS) goes on firing when it wakes. So a forced Forget
// watches it for one more lease first, as a takeover does, and refuses it
// (ErrInFlight) when it changes meanwhile. It returns ErrNotFound when the
// key has no record, and ErrInvalid for a key the ledger's layout cannot
// store; a key already forgotten is ErrNotFound too. The write is a
// compare-and-set on the revision it judged, so a record that changed
// meanwhile is judged again (ErrContended when it keeps changing).
//
// Workers may still answer the key from their answer caches; a front door
// also tells them to forget it (intent.Names.ForgetSubject).
func (l *Ledger) Forget(ctx context.Context, key string, opts ...ForgetOption) (Record, error) {
	var o forgetOptions
	for _, opt := range opts {
		opt(&o)
	}
	var pauses backoff.BackOff // made at the first lost round: most forgets lose none
	for range maxDecideRounds {
		rec, rev, err := l.Get(ctx, key)
		if err != nil {
			return Record{}, fmt.Errorf("forget: %w", err)
		}
		if err := forgettable(rec, l.clock(), o.forced); err != nil {
			return rec, fmt.Errorf("forget %s: %w", key, err)
		}
		if rec.abandoned(l.clock()) {
			if err := l.confirmGone(ctx, key, rec, rev); err != nil {
				return rec, fmt.Errorf("forget %s: %w", key, err)
			}
		}
		s, err := l.slot(key)
		if err != nil {
			return Record{}, fmt.Errorf("forget %s: %w", key, err)
		}
		_, err = l.cas(ctx, s, rev, tombstone(rec, o.by, o.reason, l.clock()), jsbackend.Grouped)
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, errRevisionMismatch) {
			return Record{}, fmt.Errorf("forget %s: %w", key, err)
		}
		// Changed since the read (or, on a replicated bucket, a write of
		// the key still in process): judge it again after a short pause.
		if pauses == nil {
			pauses = forgetPauses(ctx)
		}
		if !retry.Wait(ctx, pauses) {
			if err := ctx.Err(); err != nil {
				return Record{}, fmt.Errorf("forget %s: %w", key, err)
			}
			break
		}
	}
	return Record{}, fmt.Errorf("forget %s: %w", key, ErrContended)
}

// forgetPauses are the pauses of Forget after a lost compare-and-set, one a
// round: 1ms, doubling (2, 4 ... 128ms), maxDecideRounds of them, cut short
// when ctx is done.
func forgetPauses(ctx context.Context) backoff.BackOff {
	return backoff.WithMaxRetries(retry.Doubling(ctx, time.Millisecond, time.Millisecond<<(maxDecideRounds-1)), maxDecideRounds)
}

// confirmGone watches key's record, at revision rev past its lease, for one
// more lease (rec's) on this process's clock, and returns nil when it stayed
// there — its holder is gone, as a takeover judges it (WaitChange) — or an
// error matching ErrInFlight when it was written meanwhile: the holder is
// alive. An error of ctx, or a ledger that could not be read, is returned
// as it is: the grace proved nothing.
func (l *Ledger) confirmGone(ctx context.Context, key string, rec Record, rev uint64) error {
	grace := rec.leaseLength()
	gctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	changed, err := l.WaitChange(gctx, key, rev)
	switch {
	case err != nil:
		return err
	case changed:
		return fmt.Errorf("%w: pending: its holder %s wrote its record within one more lease after its lease ran out: "+
			"it is alive and may be firing it; wait for its outcome", ErrInFlight, rec.Holder)
	case ctx.Err() != nil:
		return fmt.Errorf("the record must stay unchanged for one more lease (%s) before it is forgotten: %w", grace, ctx.Err())
	}
	return nil
}
