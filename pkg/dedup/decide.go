package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// maxDecideRounds bounds the re-reads of a decision whose record changed
// underneath it.
const maxDecideRounds = 8

// Approve approves the operation awaiting approval under key: the record
// becomes approved, valid for ttl, and the next Claim of the key is Acquired
// with the approval in its record (the caller then fires). fingerprint, when
// not empty, must equal the record's: an approval binds to the arguments the
// operator saw. Approving an approved operation again changes nothing and is
// not an error; so is approving one that is already firing or answered after
// its approval — the record is returned as it is, so that the caller answers
// with it. It returns ErrNotFound, ErrFingerprintMismatch, ErrWrongState
// (denied, uncertain, or an operation that never awaited approval),
// ErrInvalid (ttl not positive, a key the ledger's layout cannot store), or
// ErrContended (the record kept changing underneath it).
func (l *Ledger) Approve(ctx context.Context, key, fingerprint, by, reason string, ttl time.Duration) (Record, uint64, error) {
	if ttl <= 0 {
		return Record{}, 0, fmt.Errorf("%w: approve %s: ttl %s: use a positive duration", ErrInvalid, key, ttl)
	}
	return l.decide(ctx, "approve", key, approval(fingerprint, by, reason, ttl))
}

// Deny refuses the operation awaiting approval (or approved and not yet
// firing) under key: the record becomes denied, answered with error code
// denied and reason, and never fires. Denying a denied operation again is not
// an error. It returns ErrNotFound, ErrWrongState, ErrInvalid (a key the
// ledger's layout cannot store) or ErrContended.
func (l *Ledger) Deny(ctx context.Context, key, by, reason string) (Record, uint64, error) {
	return l.decide(ctx, "deny", key, denial(by, reason))
}

// Resolve settles an uncertain operation under key with what the operator
// found out: succeeded (completed with result) or failed (failed with
// reason). It returns ErrNotFound, ErrWrongState (not uncertain), ErrInvalid
// (result not JSON, a key the ledger's layout cannot store) or ErrContended.
func (l *Ledger) Resolve(ctx context.Context, key string, succeeded bool, result json.RawMessage, by, reason string) (Record, uint64, error) {
	if len(result) > 0 && !json.Valid(result) {
		return Record{}, 0, fmt.Errorf("%w: resolve %s: result is not valid JSON", ErrInvalid, key)
	}
	return l.decide(ctx, "resolve", key, resolution(succeeded, result, by, reason))
}

// ProbeUncertain records a probe of the uncertain operation under key: a
// probe that found it done (p.Verdict ProbeDone) completes it with result,
// what the downstream reported; any other verdict leaves it uncertain, for
// an operator, with p as its evidence. It returns ErrNotFound,
// ErrWrongState (not uncertain), ErrInvalid (result not JSON) or
// ErrContended.
func (l *Ledger) ProbeUncertain(ctx context.Context, key string, p Probe, result json.RawMessage) (Record, uint64, error) {
	if p.Verdict == ProbeDone && !json.Valid(result) {
		return Record{}, 0, fmt.Errorf("%w: probe %s: result is not valid JSON", ErrInvalid, key)
	}
	return l.decide(ctx, "probe", key, probedUncertain(p, result))
}

// unchangedKey is the context key of ReportUnchanged's flag.
type unchangedKey struct{}

// ReportUnchanged returns ctx, on which a decision (Approve, Deny, Resolve,
// ProbeUncertain) that changed nothing — the operation was decided so
// already — sets *unchanged, so that its caller records no second
// decision. The flag is the calling goroutine's: use ctx for one decision
// at a time.
func ReportUnchanged(ctx context.Context) (_ context.Context, unchanged *bool) {
	unchanged = new(bool)
	return context.WithValue(ctx, unchangedKey{}, unchanged), unchanged
}

// decide applies d to key's record by compare-and-set, re-reading (from the
// leader) when the record moved underneath; a decision that changes nothing
// returns the record as read (and says so to ReportUnchanged).
func (l *Ledger) decide(ctx context.Context, op, key string, d decision) (Record, uint64, error) {
	for range maxDecideRounds {
		rec, rev, err := l.Get(ctx, key)
		if err != nil {
			return Record{}, 0, fmt.Errorf("%s: %w", op, err)
		}
		rec, changed, err := d(rec, l.clock())
		if err != nil {
			return rec, rev, fmt.Errorf("%s %s: %w", op, key, err)
		}
		if !changed {
			if u, ok := ctx.Value(unchangedKey{}).(*bool); ok {
				*u = true
			}
			return rec, rev, nil
		}
		l.seal(ctx, key, &rec)
		newRev, err := l.transition(ctx, key, rev, rec)
		if errors.Is(err, errRevisionMismatch) {
			continue
		}
		if err != nil {
			return Record{}, 0, fmt.Errorf("%s: %w", op, err)
		}
		return rec, newRev, nil
	}
	return Record{}, 0, fmt.Errorf("%s %s: %w", op, key, ErrContended)
}
