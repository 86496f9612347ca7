package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgate/idemgate/pkg/intent"
)

// ErrInFlight: Forget found the operation firing or about to fire (pending
// with a live lease, or approved); removing its record then would let a
// retry fire it a second time. Wait for its outcome, or for the lease to
// run out, and forget it then.
var ErrInFlight = errors.New("dedup: operation in flight")

// Forget deletes key's record so that the operation may run again: the next
// intent of the key claims it as if it were new. It refuses (ErrInFlight) a
// record whose holder may be firing right now — pending with a live lease —
// or that an operator approved, and returns ErrNotFound when the key has no
// record. The delete is a compare-and-set on the revision it judged, so a
// record that changed meanwhile is judged again. It returns the record it
// removed.
//
// Workers may still answer the key from their answer caches; a front door
// also tells them to forget it (intent.Names.ForgetSubject).
func (l *Ledger) Forget(ctx context.Context, key string) (Record, error) {
	if p := l.at(key); p != l {
		return p.Forget(ctx, key)
	}
	for round := range maxDecideRounds {
		rec, rev, err := l.Get(ctx, key)
		if err != nil {
			return Record{}, fmt.Errorf("forget: %w", err)
		}
		if rec.Status == intent.StatusApproved ||
			(rec.Status == intent.StatusPending && !rec.Released() && !rec.LeaseExpired(l.clock())) {
			return rec, fmt.Errorf("forget %s: %w: %s until %s", key, ErrInFlight, rec.Status, rec.LeaseUntil.Format("15:04:05.000Z07:00"))
		}
		sk, err := l.stored(key)
		if err != nil {
			return Record{}, fmt.Errorf("forget %s: %w", key, err)
		}
		err = l.kv.Delete(ctx, sk, jetstream.LastRevision(rev))
		if err == nil {
			return rec, nil
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || (apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence &&
			apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return Record{}, fmt.Errorf("forget %s: %w", key, err)
		}
		// Changed since the read (or, on a replicated bucket, a write of
		// the key still in process): judge it again after a short pause.
		if err := pause(ctx, time.Millisecond<<round); err != nil {
			return Record{}, fmt.Errorf("forget %s: %w", key, err)
		}
	}
	return Record{}, fmt.Errorf("forget %s: %w", key, ErrContended)
}
