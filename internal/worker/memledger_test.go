package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
)

// memLedger is an in-memory ledger for the stages' unit tests. It keeps the
// contract the worker relies on (ledger), as TestLedgerContract checks
// against the JetStream ledger: a claim creates a key's record only when
// the key has none, every write is a compare-and-set on the revision it
// was made on, and an expired lease is taken over only at the revision the
// claimant confirmed abandoned. Receipts, TTLs and partitions are not kept.
type memLedger struct {
	mu      sync.Mutex
	recs    map[string]memEntry
	rev     uint64        // the latest revision of any key
	changed chan struct{} // closed (and replaced) by every write
	// fault, when set, is asked before each claim and lease write (op:
	// "claim", "extend", "complete", "fail", "release", "await approval",
	// "hold"): an error it returns is the call's, and nothing is written.
	fault func(op string) error
	// waits, when set, gets the key of each Wait once it has read the
	// record it waits on (a change made after that wakes it).
	waits chan string
}

type memEntry struct {
	rec dedup.Record
	rev uint64
}

var _ ledger = (*memLedger)(nil)

func newMemLedger() *memLedger {
	return &memLedger{recs: map[string]memEntry{}, changed: make(chan struct{})}
}

// errStaleRevision is the fake's refusal of a compare-and-set.
var errStaleRevision = errors.New("memledger: revision mismatch")

// put writes rec under key by compare-and-set on rev (0: the key has no
// record); l.mu is held.
func (l *memLedger) put(key string, rev uint64, rec dedup.Record) (uint64, error) {
	if l.recs[key].rev != rev {
		return 0, fmt.Errorf("%s at revision %d: %w", key, rev, errStaleRevision)
	}
	l.rev++
	l.recs[key] = memEntry{rec: rec, rev: l.rev}
	close(l.changed)
	l.changed = make(chan struct{})
	return l.rev, nil
}

// set writes rec under key whatever is there: another worker's doing.
func (l *memLedger) set(key string, rec dedup.Record) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	rev, _ := l.put(key, l.recs[key].rev, rec)
	return rev
}

// remove deletes key's record, as an operator's forget does.
func (l *memLedger) remove(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.recs, key)
	l.rev++
	close(l.changed)
	l.changed = make(chan struct{})
}

// len is the number of records.
func (l *memLedger) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.recs)
}

// read is key's record, its revision (0: none) and the channel the next
// write closes.
func (l *memLedger) read(key string) (memEntry, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recs[key], l.changed
}

func (l *memLedger) faulty(op string) error {
	if l.fault == nil {
		return nil
	}
	return l.fault(op)
}

func (l *memLedger) Claim(_ context.Context, req dedup.ClaimRequest) (claim, error) {
	if err := l.faulty("claim"); err != nil {
		return claim{}, err
	}
	if req.Lease == 0 {
		req.Lease = dedup.DefaultLease
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now().UTC()
	e, ok := l.recs[req.Key]
	if !ok || e.rec.Status == intent.StatusForgotten { // a forgotten record is claimed anew, by CAS on its revision
		rec := dedup.Record{Status: intent.StatusPending, Tool: req.Tool, Session: req.Session, Fingerprint: req.Fingerprint,
			Holder: req.Holder, LeaseUntil: now.Add(req.Lease), Attempt: 1, IntentSeq: req.IntentSeq, CallID: req.CallID,
			CreatedAt: now, UpdatedAt: now}
		if req.Submission != "" {
			rec.Submissions = []string{req.Submission}
		}
		rev, err := l.put(req.Key, e.rev, rec)
		return l.held(dedup.Acquired, req.Key, rev, rec), err
	}
	cur := e.rec
	found := claim{ClaimResult: dedup.ClaimResult{Outcome: dedup.Busy, Record: cur, Revision: e.rev}}
	switch {
	case cur.Fingerprint != req.Fingerprint:
		found.Outcome = dedup.Conflict
	case cur.Status == intent.StatusFailed && req.RetryFailed && !cur.RanBy(req.IntentSeq, req.Submission):
		next := cur
		next.Status, next.Holder, next.LeaseUntil, next.Attempt = intent.StatusPending, req.Holder, now.Add(req.Lease), cur.Attempt+1
		next.IntentSeq, next.CallID, next.UpdatedAt = req.IntentSeq, req.CallID, now
		if req.Submission != "" {
			next.Submissions = append(slices.Clone(cur.Submissions), req.Submission)
		}
		next.Result, next.Error, next.Receipt, next.Decision, next.CompletedAt = nil, nil, nil, nil, time.Time{}
		rev, err := l.put(req.Key, e.rev, next)
		return l.held(dedup.Acquired, req.Key, rev, next), err
	case cur.Status.Answered():
		found.Outcome = dedup.Done
	case cur.Status == intent.StatusPending && cur.LeaseExpired(now) && !cur.Released() && req.Confirmed != e.rev:
		// expired, not yet confirmed abandoned: Busy
	case cur.Status == intent.StatusApproved, cur.Status == intent.StatusPending && cur.LeaseExpired(now):
		next := cur
		next.Status, next.Holder, next.LeaseUntil, next.Attempt = intent.StatusPending, req.Holder, now.Add(req.Lease), cur.Attempt+1
		next.IntentSeq, next.CallID, next.UpdatedAt = req.IntentSeq, req.CallID, now
		if cur.Released() || cur.Status == intent.StatusApproved {
			rev, err := l.put(req.Key, e.rev, next)
			return l.held(dedup.Acquired, req.Key, rev, next), err
		}
		next.Attempts++ // the vanished holder's attempt may have reached the effect
		rev, err := l.put(req.Key, e.rev, next)
		took := l.held(dedup.TookOver, req.Key, rev, next)
		took.Previous = cur
		return took, err
	}
	return found, nil
}

func (l *memLedger) held(o dedup.Outcome, key string, rev uint64, rec dedup.Record) claim {
	return claim{ClaimResult: dedup.ClaimResult{Outcome: o, Record: rec, Revision: rev}, Lease: &memLease{l: l, key: key, rev: rev, rec: rec}}
}

func (l *memLedger) Get(_ context.Context, key string) (dedup.Record, uint64, error) {
	e, _ := l.read(key)
	if e.rev == 0 {
		return dedup.Record{}, 0, fmt.Errorf("get %s: %w", key, dedup.ErrNotFound)
	}
	return e.rec, e.rev, nil
}

// Wait returns key's record once it is answered, or pending with its lease
// expired or released; dedup.ErrReleased once it is deleted.
func (l *memLedger) Wait(ctx context.Context, key string) (dedup.Record, uint64, error) {
	for first := true; ; first = false {
		e, changed := l.read(key)
		if first && l.waits != nil {
			l.waits <- key
		}
		leased := e.rev != 0 && !e.rec.LeaseUntil.IsZero()
		if e.rev != 0 && e.rec.Status == intent.StatusForgotten {
			return e.rec, e.rev, fmt.Errorf("wait %s: %w: %w", key, dedup.ErrForgotten, dedup.ErrReleased)
		}
		if e.rev != 0 && (e.rec.Status.Answered() || leased && e.rec.LeaseExpired(time.Now())) {
			return e.rec, e.rev, nil
		}
		expiry := time.NewTimer(time.Hour)
		if leased {
			expiry.Reset(time.Until(e.rec.LeaseUntil))
		}
		select {
		case <-ctx.Done():
			expiry.Stop()
			return dedup.Record{}, 0, fmt.Errorf("wait %s: %w", key, ctx.Err())
		case <-expiry.C:
		case <-changed:
			expiry.Stop()
			if now, _ := l.read(key); now.rev == 0 && e.rev != 0 {
				return dedup.Record{}, 0, fmt.Errorf("wait %s: %w", key, dedup.ErrReleased)
			}
		}
	}
}

// WaitChange reports whether key's record moves past rev before ctx ends.
func (l *memLedger) WaitChange(ctx context.Context, key string, rev uint64) (bool, error) {
	for {
		e, changed := l.read(key)
		if e.rev != rev {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, nil
		case <-changed:
		}
	}
}

// decide applies an operator's change to key's record by compare-and-set.
func (l *memLedger) decide(key string, change func(*dedup.Record, time.Time) (bool, error)) (dedup.Record, uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.recs[key]
	if !ok {
		return dedup.Record{}, 0, fmt.Errorf("decide %s: %w", key, dedup.ErrNotFound)
	}
	rec := e.rec
	changed, err := change(&rec, time.Now().UTC())
	if err != nil || !changed {
		return e.rec, e.rev, err
	}
	rev, err := l.put(key, e.rev, rec)
	return rec, rev, err
}

func (l *memLedger) Approve(_ context.Context, key, fingerprint, by, reason string, ttl time.Duration) (dedup.Record, uint64, error) {
	return l.decide(key, func(rec *dedup.Record, now time.Time) (bool, error) {
		switch {
		case fingerprint != "" && fingerprint != rec.Fingerprint:
			return false, dedup.ErrFingerprintMismatch
		case rec.Decision != nil && rec.Decision.Op == intent.ControlApprove:
			return false, nil
		case rec.Status != intent.StatusAwaitingApproval:
			return false, dedup.ErrWrongState
		}
		rec.Status = intent.StatusApproved
		rec.Decision = &dedup.Decision{Op: intent.ControlApprove, By: by, Reason: reason, At: now, Until: now.Add(ttl)}
		return true, nil
	})
}

func (l *memLedger) Deny(_ context.Context, key, by, reason string) (dedup.Record, uint64, error) {
	return l.decide(key, func(rec *dedup.Record, now time.Time) (bool, error) {
		if rec.Status != intent.StatusAwaitingApproval && rec.Status != intent.StatusApproved {
			return false, dedup.ErrWrongState
		}
		rec.Status, rec.CompletedAt, rec.Intent = intent.StatusDenied, now, nil
		rec.Error = &intent.Error{Code: intent.CodeDenied, Message: "denied by " + by + ": " + reason}
		rec.Decision = &dedup.Decision{Op: intent.ControlDeny, By: by, Reason: reason, At: now}
		return true, nil
	})
}

func (l *memLedger) Resolve(_ context.Context, key string, succeeded bool, result json.RawMessage, by, reason string) (dedup.Record, uint64, error) {
	return l.decide(key, func(rec *dedup.Record, now time.Time) (bool, error) {
		if rec.Status != intent.StatusUncertain {
			return false, dedup.ErrWrongState
		}
		rec.Status, rec.Result, rec.CompletedAt = intent.StatusCompleted, result, now
		if !succeeded {
			rec.Status, rec.Result = intent.StatusFailed, nil
			rec.Error = &intent.Error{Code: intent.CodeEffectFailed, Message: "resolved as failed: " + reason}
		}
		rec.Decision = &dedup.Decision{Op: intent.ControlResolve, By: by, Reason: reason, At: now}
		return true, nil
	})
}

// memLease is a lease on a memLedger key: each write a compare-and-set on
// the lease's revision.
type memLease struct {
	l   *memLedger
	key string

	mu   sync.Mutex
	rev  uint64
	rec  dedup.Record
	done bool
}

var _ lease = (*memLease)(nil)

func (ls *memLease) Record() dedup.Record {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.rec
}

func (ls *memLease) write(op string, final bool, change func(*dedup.Record, time.Time)) (dedup.Record, error) {
	if err := ls.l.faulty(op); err != nil {
		return dedup.Record{}, err
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.done {
		return dedup.Record{}, fmt.Errorf("%s %s: %w", op, ls.key, dedup.ErrLeaseDone)
	}
	now := time.Now().UTC()
	next := ls.rec
	change(&next, now)
	next.UpdatedAt = now
	ls.l.mu.Lock()
	rev, err := ls.l.put(ls.key, ls.rev, next)
	ls.l.mu.Unlock()
	if err != nil {
		return dedup.Record{}, fmt.Errorf("%s %s: %w", op, ls.key, dedup.ErrLeaseLost)
	}
	ls.rev, ls.rec, ls.done = rev, next, final
	return next, nil
}

func (ls *memLease) Extend(_ context.Context, d time.Duration) error {
	_, err := ls.write("extend", false, func(r *dedup.Record, now time.Time) { r.LeaseUntil = now.Add(d) })
	return err
}

func (ls *memLease) Complete(_ context.Context, result json.RawMessage, attempts int) (dedup.Record, error) {
	return ls.write("complete", true, func(r *dedup.Record, now time.Time) {
		r.Status, r.Result, r.Error, r.Attempts, r.LeaseUntil, r.CompletedAt = intent.StatusCompleted, result, nil, attempts, time.Time{}, now
	})
}

func (ls *memLease) Fail(_ context.Context, e intent.Error, attempts int) (dedup.Record, error) {
	return ls.write("fail", true, func(r *dedup.Record, now time.Time) {
		r.Status, r.Result, r.Error, r.Attempts, r.LeaseUntil, r.CompletedAt = intent.StatusFailed, nil, &e, attempts, time.Time{}, now
	})
}

func (ls *memLease) Release(_ context.Context, attempts int) error {
	_, err := ls.write("release", true, func(r *dedup.Record, now time.Time) {
		r.Holder, r.LeaseUntil, r.Attempts = "", now, attempts
	})
	return err
}

func (ls *memLease) AwaitApproval(_ context.Context, envelope json.RawMessage) (dedup.Record, error) {
	return ls.write("await approval", true, func(r *dedup.Record, _ time.Time) {
		r.Status, r.Intent, r.Holder, r.LeaseUntil = intent.StatusAwaitingApproval, envelope, "", time.Time{}
	})
}

func (ls *memLease) Hold(_ context.Context, reason string) (dedup.Record, error) {
	return ls.write("hold", true, func(r *dedup.Record, _ time.Time) {
		r.Status, r.Holder, r.LeaseUntil = intent.StatusUncertain, "", time.Time{}
		r.Error = &intent.Error{Code: intent.CodeUncertain, Message: reason}
	})
}

func (ls *memLease) NoteProbe(_ context.Context, p dedup.Probe) error {
	_, err := ls.write("note probe", false, func(r *dedup.Record, _ time.Time) { r.Probe = &p })
	return err
}

func (ls *memLease) SettleProbed(_ context.Context, p dedup.Probe, result json.RawMessage) (dedup.Record, error) {
	return ls.write("settle probed", true, func(r *dedup.Record, now time.Time) {
		r.Status, r.Result, r.Error, r.LeaseUntil, r.CompletedAt = intent.StatusCompleted, result, nil, time.Time{}, now
		r.Probe = &p
	})
}

func (l *memLedger) ProbeUncertain(_ context.Context, key string, p dedup.Probe, result json.RawMessage) (dedup.Record, uint64, error) {
	return l.decide(key, func(rec *dedup.Record, now time.Time) (bool, error) {
		if rec.Status != intent.StatusUncertain {
			return false, dedup.ErrWrongState
		}
		rec.Probe = &p
		if p.Verdict == dedup.ProbeDone {
			rec.Status, rec.Result, rec.Error, rec.CompletedAt = intent.StatusCompleted, result, nil, now
		}
		return true, nil
	})
}
