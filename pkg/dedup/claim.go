package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup/internal/jsbackend"
	"github.com/idemgate/idemgate/pkg/intent"
)

// DefaultLease is the lease a claim takes when ClaimRequest.Lease is zero.
const DefaultLease = 30 * time.Second

// maxClaimRounds bounds how often Claim re-reads a record that changed between
// its write and its read (released, taken over by another claimant).
const maxClaimRounds = 8

// Outcome is what a claim found and did. Only Acquired and TookOver let the
// caller fire the effect; the others are results, not errors.
type Outcome int

// Claim outcomes.
const (
	// Acquired: nobody held the key — it had no record, its holder released
	// it after a transient failure, an operator approved it, or it failed
	// and the claim retries failures (ClaimRequest.RetryFailed) — and the
	// caller now holds the lease.
	Acquired Outcome = iota + 1
	// TookOver: the key's pending record had an expired lease; the caller
	// replaced its holder by compare-and-set and holds the lease. The previous
	// holder may have fired the effect (see the package documentation).
	TookOver
	// Done: the record is answered (completed, failed, awaiting approval,
	// uncertain, ...) with the same fingerprint: replay it, do not fire
	// (failed is not Done for a claim that retries failures).
	Done
	// Busy: another holder's lease is live (or the record is in a state the
	// worker drives, such as approved): wait for the answer with Ledger.Wait.
	Busy
	// Conflict: the key's record has another fingerprint: the same key was
	// used for other arguments. Never fire, never replay.
	Conflict
	// OverBudget: the operation is new and its budget's window is full
	// (ClaimRequest.Budget): nothing was written, the key stays unclaimed;
	// ClaimResult.RetryAt is when the window ends. Never fire.
	OverBudget
)

// String returns the outcome's name in lower case.
func (o Outcome) String() string {
	switch o {
	case Acquired:
		return "acquired"
	case TookOver:
		return "took_over"
	case Done:
		return "done"
	case Busy:
		return "busy"
	case Conflict:
		return "conflict"
	case OverBudget:
		return "over_budget"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// ClaimRequest asks for the lease of one key.
type ClaimRequest struct {
	// Key is the operation's key; it must be a valid KV key. Required.
	Key string
	// Tool is the tool of the operation, recorded for operators.
	Tool string
	// Session is the intent's session, recorded for operators and for
	// front doors that scope callers by session. Optional.
	Session string
	// Fingerprint identifies the operation's arguments. Required.
	Fingerprint string
	// Holder names the claimant (a worker instance). Required.
	Holder string
	// Lease is how long the claim holds the key before another claimant may
	// take it over; extend it with Lease.Extend. Default: DefaultLease (30s).
	Lease time.Duration
	// IntentSeq is the stream sequence of the intent being handled. Optional.
	IntentSeq uint64
	// CallID is the intent's informational call id. Optional.
	CallID string
	// Submission names the call the intent belongs to (the intent's
	// intent.HeaderSubmission), recorded with the claim (Record.Submissions).
	// Optional.
	Submission string
	// Confirmed is the revision of a pending record with an expired lease
	// that the claimant saw stay unchanged for a grace period: with
	// WithConfirmedTakeover, only that revision is taken over (a record at
	// another revision, or one not yet confirmed, is reported Busy, with
	// Record.LeaseExpired true). Ignored without the option.
	Confirmed uint64
	// Retention is how long the record is kept once final (the tool's
	// retention), stored on the record; a claim that takes a record over
	// stores its own. Default 0: the ledger's (BucketConfig.TTL).
	Retention time.Duration
	// Budget, when set, is the effect budget a claim that creates the
	// key's record spends from (see Budget); Tool is then required. A claim
	// with a budget reads the key first. Default nil: no budget.
	Budget *Budget
	// ReadFirst makes the claim read the key's record before it writes: one
	// round trip instead of two (a refused create, then the read) when the
	// key most likely has a record already — an intent delivered again, a
	// duplicate — and one more when it has none. The outcome is the same.
	ReadFirst bool
	// RetryFailed makes a failed record of the same fingerprint no answer
	// for a new call: the claim takes it over by compare-and-set (Acquired)
	// and the caller fires again — the tool's intent.OnFailureRetry. A copy
	// of a call that ran the operation (Record.RanBy) is answered with the
	// failure (Done) all the same: only a new call runs it again. Default
	// false: the failure is the answer (Done).
	RetryFailed bool
}

func (r ClaimRequest) validate() error {
	switch {
	case r.Key == "":
		return fmt.Errorf("%w: claim: Key is empty: derive it with the intent package", ErrInvalid)
	case r.Fingerprint == "":
		return fmt.Errorf("%w: claim %s: Fingerprint is empty: derive it with the intent package", ErrInvalid, r.Key)
	case r.Holder == "":
		return fmt.Errorf("%w: claim %s: Holder is empty: name the worker instance", ErrInvalid, r.Key)
	case r.Lease < 0:
		return fmt.Errorf("%w: claim %s: Lease %s is negative: set a positive duration or 0 for %s", ErrInvalid, r.Key, r.Lease, DefaultLease)
	case r.Budget != nil && !intent.ValidTool(r.Tool):
		return fmt.Errorf("%w: claim %s: a Budget needs the Tool, [a-z0-9_-]{1,64}; got %q", ErrInvalid, r.Key, r.Tool)
	case r.Budget != nil:
		return r.Budget.validate(r.Key)
	case r.Retention < 0:
		return fmt.Errorf("%w: claim %s: Retention %s is negative: set a positive duration or 0 for the ledger's", ErrInvalid, r.Key, r.Retention)
	}
	return nil
}

// ClaimResult is the outcome of a claim.
type ClaimResult struct {
	// Outcome says what the claim found and did.
	Outcome Outcome
	// Record is the key's record: the caller's own for Acquired and TookOver,
	// the existing one otherwise.
	Record Record
	// Revision is Record's revision.
	Revision uint64
	// Lease is the caller's lease for Acquired and TookOver; nil otherwise.
	Lease *Lease
	// Previous is, for TookOver, the record taken over: its holder is the
	// one that vanished.
	Previous Record
	// OverBudget reports, for Acquired with Budget.Park, that the
	// operation is over its budget and was not counted: park it for an
	// approval. RetryAt is then, as for the outcome OverBudget, when the
	// budget's window ends.
	OverBudget bool
	RetryAt    time.Time
}

// Claim tries to take the lease of req.Key. It creates the record if the key
// has none (Acquired), takes over a pending record whose lease expired
// (TookOver), or reports what holds the key: Done, Busy or Conflict. Among
// concurrent claimants of one key exactly one gets Acquired (or TookOver).
//
// Decisions come from the outcome of the claim's own write or from a leader
// read, never from a possibly stale follower. Claim returns an error matching
// ErrInvalid for a bad request, ErrContended if the record kept changing
// underneath it, or the underlying JetStream error.
func (l *Ledger) Claim(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	if err := req.validate(); err != nil {
		return ClaimResult{}, err
	}
	s, err := l.slot(req.Key)
	if err != nil {
		return ClaimResult{}, fmt.Errorf("claim: %w", err)
	}
	if l.layout == intent.LayoutCompact && !intent.ValidKey(req.Key) && intent.CompactLedgerKey(req.Key) {
		return ClaimResult{}, fmt.Errorf("%w: claim %s: a key of the shape of a compact ledger key (<tool>.<22 base64url characters>) that is not derived "+
			"could stand for another operation's record in this ledger (layout %d): use a derived key (<tool>.<64 hex digits>) or another name",
			ErrInvalid, req.Key, intent.LayoutCompact)
	}
	if req.Lease == 0 {
		req.Lease = DefaultLease
	}
	for round := range maxClaimRounds {
		res, again, err := l.claimRound(ctx, s, req, req.ReadFirst || req.Budget != nil || round > 0)
		if err == nil && !again && res.Lease != nil {
			res, again, err = l.keepLive(ctx, req, res)
		}
		if err != nil {
			return ClaimResult{}, fmt.Errorf("claim %s: %w", req.Key, err)
		}
		if !again {
			return res, nil
		}
	}
	return ClaimResult{}, fmt.Errorf("claim %s: %w", req.Key, ErrContended)
}

// keepLiveTries bounds the extensions keepLive makes.
const keepLiveTries = 3

// keepLive returns res, a lease the claim just won, once its deadline is at
// least half a lease ahead. The deadline was set when the claim's write was
// sent; a write acknowledged late (a lost acknowledgement settled by a read,
// a slow commit) returns a lease that is near its deadline or past it, and
// another claimant may have seen it expired and be confirming the takeover
// already — while the holder is about to fire. So the lease is extended
// first: the extension's new revision fences that claimant off (it confirmed
// the old one), or the extension fails with ErrLeaseLost because the
// claimant took the lease over meanwhile, and the claim starts over (again).
func (l *Ledger) keepLive(ctx context.Context, req ClaimRequest, res ClaimResult) (ClaimResult, bool, error) {
	for range keepLiveTries {
		if fresh(res.Record, req.Lease, l.clock()) {
			return res, false, nil
		}
		err := res.Lease.Extend(ctx, req.Lease)
		switch {
		case errors.Is(err, ErrLeaseLost):
			return ClaimResult{}, true, nil
		case err != nil:
			return ClaimResult{}, false, fmt.Errorf("extend a lease acknowledged late: %w", err)
		}
		res.Record, res.Revision = res.Lease.Record(), res.Lease.revision()
	}
	return ClaimResult{}, false, fmt.Errorf("%w: every extension of the lease was acknowledged past half its length", context.DeadlineExceeded)
}

// claimRound makes one attempt on s, req.Key's slot; again reports that
// the record changed underneath it and the claim should start over.
// readFirst reads the key before writing (see ClaimRequest.ReadFirst), as
// every round after the first does: the key had a record a moment ago.
func (l *Ledger) claimRound(ctx context.Context, s slot, req ClaimRequest, readFirst bool) (res ClaimResult, again bool, err error) {
	now := l.clock()
	rec := claimed(req, now)
	var e jsbackend.Entry
	if readFirst {
		if e, err = s.bucket.Read(ctx, s.key); err != nil {
			return ClaimResult{}, false, err
		}
	}
	var over bool // a new operation over its budget, parked
	var retryAt time.Time
	if !e.Live() && req.Budget != nil {
		// The claim creates the key's record: a new operation spends
		// from its budget first.
		if over, retryAt, err = l.budgetAllows(ctx, req, now); err != nil {
			return ClaimResult{}, false, err
		}
		if over && !req.Budget.Park {
			return ClaimResult{Outcome: OverBudget, RetryAt: retryAt}, false, nil
		}
	}
	if e.Rev == 0 {
		data, err := rec.marshal()
		if err != nil {
			return ClaimResult{}, false, err
		}
		rev, latest, err := s.bucket.Create(ctx, s.key, data)
		switch {
		case err == nil:
			res := l.held(Acquired, s, req.Key, rev, rec)
			res.OverBudget, res.RetryAt = over, retryAt
			return res, false, nil
		case !errors.Is(err, jsbackend.ErrExists):
			return ClaimResult{}, false, err
		}
		e = latest
	}
	if e.Rev == 0 {
		return ClaimResult{}, true, nil // gone before the read: create again
	}
	// Over a delete marker (an operator's, or an expiry) the key is claimed
	// anew, by compare-and-set on the marker's revision: kv.Create tries that
	// too, but decides on a read a lagging follower may answer.
	step := claimStep{outcome: Acquired, next: rec}
	var cur Record
	if e.Live() {
		if cur, err = decodeRecord(e.Data); err != nil {
			return ClaimResult{}, false, fmt.Errorf("decode record at revision %d: %w", e.Rev, err)
		}
		step = l.policy.claim(cur, e.Rev, req, now)
		if !step.writes() {
			return ClaimResult{Outcome: step.outcome, Record: cur, Revision: e.Rev}, false, nil
		}
	}
	rev, err := l.cas(ctx, s, e.Rev, step.next, jsbackend.Grouped)
	switch {
	case err == nil:
		res := l.held(step.outcome, s, req.Key, rev, step.next)
		if step.outcome == TookOver {
			res.Previous = cur
		}
		if !e.Live() {
			res.OverBudget, res.RetryAt = over, retryAt
		}
		return res, false, nil
	case errors.Is(err, errRevisionMismatch):
		return ClaimResult{}, true, nil // another claimant won: re-read
	}
	return ClaimResult{}, false, err
}

func (l *Ledger) held(o Outcome, s slot, key string, rev uint64, rec Record) ClaimResult {
	return ClaimResult{
		Outcome:  o,
		Record:   rec,
		Revision: rev,
		Lease:    &Lease{ledger: l, slot: s, key: key, rev: rev, rec: leaseRecordOf(rec)},
	}
}
