package dedup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Lease is a claimant's hold on one key, returned by Claim for Acquired and
// TookOver. Its fencing token is the record's revision: every write is a
// compare-and-set on it, so a holder whose lease was taken over cannot
// overwrite the new holder's record. A Lease is safe for concurrent use (for
// example a heartbeat calling Extend while the effect runs); its writes are
// serialised.
type Lease struct {
	ledger *Ledger
	slot   slot // where the record lives
	key    string

	mu   sync.Mutex
	rev  uint64
	rec  leaseRecord // the record as the lease last wrote it
	done bool        // completed, failed or released
	// unsure are the writes since rev whose outcome is not known (the
	// acknowledgement was lost, or the context ended while the write was in
	// flight), oldest first. Each was a compare-and-set on rev, so at most one
	// of them landed — not necessarily the last: a heartbeat may land and the
	// completion sent after it be refused on its account, both unanswered.
	unsure []Record
}

// reconcileTimeout bounds the leader read that reconciles a refused write
// of the lease, even when the caller's ctx is done.
const reconcileTimeout = 2 * time.Second

// maxUnsure bounds Lease.unsure; the oldest is forgotten first. A holder cut
// off from the ledger for minutes makes a few writes a second (heartbeats,
// recording attempts).
const maxUnsure = 512

// revision returns the revision of the lease's latest write: its fencing
// token.
func (ls *Lease) revision() uint64 {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.rev
}

// Record returns the record as the lease last wrote it.
func (ls *Lease) Record() Record {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.rec.record()
}

// Extend moves the lease deadline to d from now. Call it well before the
// deadline: once it has passed, another claimant may take the record over.
// It returns an error matching ErrLeaseLost if that happened, ErrLeaseDone
// after Complete, Fail or Release, or ErrInvalid for d <= 0.
func (ls *Lease) Extend(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: extend %s: duration %s: use a positive duration", ErrInvalid, ls.key, d)
	}
	_, err := ls.write(ctx, "extend", extend(d), false, jsbackend.Alone)
	return err
}

// Complete records the effect's result: the record becomes completed and is
// replayed to every later claimant and waiter. attempts is how many times the
// effect was invoked for this key, retries included. It returns the written
// record, or an error matching ErrLeaseLost or ErrLeaseDone.
func (ls *Lease) Complete(ctx context.Context, result json.RawMessage, attempts int) (Record, error) {
	return ls.write(ctx, "complete", complete(result, attempts), true, jsbackend.Grouped)
}

// Fail records a permanent failure: the record becomes failed and is replayed
// like a result; the effect is not fired again for this key. For a transient
// failure use Release. It returns the written record, or an error matching
// ErrLeaseLost or ErrLeaseDone.
func (ls *Lease) Fail(ctx context.Context, e intent.Error, attempts int) (Record, error) {
	return ls.write(ctx, "fail", fail(e, attempts), true, jsbackend.Grouped)
}

// Release gives the key up after a transient failure, so that a retry may
// claim it: the record stays pending, with no holder, a lease deadline of now
// and attempts (the effect's invocations so far) kept — the next Claim is
// Acquired with attempt+1 and sees the count. Waiters see the lease expire and
// claim the key. It returns an error matching ErrLeaseLost if the lease was
// taken over, or ErrLeaseDone.
func (ls *Lease) Release(ctx context.Context, attempts int) error {
	_, err := ls.write(ctx, "release", release(attempts), true, jsbackend.Grouped)
	return err
}

// AwaitApproval parks the operation until an operator decides: the record
// becomes awaiting_approval, keeps envelope (the intent, to fire on approval)
// and gives up the lease. Callers are answered awaiting_approval. It returns
// the written record, or an error matching ErrLeaseLost or ErrLeaseDone.
func (ls *Lease) AwaitApproval(ctx context.Context, envelope json.RawMessage) (Record, error) {
	return ls.write(ctx, "await approval", awaitApproval(envelope), true, jsbackend.Grouped)
}

// Hold moves an abandoned operation to uncertain instead of firing it again:
// its previous holder may or may not have fired the effect, and only an
// operator can tell (Ledger.Resolve). The previous holder's attempt counts
// among the record's attempts: it may have reached the effect. It returns
// the written record, or an error matching ErrLeaseLost or ErrLeaseDone.
func (ls *Lease) Hold(ctx context.Context, reason string) (Record, error) {
	return ls.write(ctx, "hold", hold(reason), true, jsbackend.Grouped)
}

// NoteProbe keeps a reconciliation probe's evidence on the record, before
// the holder acts on its verdict (fires, or holds the operation as
// uncertain). It returns an error matching ErrLeaseLost or ErrLeaseDone.
func (ls *Lease) NoteProbe(ctx context.Context, p Probe) error {
	_, err := ls.write(ctx, "note probe", noteProbe(p), false, jsbackend.Alone)
	return err
}

// SettleProbed completes an operation taken over from a vanished holder
// that the probe p found done downstream: the record becomes completed with
// result (what the downstream reported), keeps p as its evidence, and the
// previous holder's attempt counts among its attempts. Nothing fires. It
// returns the written record, or an error matching ErrLeaseLost or
// ErrLeaseDone.
func (ls *Lease) SettleProbed(ctx context.Context, p Probe, result json.RawMessage) (Record, error) {
	return ls.write(ctx, "settle probed", settleProbed(p, result), true, jsbackend.Grouped)
}

// write applies t to a copy of the lease's record and writes it by
// compare-and-set on the lease's revision, as m says; final marks the lease
// done.
func (ls *Lease) write(ctx context.Context, op string, t transition, final bool, m jsbackend.Mode) (Record, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.done {
		return Record{}, fmt.Errorf("%s %s: %w", op, ls.key, ErrLeaseDone)
	}
	if len(ls.unsure) > 0 {
		// Recovering from a write of unknown outcome (an outage, most
		// likely): go straight to the stream, not behind a batch that the
		// same outage may still hold.
		m = jsbackend.Alone
	}
	now := ls.ledger.clock()
	next := t.apply(ls.rec.record(), now)
	ls.ledger.seal(ctx, ls.key, &next)
	rev, err := ls.ledger.cas(ctx, ls.slot, ls.rev, next, m)
	if errors.Is(err, errRevisionMismatch) {
		moved, adopted, rerr := ls.reconcile(ctx)
		switch {
		case rerr != nil:
			// The record moved, by this lease's own write or another
			// claimant's: not known until the ledger can be read.
			return Record{}, fmt.Errorf("%s %s: revision %d moved on; reading it back: %w", op, ls.key, ls.rev, rerr)
		case !moved:
			// Refused while the record is still at the lease's revision: a
			// replicated stream refuses a write of a key while another is
			// in process (10164) — most likely this lease's own write of
			// unknown outcome. The lease is not lost (nobody else wrote),
			// and this write did not land: try again.
			return Record{}, fmt.Errorf("%s %s: revision %d is still the latest, a write of it in process: %w", op, ls.key, ls.rev, err)
		case adopted:
			// An earlier write of ours had landed: write again over it.
			next = t.apply(ls.rec.record(), now)
			ls.ledger.seal(ctx, ls.key, &next)
			rev, err = ls.ledger.cas(ctx, ls.slot, ls.rev, next, m)
		}
	}
	if errors.Is(err, errRevisionMismatch) {
		return Record{}, fmt.Errorf("%s %s: %w", op, ls.key, ErrLeaseLost)
	}
	if err != nil {
		if len(ls.unsure) == maxUnsure {
			ls.unsure = append(ls.unsure[:0], ls.unsure[1:]...)
		}
		ls.unsure = append(ls.unsure, next)
		return Record{}, fmt.Errorf("%s %s: %w", op, ls.key, err)
	}
	ls.rev, ls.rec, ls.done, ls.unsure = rev, leaseRecordOf(next), final, nil
	return next, nil
}

// reconcile reads the key's latest record from the leader after a write of
// the lease was refused. moved reports that the record is no longer at the
// lease's revision; adopted that the record it moved to is one of the lease's
// writes of unknown outcome — it landed after all — which it makes the
// lease's revision. Without adopted, a heartbeat whose acknowledgement was
// lost would make the holder of a live lease believe it lost the lease, and
// another claimant would fire the operation again; without moved, a refusal
// while such a write is still in process would. An error means the leader
// could not be read.
func (ls *Lease) reconcile(ctx context.Context) (moved, adopted bool, err error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reconcileTimeout)
	defer cancel()
	e, err := ls.slot.bucket.Read(rctx, ls.slot.key)
	if err != nil {
		return false, false, err
	}
	if e.Live() && e.Rev <= ls.rev {
		return false, false, nil
	}
	if !e.Live() {
		return true, false, nil // deleted
	}
	for i := len(ls.unsure) - 1; i >= 0; i-- {
		want, err := ls.unsure[i].marshal()
		if err == nil && bytes.Equal(e.Data, want) {
			ls.rev, ls.rec, ls.unsure = e.Rev, leaseRecordOf(ls.unsure[i]), nil
			return true, true, nil
		}
	}
	return true, false, nil
}
