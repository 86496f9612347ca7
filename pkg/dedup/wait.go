package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/intent"
)

// errWatchClosed reports that the watch ended without an answer (for example
// the connection closed).
var errWatchClosed = errors.New("watch closed")

// Wait watches key until its record is worth answering with and returns that
// record and its revision. The watch is pushed by the server (no polling) and
// may start before the key exists; a record that does not exist yet is waited
// for. Wait returns:
//
//   - the record, once its status is answered (intent.Status.Answered);
//   - the pending record, once its lease deadline passes (confirmed by a
//     leader read): the caller claims the key to take it over;
//   - the pending record with no holder, once its holder released it after a
//     transient failure (its lease deadline is the release time): the caller
//     claims the key;
//   - an error matching ErrReleased when the record is deleted or purged (by
//     an operator, or by the bucket's TTL), including when the latest entry
//     is already a delete marker; the leader confirms the deletion, so a
//     lagging replica's stale marker does not end the wait;
//   - the forgotten record with an error matching ErrForgotten and
//     ErrReleased when an operator forgot the operation (Forget): claim
//     again to run it again;
//   - ctx.Err() (wrapped) when ctx is done.
//
// The watch is stopped on every path.
func (l *Ledger) Wait(ctx context.Context, key string) (Record, uint64, error) {
	w, err := l.watch(ctx, key)
	if err != nil {
		return Record{}, 0, fmt.Errorf("wait %s: %w", key, err)
	}
	defer w.Stop()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()

	var lastRev uint64 // revision of the latest unanswered record seen
	var lastRec Record // that record
	for {
		select {
		case <-ctx.Done():
			return Record{}, 0, fmt.Errorf("wait %s: %w", key, ctx.Err())
		case <-timer.C:
			// Confirm the expiry with the leader: the watch may lag behind
			// an extension or an answer.
			cur, rev, err := l.Get(ctx, key)
			switch {
			case errors.Is(err, ErrNotFound):
				return Record{}, 0, fmt.Errorf("wait %s: %w", key, ErrReleased)
			case err != nil:
				return Record{}, 0, fmt.Errorf("wait %s: %w", key, err)
			case rev < lastRev:
				// A read older than the watch (a replicated stream's leader
				// just changed): the record the watch saw is the latest.
				cur, rev = lastRec, lastRev
			}
			switch {
			case cur.Status == intent.StatusForgotten:
				return cur, rev, forgottenErr(key, cur)
			case rev <= lastRev || cur.settled(l.clock()):
				return cur, rev, nil
			}
			lastRev, lastRec = rev, cur
			timer.Reset(max(cur.LeaseUntil.Sub(l.clock()), 0))
		case u, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil { // the watch ends with its context
					return Record{}, 0, fmt.Errorf("wait %s: %w", key, ctx.Err())
				}
				return Record{}, 0, fmt.Errorf("wait %s: %w", key, errWatchClosed)
			}
			e, ok := jsbackend.Observed(u)
			if !ok {
				continue // end of the initial values
			}
			if e.Deleted {
				// A watch served by a lagging replica may show a delete marker
				// the key has moved past; only the leader can confirm it.
				live, err := l.liveAfter(ctx, key, e.Rev)
				if err != nil {
					return Record{}, 0, fmt.Errorf("wait %s: %w", key, err)
				}
				if !live {
					return Record{}, 0, fmt.Errorf("wait %s: %w", key, ErrReleased)
				}
				continue // the newer record is on its way through the watch
			}
			rec, err := decodeRecord(e.Data)
			if err != nil {
				return Record{}, 0, fmt.Errorf("wait %s: decode record at revision %d: %w", key, e.Rev, err)
			}
			if rec.Status.Answered() {
				return rec, e.Rev, nil
			}
			if rec.Status == intent.StatusForgotten {
				return rec, e.Rev, forgottenErr(key, rec)
			}
			lastRev, lastRec = e.Rev, rec
			timer.Stop()
			if !rec.LeaseUntil.IsZero() {
				timer.Reset(max(rec.LeaseUntil.Sub(l.clock()), 0))
			}
		}
	}
}

// forgottenErr is Wait's error for key's forgotten record rec.
func forgottenErr(key string, rec Record) error {
	return fmt.Errorf("wait %s: %w (%s): %w", key, ErrForgotten, rec.ForgottenText(), ErrReleased)
}

// watch watches key's record, in its slot.
func (l *Ledger) watch(ctx context.Context, key string) (*jsbackend.Watcher, error) {
	s, err := l.slot(key)
	if err != nil {
		return nil, err
	}
	return s.bucket.Watch(ctx, s.key)
}

// liveAfter reports whether the leader holds a live record for key newer than
// revision rev.
func (l *Ledger) liveAfter(ctx context.Context, key string, rev uint64) (bool, error) {
	e, err := l.read(ctx, key)
	if err != nil {
		return false, err
	}
	return e.Live() && e.Rev > rev, nil
}

// WaitChange watches key until its record moves past revision rev (any later
// write or deletion) and reports true; it reports false, with no error, when
// ctx ends first with the record still at rev. A claimant uses it to confirm
// that an expired lease is abandoned — the record stays at rev for a grace
// period on its own clock — before taking it over (see
// WithConfirmedTakeover).
//
// The grace only counts while the ledger is writable by the holder: an outage
// (a replicated stream without a leader, a server restarting) stops its
// writes as surely as a crash. So the stream leader is read at the start, at
// the end and at eight points in between (a ctx without a deadline: every
// second); a read that fails ends the wait with an error — the grace proved
// nothing, and the caller should try again later.
func (l *Ledger) WaitChange(ctx context.Context, key string, rev uint64) (bool, error) {
	probe := time.Second
	if d, ok := ctx.Deadline(); ok {
		probe = max(time.Until(d)/8, 10*time.Millisecond)
	}
	// check reads the leader: moved reports the record past rev.
	check := func() (moved bool, err error) {
		rctx, cancel := context.WithTimeout(context.Background(), max(probe, time.Second))
		defer cancel()
		e, err := l.read(rctx, key)
		if err != nil {
			return false, fmt.Errorf("wait change %s: ledger unreadable, grace not counted: %w", key, err)
		}
		return e.Rev != rev, nil
	}
	if moved, err := check(); moved || err != nil {
		return moved, err
	}
	w, err := l.watch(ctx, key)
	if err != nil {
		if ctx.Err() != nil {
			return check()
		}
		return false, fmt.Errorf("wait change %s: %w", key, err)
	}
	defer w.Stop()
	tick := time.NewTicker(probe)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return check()
		case <-tick.C:
			if moved, err := check(); moved || err != nil {
				return moved, err
			}
		case u, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil { // the watch ends with its context
					return check()
				}
				return false, fmt.Errorf("wait change %s: %w", key, errWatchClosed)
			}
			if e, ok := jsbackend.Observed(u); ok && e.Rev > rev {
				return true, nil
			}
		}
	}
}

// WaitFor waits until key's record satisfies accept and returns that
// record and its revision. It reads the record from the bucket's stream
// leader at the start, after every write published on the key's subject
// (a plain subscription, used only as a signal: jsbackend.Waker), and at
// growing intervals (waitRecheckFirst doubling up to waitRecheckLast) in
// case a signal was missed, so it sees only acknowledged
// writes and may skip intermediate ones. It creates no consumer: a user who
// may make leader reads and subscribe to the bucket's subjects may wait,
// and nothing is delivered anywhere it did not subscribe to itself. It may
// start before the key exists; a deletion does not end it (the operation
// may be claimed again). It returns ctx.Err() (wrapped) when ctx ends
// first, and an error when a read fails. Unlike Wait, it never returns a
// record accept refused: it is for callers waiting for an answer, not for
// claimants.
func (l *Ledger) WaitFor(ctx context.Context, key string, accept func(Record) bool) (Record, uint64, error) {
	s, err := l.slot(key)
	if err != nil {
		return Record{}, 0, fmt.Errorf("wait for %s: %w", key, err)
	}
	// Subscribed before the first read: a write after the read signals.
	w, err := s.bucket.Wake(s.key)
	if err != nil {
		return Record{}, 0, fmt.Errorf("wait for %s: %w", key, err)
	}
	defer w.Stop()
	timer := time.NewTimer(0) // the first read, at once
	defer timer.Stop()
	var seen uint64             // the revision the latest read found (0: none yet)
	var settle time.Duration    // the pause before reading again after a signal whose write was not there yet; 0: none
	recheck := waitRecheckFirst // the pause before reading again without a signal
	for {
		select {
		case <-ctx.Done():
			return Record{}, 0, fmt.Errorf("wait for %s: %w", key, ctx.Err())
		case <-w.C():
			settle = waitSettleFirst
		case <-timer.C:
		}
		e, err := s.bucket.Read(ctx, s.key)
		if err != nil {
			if ctx.Err() != nil {
				return Record{}, 0, fmt.Errorf("wait for %s: %w", key, ctx.Err())
			}
			return Record{}, 0, fmt.Errorf("wait for %s: %w", key, err)
		}
		next := recheck
		switch {
		case e.Rev != seen:
			seen, settle = e.Rev, 0
			if !e.Live() {
				break // a deletion: the operation may be claimed again
			}
			rec, err := decodeRecord(e.Data)
			if err != nil {
				return Record{}, 0, fmt.Errorf("wait for %s: record at revision %d: %w", key, e.Rev, err)
			}
			if accept(rec) {
				return rec, e.Rev, nil
			}
		case settle > 0 && settle <= waitSettleLast:
			// Signalled before the write was stored (or for a write the
			// stream refused): read again shortly.
			next, settle = settle, 2*settle
		default:
			recheck = min(2*recheck, waitRecheckLast)
		}
		timer.Reset(next)
	}
}

// How WaitFor reads: again after a signal whose write the leader did not
// show yet, after waitSettleFirst, doubling up to waitSettleLast; and
// without a signal after waitRecheckFirst, doubling up to waitRecheckLast
// (a signal is missed at a reconnect, or by a subscription the writer's
// server does not know of yet).
const (
	waitSettleFirst  = 5 * time.Millisecond
	waitSettleLast   = 640 * time.Millisecond
	waitRecheckFirst = time.Second
	waitRecheckLast  = 16 * time.Second
)
