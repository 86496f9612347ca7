package dedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
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
// with it. It returns ErrNotFound, ErrFingerprintMismatch, or ErrWrongState
// (denied, uncertain, or an operation that never awaited approval).
func (l *Ledger) Approve(ctx context.Context, key, fingerprint, by, reason string, ttl time.Duration) (Record, uint64, error) {
	if ttl <= 0 {
		return Record{}, 0, fmt.Errorf("%w: approve %s: ttl %s: use a positive duration", ErrInvalid, key, ttl)
	}
	return l.decide(ctx, "approve", key, func(rec *Record, now time.Time) (bool, error) {
		if fingerprint != "" && fingerprint != rec.Fingerprint {
			return false, fmt.Errorf("%w: approved %s, the record's is %s", ErrFingerprintMismatch, fingerprint, rec.Fingerprint)
		}
		switch rec.Status {
		case intent.StatusAwaitingApproval:
		case intent.StatusApproved, intent.StatusPending, intent.StatusCompleted, intent.StatusFailed:
			if rec.Decision == nil || rec.Decision.Op != intent.ControlApprove {
				return false, fmt.Errorf("%w: %s, and it never awaited approval", ErrWrongState, rec.Status)
			}
			return false, nil // approved already: the same answer
		default:
			return false, fmt.Errorf("%w: %s", ErrWrongState, rec.Status)
		}
		rec.Status = intent.StatusApproved
		rec.Decision = &Decision{Op: intent.ControlApprove, By: by, Reason: reason, At: now, Until: now.Add(ttl)}
		return true, nil
	})
}

// Deny refuses the operation awaiting approval (or approved and not yet
// firing) under key: the record becomes denied, answered with error code
// denied and reason, and never fires. Denying a denied operation again is not
// an error. It returns ErrNotFound or ErrWrongState.
func (l *Ledger) Deny(ctx context.Context, key, by, reason string) (Record, uint64, error) {
	return l.decide(ctx, "deny", key, func(rec *Record, now time.Time) (bool, error) {
		switch rec.Status {
		case intent.StatusAwaitingApproval, intent.StatusApproved:
		case intent.StatusDenied:
			return false, nil
		default:
			return false, fmt.Errorf("%w: %s", ErrWrongState, rec.Status)
		}
		msg := "denied by an operator"
		if by != "" {
			msg = "denied by " + by
		}
		if reason != "" {
			msg += ": " + reason
		}
		rec.Status = intent.StatusDenied
		rec.Error = &intent.Error{Code: intent.CodeDenied, Message: msg}
		rec.Decision = &Decision{Op: intent.ControlDeny, By: by, Reason: reason, At: now}
		rec.CompletedAt = now
		rec.Intent = nil
		return true, nil
	})
}

// Resolve settles an uncertain operation under key with what the operator
// found out: succeeded (completed with result) or failed (failed with
// reason). It returns ErrNotFound, ErrWrongState (not uncertain) or ErrInvalid.
func (l *Ledger) Resolve(ctx context.Context, key string, succeeded bool, result json.RawMessage, by, reason string) (Record, uint64, error) {
	if len(result) > 0 && !json.Valid(result) {
		return Record{}, 0, fmt.Errorf("%w: resolve %s: result is not valid JSON", ErrInvalid, key)
	}
	return l.decide(ctx, "resolve", key, func(rec *Record, now time.Time) (bool, error) {
		if rec.Status != intent.StatusUncertain {
			return false, fmt.Errorf("%w: %s", ErrWrongState, rec.Status)
		}
		rec.Decision = &Decision{Op: intent.ControlResolve, By: by, Reason: reason, At: now}
		rec.CompletedAt = now
		if succeeded {
			rec.Status, rec.Result, rec.Error = intent.StatusCompleted, result, nil
			return true, nil
		}
		msg := "resolved as failed by an operator"
		if reason != "" {
			msg += ": " + reason
		}
		rec.Status, rec.Result = intent.StatusFailed, nil
		rec.Error = &intent.Error{Code: intent.CodeEffectFailed, Message: msg}
		return true, nil
	})
}

// decide applies change to key's record by compare-and-set, re-reading (from
// the leader) when the record moved underneath. change reports whether it
// changed the record; false returns the record as read.
func (l *Ledger) decide(ctx context.Context, op, key string, change func(*Record, time.Time) (bool, error)) (Record, uint64, error) {
	if p := l.at(key); p != l {
		return p.decide(ctx, op, key, change)
	}
	for range maxDecideRounds {
		rec, rev, err := l.Get(ctx, key)
		if err != nil {
			return Record{}, 0, fmt.Errorf("%s: %w", op, err)
		}
		changed, err := change(&rec, l.clock())
		if err != nil {
			return rec, rev, fmt.Errorf("%s %s: %w", op, key, err)
		}
		if !changed {
			return rec, rev, nil
		}
		l.seal(ctx, key, &rec)
		newRev, err := l.transition(ctx, key, rev, rec)
		if errors.Is(err, ErrRevisionMismatch) {
			continue
		}
		if err != nil {
			return Record{}, 0, fmt.Errorf("%s: %w", op, err)
		}
		return rec, newRev, nil
	}
	return Record{}, 0, fmt.Errorf("%s %s: %w", op, key, ErrContended)
}
