package dedup

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The record's state machine: every rule that decides how a record moves
// (the arrows of the package documentation's diagram), as pure functions of
// the record, the request and the time. Nothing here reads or writes the
// bucket: the Ledger's methods read a record, ask these rules what to do,
// and write the outcome by compare-and-set on the revision they read — or
// read again when the record moved underneath.

// policy is what the ledger's options decide for every record.
type policy struct {
	// confirmTakeover: an expired lease is taken over only at the revision
	// the claimant confirmed abandoned (WithConfirmedTakeover).
	confirmTakeover bool
	// retention is how long a final record is kept after its last write.
	retention time.Duration
	// forgotten is how long a forgotten record (a Forget's tombstone) is
	// kept.
	forgotten time.Duration
}

// ttl is the per-message TTL of r as written: its retention for a final
// record, the forget retention for a forgotten one, none (it never
// expires) for an unresolved one — expiring it would let a retry fire an
// operation nobody decided.
func (p policy) ttl(r Record) time.Duration {
	switch {
	case r.Status.Final():
		return p.retentionOf(r)
	case r.Status == intent.StatusForgotten:
		return p.forgotten
	}
	return 0
}

// retentionOf is how long r is kept once final: its own retention (its
// tool's), else the ledger's.
func (p policy) retentionOf(r Record) time.Duration {
	if r.RetentionSeconds > 0 {
		return time.Duration(r.RetentionSeconds) * time.Second
	}
	return p.retention
}

// restOf is what is left at now of a TTL of ttl counted from r's last write,
// at least a second, in whole seconds: the TTL r is written again with when
// it moves (Migrate) or gets the TTL it lacked (Retain).
func (r Record) restOf(ttl time.Duration, now time.Time) time.Duration {
	return max(ttl-now.Sub(r.UpdatedAt), time.Second).Round(time.Second)
}

// claimed is the record a claim creates for a key that has none.
func claimed(req ClaimRequest, now time.Time) Record {
	return Record{
		Status:      intent.StatusPending,
		Tool:        req.Tool,
		Session:     req.Session,
		Fingerprint: req.Fingerprint,
		Holder:      req.Holder,
		LeaseUntil:  now.Add(req.Lease),
		Attempt:     1,
		IntentSeq:   req.IntentSeq,
		CallID:      req.CallID,
		Submissions: ranBy(nil, req.Submission),
		CreatedAt:   now,
		UpdatedAt:   now,

		RetentionSeconds: seconds(req.Retention),
	}
}

// seconds is d in whole seconds, rounded up.
func seconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// claimStep is what a claim does with a key's live record: answer with it
// (Done, Busy, Conflict), or write next over it by compare-and-set
// (Acquired, TookOver).
type claimStep struct {
	outcome Outcome
	next    Record // the caller's record, for Acquired and TookOver
}

// writes reports whether the claim writes s.next.
func (s claimStep) writes() bool { return s.outcome == Acquired || s.outcome == TookOver }

// claim decides a claim of req on cur, the key's live record at revision
// rev, at now.
func (p policy) claim(cur Record, rev uint64, req ClaimRequest, now time.Time) claimStep {
	switch {
	case cur.Status == intent.StatusForgotten:
		// An operator forgot the operation so that it may run again: the key
		// is claimed anew, whatever the arguments, as over a delete marker.
		return claimStep{outcome: Acquired, next: claimed(req, now)}
	case cur.Fingerprint != req.Fingerprint:
		return claimStep{outcome: Conflict}
	case cur.Status == intent.StatusFailed && req.RetryFailed && !cur.RanBy(req.IntentSeq, req.Submission):
		// A new call runs a failed operation again. A copy of a call that
		// ran it (a republish, a redelivery) finds its own call's failure.
		return claimStep{outcome: Acquired, next: retried(cur, req, now)}
	case cur.Status.Answered():
		return claimStep{outcome: Done}
	case cur.abandoned(now) && p.confirmTakeover && req.Confirmed != rev:
		return claimStep{outcome: Busy} // expired, not yet confirmed abandoned
	case cur.Status == intent.StatusApproved, cur.Status == intent.StatusPending && cur.LeaseExpired(now):
		next := nextAttempt(cur, req, now)
		if req.Retention > 0 {
			next.RetentionSeconds = seconds(req.Retention) // the tool's retention as its workers have it now
		}
		if cur.Released() || cur.Status == intent.StatusApproved {
			// Nobody held it: a retry after a transient failure, or the
			// firing of an approved operation (the approval stays in the
			// record for the claimant to check).
			return claimStep{outcome: Acquired, next: next}
		}
		// The vanished holder's attempt counts: it may have reached the
		// effect (its fired event in the trail says whether it did).
		next.Attempts++
		return claimStep{outcome: TookOver, next: next}
	}
	return claimStep{outcome: Busy}
}

// retried is the record a claim that retries failures writes over cur, a
// failed record: pending for req's holder, the next attempt, the failure
// and its receipt gone, and the effect's invocations so far kept. An
// approval is dropped with the failure: it approved the firing that failed,
// and a tool behind the gate asks again before it fires again.
func retried(cur Record, req ClaimRequest, now time.Time) Record {
	next := nextAttempt(cur, req, now)
	next.Result, next.Error, next.Receipt, next.Signature, next.Decision = nil, nil, nil, nil, nil
	next.CompletedAt = time.Time{}
	return next
}

// nextAttempt is cur taken by req's claim at now: pending for its holder
// and lease, the next attempt, answering req's intent and call.
func nextAttempt(cur Record, req ClaimRequest, now time.Time) Record {
	next := cur
	next.Status = intent.StatusPending
	next.Holder = req.Holder
	next.LeaseUntil = now.Add(req.Lease)
	next.Attempt = cur.Attempt + 1
	next.IntentSeq = req.IntentSeq
	next.CallID = req.CallID
	next.Submissions = ranBy(cur.Submissions, req.Submission)
	next.UpdatedAt = now
	return next
}

// ranBy is the calls of a record, subs, with submission's added as the
// latest (moved there if it is named already), the oldest dropped past
// MaxSubmissions. subs is not changed.
func ranBy(subs []string, submission string) []string {
	if submission == "" {
		return subs
	}
	out := make([]string, 0, min(len(subs)+1, MaxSubmissions))
	for _, s := range subs {
		if s != submission {
			out = append(out, s)
		}
	}
	out = append(out, submission)
	if len(out) > MaxSubmissions {
		out = out[len(out)-MaxSubmissions:]
	}
	return out
}

// fresh reports whether a lease of length lease, whose record is r, still
// has at least half its length ahead at now (see Ledger.keepLive).
func fresh(r Record, lease time.Duration, now time.Time) bool {
	return now.Add(lease / 2).Before(r.LeaseUntil)
}

// A transition is a holder's change of its record (a Lease method): it
// returns r as changed at now.
type transition func(r Record, now time.Time) Record

// apply returns r changed by t at now, stamped with the time of the write.
func (t transition) apply(r Record, now time.Time) Record {
	r = t(r, now)
	r.UpdatedAt = now
	return r
}

// extend moves the lease deadline to d from now.
func extend(d time.Duration) transition {
	return func(r Record, now time.Time) Record {
		r.LeaseUntil = now.Add(d)
		return r
	}
}

// complete records the effect's result: completed.
func complete(result json.RawMessage, attempts int) transition {
	return func(r Record, now time.Time) Record {
		r.Status = intent.StatusCompleted
		r.Result = result
		r.Error = nil
		r.Attempts = attempts
		r.LeaseUntil = time.Time{}
		r.CompletedAt = now
		return r
	}
}

// fail records a permanent failure: failed.
func fail(e intent.Error, attempts int) transition {
	return func(r Record, now time.Time) Record {
		r.Status = intent.StatusFailed
		r.Result = nil
		r.Error = &e
		r.Attempts = attempts
		r.LeaseUntil = time.Time{}
		r.CompletedAt = now
		return r
	}
}

// release gives the key up after a transient failure: pending with no
// holder, a lease deadline of now, the attempts kept.
func release(attempts int) transition {
	return func(r Record, now time.Time) Record {
		r.Holder = ""
		r.LeaseUntil = now
		r.Attempts = attempts
		return r
	}
}

// awaitApproval parks the operation, with its envelope, for an operator:
// awaiting_approval, no holder.
func awaitApproval(envelope json.RawMessage) transition {
	return func(r Record, _ time.Time) Record {
		r.Status = intent.StatusAwaitingApproval
		r.Intent = envelope
		r.Holder = ""
		r.LeaseUntil = time.Time{}
		return r
	}
}

// hold moves an abandoned operation to uncertain (its takeover counted
// the previous holder's attempt, which may have reached the effect).
func hold(reason string) transition {
	return func(r Record, _ time.Time) Record {
		r.Status = intent.StatusUncertain
		r.Error = &intent.Error{Code: intent.CodeUncertain, Message: reason}
		r.Holder = ""
		r.LeaseUntil = time.Time{}
		return r
	}
}

// noteProbe keeps a reconciliation probe's evidence on the record.
func noteProbe(p Probe) transition {
	return func(r Record, _ time.Time) Record {
		r.Probe = &p
		return r
	}
}

// settleProbed completes an abandoned operation that the probe found done
// downstream, with the result the downstream reported: the previous
// holder's attempt, which its takeover counted, is the one that fired.
func settleProbed(p Probe, result json.RawMessage) transition {
	return func(r Record, now time.Time) Record {
		r.Status = intent.StatusCompleted
		r.Result = result
		r.Error = nil
		r.Probe = &p
		r.LeaseUntil = time.Time{}
		r.CompletedAt = now
		return r
	}
}

// A decision is an operator's change of a record (Approve, Deny, Resolve):
// it returns rec as changed at now, or changed false when it leaves rec as
// it is (the same decision again: the same answer), or an error when it
// does not apply.
type decision func(rec Record, now time.Time) (next Record, changed bool, err error)

// approval approves an operation awaiting approval, for ttl (see
// Ledger.Approve).
func approval(fingerprint, by, reason string, ttl time.Duration) decision {
	return func(rec Record, now time.Time) (Record, bool, error) {
		if fingerprint != "" && fingerprint != rec.Fingerprint {
			return rec, false, fmt.Errorf("%w: approved %s, the record's is %s", ErrFingerprintMismatch, fingerprint, rec.Fingerprint)
		}
		switch rec.Status {
		case intent.StatusAwaitingApproval:
		case intent.StatusApproved, intent.StatusPending, intent.StatusCompleted, intent.StatusFailed:
			if rec.Decision == nil || rec.Decision.Op != intent.ControlApprove {
				return rec, false, fmt.Errorf("%w: %s, and it never awaited approval", ErrWrongState, rec.Status)
			}
			return rec, false, nil // approved already: the same answer
		default:
			return rec, false, fmt.Errorf("%w: %s", ErrWrongState, rec.Status)
		}
		rec.Status = intent.StatusApproved
		rec.Decision = &Decision{Op: intent.ControlApprove, By: by, Reason: reason, At: now, Until: now.Add(ttl)}
		return rec, true, nil
	}
}

// denial refuses an operation awaiting approval, or approved and not yet
// firing (see Ledger.Deny).
func denial(by, reason string) decision {
	return func(rec Record, now time.Time) (Record, bool, error) {
		switch rec.Status {
		case intent.StatusAwaitingApproval, intent.StatusApproved:
		case intent.StatusDenied:
			return rec, false, nil
		default:
			return rec, false, fmt.Errorf("%w: %s", ErrWrongState, rec.Status)
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
		return rec, true, nil
	}
}

// resolution settles an uncertain operation as the operator found it (see
// Ledger.Resolve).
func resolution(succeeded bool, result json.RawMessage, by, reason string) decision {
	return func(rec Record, now time.Time) (Record, bool, error) {
		if rec.Status != intent.StatusUncertain {
			return rec, false, fmt.Errorf("%w: %s", ErrWrongState, rec.Status)
		}
		rec.Decision = &Decision{Op: intent.ControlResolve, By: by, Reason: reason, At: now}
		rec.CompletedAt = now
		if succeeded {
			rec.Status, rec.Result, rec.Error = intent.StatusCompleted, result, nil
			return rec, true, nil
		}
		msg := "resolved as failed by an operator"
		if reason != "" {
			msg += ": " + reason
		}
		rec.Status, rec.Result = intent.StatusFailed, nil
		rec.Error = &intent.Error{Code: intent.CodeEffectFailed, Message: msg}
		return rec, true, nil
	}
}

// probedUncertain applies a probe of an uncertain operation (see
// Ledger.ProbeUncertain): done completes it with result; any other verdict
// only keeps the evidence.
func probedUncertain(p Probe, result json.RawMessage) decision {
	return func(rec Record, now time.Time) (Record, bool, error) {
		if rec.Status != intent.StatusUncertain {
			return rec, false, fmt.Errorf("%w: %s", ErrWrongState, rec.Status)
		}
		rec.Probe = &p
		if p.Verdict == ProbeDone {
			rec.Status, rec.Result, rec.Error = intent.StatusCompleted, result, nil
			rec.CompletedAt = now
		}
		return rec, true, nil
	}
}

// settled reports whether Wait returns r at now: answered, or claimable —
// its lease ran out, or its holder released it.
func (r Record) settled(now time.Time) bool {
	return r.Status.Answered() || r.LeaseExpired(now)
}

// firing reports whether r's operation may be firing at now: approved (a
// worker fires it), or pending with a live lease. Removing or moving its
// record then would let a retry fire it a second time.
func (r Record) firing(now time.Time) bool {
	return r.Status == intent.StatusApproved || (r.Status == intent.StatusPending && !r.Released() && !r.LeaseExpired(now))
}

// abandoned reports whether r is pending with a holder whose lease ran out
// at now: the holder may be gone, or only stalled — a takeover, a forced
// Forget and a migration wait for one more lease to tell.
func (r Record) abandoned(now time.Time) bool {
	return r.Status == intent.StatusPending && !r.Released() && r.LeaseExpired(now)
}

// leaseLength is the length of the lease r's holder took: a claim, a
// takeover and an extension each write lease_until as updated_at plus the
// lease, on the holder's clock. DefaultLease when the record does not say.
func (r Record) leaseLength() time.Duration {
	if d := r.LeaseUntil.Sub(r.UpdatedAt); d > 0 {
		return d
	}
	return DefaultLease
}

// tombstone is the record a Forget writes in place of rec at now: forgotten,
// by whom and why (its decision), with rec's identity (tool, session,
// fingerprint) and counts, so that a reader of the key learns what happened
// to it until the next claim writes over it or it expires.
func tombstone(rec Record, by, reason string, now time.Time) Record {
	return Record{
		Status:      intent.StatusForgotten,
		Tool:        rec.Tool,
		Session:     rec.Session,
		Fingerprint: rec.Fingerprint,
		Attempt:     rec.Attempt,
		Attempts:    rec.Attempts,
		Decision:    &Decision{Op: intent.ControlForget, By: by, Reason: reason, At: now},
		CreatedAt:   rec.CreatedAt,
		UpdatedAt:   now,
	}
}

// ForgottenText says who forgot r's operation, when and why ("forgotten by
// ops at 2026-05-01T12:00:00Z: refunded by hand"); "" when r is not a
// forgotten record.
func (r Record) ForgottenText() string {
	if r.Status != intent.StatusForgotten {
		return ""
	}
	by, at, reason := "an operator", r.UpdatedAt, ""
	if d := r.Decision; d != nil {
		if d.By != "" {
			by = d.By
		}
		at, reason = d.At, d.Reason
	}
	s := "forgotten by " + by + " at " + at.UTC().Format(time.RFC3339)
	if reason != "" {
		s += ": " + reason
	}
	return s
}

// forgettable returns nil when rec may be deleted at now (forced or not), or
// the error that says why not.
func forgettable(rec Record, now time.Time, forced bool) error {
	switch {
	case rec.Status == intent.StatusForgotten:
		return fmt.Errorf("%w: %s already", ErrNotFound, rec.ForgottenText())
	case rec.firing(now) && rec.Status == intent.StatusApproved:
		return fmt.Errorf("%w: approved: a worker fires it now; wait for its outcome", ErrInFlight)
	case rec.firing(now):
		return fmt.Errorf("%w: pending: its holder %s has its lease until %s and may be firing it now; wait for its outcome",
			ErrInFlight, rec.Holder, rec.LeaseUntil.Format(time.RFC3339Nano))
	case rec.Status.Final() || forced:
		return nil
	case rec.Status == intent.StatusPending && rec.Released():
		return fmt.Errorf("%w: pending: released after a transient failure, and the next call retries it anyway; "+
			"forgetting it drops its count of attempts", ErrUnresolved)
	case rec.Status == intent.StatusPending:
		return fmt.Errorf("%w: pending: its holder %s's lease ran out at %s, but a holder that is only stalled (a pause, "+
			"a partition) still fires it when it wakes, and forgetting the record lets the next call fire it a second time; "+
			"forced, it is forgotten only once its record stays unchanged for one more lease (%s)",
			ErrUnresolved, rec.Holder, rec.LeaseUntil.Format(time.RFC3339Nano), rec.leaseLength())
	case rec.Status == intent.StatusAwaitingApproval:
		return fmt.Errorf("%w: awaiting approval: forgetting it drops the request, and the next call asks again; deny it instead", ErrUnresolved)
	case rec.Status == intent.StatusUncertain:
		return fmt.Errorf("%w: uncertain: its holder may have fired it, and forgetting it lets the next call fire it again; "+
			"resolve it instead with what happened downstream", ErrUnresolved)
	}
	return fmt.Errorf("%w: %s", ErrUnresolved, rec.Status)
}
