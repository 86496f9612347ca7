package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/intent"
	"github.com/idemgate/idemgate/pkg/retry"
)

// claim claims j's key in the ledger and acts on what it finds, round by
// round: a lease it won is acted on (act.go); a record that answers the
// intent is replayed; a live holder is waited for, and one whose lease
// expired is confirmed gone before its lease is taken over. While the
// ledger cannot be reached it holds the intent (no delivery is spent) and
// tries again: an outage delays an operation, it never ends one.
func (w *Worker) claim(stop, work context.Context, j *job) (handled, *firing) {
	if rec, ok := w.answers.get(j.id.Key); ok && !retries(j, rec) {
		// A final record this worker wrote or read a moment ago: no need
		// to ask the ledger again.
		w.obs.cached(j)
		return w.replay(j, rec), nil
	}
	req := dedup.ClaimRequest{
		Key:         j.id.Key,
		Tool:        j.env.Tool,
		Fingerprint: j.id.Fingerprint,
		Holder:      w.cfg.Holder,
		Lease:       j.tool.Lease,
		IntentSeq:   j.seq,
		CallID:      j.env.CallID,
		Submission:  j.submission,
		Session:     j.env.Session,
		Retention:   j.tool.Policy.Retention,
		Budget:      budgetOf(j),
		// Delivered before: the key most likely has a record already.
		ReadFirst:   j.meta.NumDelivered > 1,
		RetryFailed: j.tool.Policy.OnFailure == intent.OnFailureRetry,
	}
	outage := w.outage(stop, j)
	waitUntil := time.Now().Add(w.cfg.MaxWait)
	for {
		c, err := w.ledger.Claim(stop, req)
		if err != nil {
			if outage.wait(err) {
				continue
			}
			w.log.Warn("claim", zap.String("key", req.Key), zap.Error(err))
			return unanswered(outage.giveUp(w.retryDelay(j.meta.NumDelivered))), nil
		}
		outage.over()
		w.obs.claimed(j)
		var r round
		switch {
		case c.Outcome == dedup.Acquired, c.Outcome == dedup.TookOver:
			r = w.act(stop, work, j, c, req.Confirmed != 0)
		case c.Outcome == dedup.Done, c.Outcome == dedup.Conflict:
			w.remember(j, c.Record)
			r = ended(w.replay(j, c.Record))
		case c.Outcome == dedup.OverBudget:
			r = ended(w.overBudget(j, c.RetryAt))
		case c.Outcome == dedup.Busy && abandoned(c.Record) && w.triedOut(j, c.Record):
			r = ended(unanswered(term(fmt.Sprintf("max deliveries (%d) reached: its operation was tried %d times and its last holder vanished",
				w.cfg.MaxDeliver, c.Record.Attempt))))
		case c.Outcome == dedup.Busy && abandoned(c.Record):
			if r = w.confirm(stop, j, c.Revision, outage); r.confirmed {
				req.Confirmed = c.Revision
			}
		case c.Outcome == dedup.Busy:
			r = w.waitHolder(stop, j, c.Record.Holder, waitUntil)
		default:
			r = ended(unanswered(nak(w.cfg.RetryDelay, "unknown claim outcome")))
		}
		if !r.again {
			return r.handled, r.firing
		}
	}
}

// round is what one round of the claim stage came to: the intent handled,
// its effect handed to a firing, or again: claim once more (confirmed
// reports the holder found gone at the revision claimed).
type round struct {
	handled   handled
	firing    *firing
	again     bool
	confirmed bool
}

func ended(h handled) round { return round{handled: h} }

// claimAgain is a round that claims once more.
var claimAgain = round{again: true}

// replay answers j from rec, a record of its key that answers it without
// this worker firing: a conflict when the fingerprints differ (Claim reports
// that as Conflict, Done otherwise), else the record's outcome — a replay
// unless j's own call caused it (the same intent delivered again, or a copy
// of the same call).
func (w *Worker) replay(j *job, rec dedup.Record) handled {
	res := w.fromRecord(j, rec, !rec.CausedBy(j.seq, j.submission))
	w.obs.replayed(j, &res, rec.Fingerprint != j.id.Fingerprint) // a conflict's receipt
	return answered(res, ack())
}

// remember keeps rec, a record of j's key, in the answer cache — unless it
// is a failure j's tool retries: the next call runs again, so the failure
// must never answer it.
func (w *Worker) remember(j *job, rec dedup.Record) {
	if !retries(j, rec) {
		w.answers.put(j.id.Key, rec)
	}
}

// retries reports whether rec is a failure that j's tool runs again on the
// next call (intent.OnFailureRetry).
func retries(j *job, rec dedup.Record) bool {
	return rec.Status == intent.StatusFailed && j.tool != nil && j.tool.Policy.OnFailure == intent.OnFailureRetry
}

// triedOut reports whether j, delivered past Config.MaxDeliver, finds its
// operation tried as often already: rec, its record, was claimed that many
// times, each holder vanishing mid-try. A delivery spent waiting tried
// nothing, so only the record tells (see overdueAfter).
func (w *Worker) triedOut(j *job, rec dedup.Record) bool {
	return j.meta.NumDelivered > uint64(w.cfg.MaxDeliver) && rec.Attempt >= w.cfg.MaxDeliver
}

// abandoned reports whether rec's holder may have vanished: pending, not
// released, its lease expired.
func abandoned(rec dedup.Record) bool {
	return rec.Status == intent.StatusPending && !rec.Released() && rec.LeaseExpired(time.Now())
}

// confirm confirms that the holder of an expired lease at revision rev is
// gone — its record stays unchanged for a grace period on this worker's
// clock — before the next round takes the lease over (confirmed). After an
// outage of the ledger every live lease has expired at once; a live holder
// extends (or records) within its heartbeat period, shorter than the grace.
func (w *Worker) confirm(stop context.Context, j *job, rev uint64, outage *ledgerOutage) round {
	changed, err := w.confirmAbandoned(stop, j, rev)
	switch {
	case err != nil && outage.wait(err):
		// The grace proved nothing while the ledger could not be read:
		// count it again once it can.
		return claimAgain
	case err != nil:
		return ended(unanswered(outage.giveUp(w.retryDelay(j.meta.NumDelivered))))
	}
	return round{again: true, confirmed: !changed}
}

// waitHolder waits for the outcome of a live holder (push, not poll) up to
// its lease, bounded by until unless this is the last delivery, and replays
// it; a lease that expired or was released meanwhile is claimed again.
func (w *Worker) waitHolder(stop context.Context, j *job, holder string, until time.Time) round {
	w.log.Debug("waiting for the holder", zap.String("key", j.id.Key), zap.String("holder", holder))
	rec, err := w.await(stop, j, until)
	switch {
	case err == nil && rec.Status.Answered():
		w.remember(j, rec)
		if rec.Fingerprint == j.id.Fingerprint {
			w.obs.coalesced(j)
		}
		return ended(w.replay(j, rec))
	case err == nil, errors.Is(err, dedup.ErrReleased):
		return claimAgain // the lease expired or was released
	default:
		return ended(unanswered(requeue(w.cfg.RetryDelay, "holder still in flight")))
	}
}

// confirmAbandoned watches the key for the takeover grace (one more lease of
// the tool) and reports whether its record moved past rev meanwhile. A live
// holder cut off by an outage reconnects, and extends or records, well within
// it: its heartbeat runs every third of a lease.
func (w *Worker) confirmAbandoned(stop context.Context, j *job, rev uint64) (bool, error) {
	ctx, cancel := context.WithTimeout(stop, j.tool.Lease)
	defer cancel()
	j.detach()
	changed, err := w.ledger.WaitChange(ctx, j.id.Key, rev)
	if err == nil && !changed && stop.Err() != nil {
		return false, stop.Err() // stopping, not confirmed
	}
	return changed, err
}

// await waits for the key's holder, keeping the message alive meanwhile.
func (w *Worker) await(stop context.Context, j *job, until time.Time) (dedup.Record, error) {
	ctx, cancel := context.WithCancel(stop)
	if !w.lastDelivery(j) {
		ctx, cancel = context.WithDeadline(stop, until)
	}
	defer cancel()
	j.detach()
	rec, _, err := w.ledger.Wait(ctx, j.id.Key)
	return rec, err
}

// ledgerOutage holds one intent through an outage of the ledger: the
// handler pauses between tries, backing off, while the intent's keep-alive
// holds its message.
type ledgerOutage struct {
	w      *Worker
	stop   context.Context
	j      *job
	pauses backoff.BackOff // of this outage: 100ms doubling up to 2s
	since  time.Time
	on     bool // in an outage
}

func (w *Worker) outage(stop context.Context, j *job) *ledgerOutage {
	return &ledgerOutage{w: w, stop: stop, j: j}
}

// wait holds the intent and pauses before the next try; false when the
// worker is stopping (or err is not the ledger being unreachable), so that
// the intent is left to another worker.
func (o *ledgerOutage) wait(err error) bool {
	if o.stop.Err() != nil || !unavailable(err) {
		return false
	}
	if !o.on {
		o.j.detach()
		o.since, o.on = time.Now(), true
		o.pauses = retry.Doubling(o.stop, 100*time.Millisecond, 2*time.Second)
		o.w.log.Warn("ledger unreachable; holding the intent until it is back", zap.String("key", o.j.id.Key), zap.Error(err))
	}
	return retry.Wait(o.stop, o.pauses)
}

// giveUp is the verdict of an intent whose claim ended on a ledger error:
// delivered again after delay — as a wait (requeue) when the worker is
// stopping, which tried nothing.
func (o *ledgerOutage) giveUp(delay time.Duration) verdict {
	if o.stop.Err() != nil {
		return requeue(delay, "worker stopping while the ledger was unreachable")
	}
	return nak(delay, "ledger unavailable")
}

// over ends the outage once the ledger answered.
func (o *ledgerOutage) over() {
	if o.on {
		o.w.log.Info("ledger reachable again", zap.String("key", o.j.id.Key), zap.Duration("after", time.Since(o.since)))
		o.on = false
	}
}

// budgetOf is the effect budget a claim of j spends from: its tool's, counted
// per session or for the whole tool; nil for a tool without one.
func budgetOf(j *job) *dedup.Budget {
	b := j.tool.Policy.Budget
	if b.Max == 0 {
		return nil
	}
	scope := ""
	if b.Per == intent.BudgetPerSession {
		scope = "session:" + j.env.Session
	}
	return &dedup.Budget{Scope: scope, Max: b.Max, Window: b.Window, Park: b.OverBudget == intent.OverBudgetApprove}
}

// overBudget answers j, a new operation over its tool's budget, with
// budget_exceeded: nothing fired, nothing recorded; the same call runs once
// the window ends, at retryAt.
func (w *Worker) overBudget(j *job, retryAt time.Time) handled {
	w.obs.overBudget(j)
	b := j.tool.Policy.Budget
	scope := fmt.Sprintf("session %q", j.env.Session)
	if b.Per == intent.BudgetPerTool {
		scope = "all callers together"
	}
	res := intent.Rejected(intent.CodeBudgetExceeded, fmt.Sprintf(
		"tool %s allows %d distinct operations per %s in a window of %s, and %s ran them: nothing was done; the same call may run from %s",
		j.env.Tool, b.Max, b.Per, b.Window, scope, retryAt.Format(time.RFC3339)))
	res.Key, res.Tool, res.Fingerprint, res.CallID, res.RetryAt = j.id.Key, j.env.Tool, j.id.Fingerprint, j.env.CallID, retryAt
	return answered(res, ack())
}
