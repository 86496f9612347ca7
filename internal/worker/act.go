package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// act is what a claimant does with the lease it won (dedup.Acquired,
// dedup.TookOver; confirmed: a takeover after the grace): by the tool's
// policy, an operation abandoned mid-effect is held as uncertain
// (on_abandoned: hold), one that needs an operator's approval is parked for
// it, and any other is fired: handed to a firing.
// The trail records the claim (observe.tookOver, parked, firing): a
// takeover before anything else happens, its probe included; a claim (not
// a takeover) fired at once with its firing, in one event. A lease lost
// before anything happened is claimed again.
func (w *Worker) act(stop, work context.Context, j *job, c claim, confirmed bool) round {
	rec, pol := c.Lease.Record(), j.tool.Policy
	if c.Outcome == dedup.TookOver {
		w.obs.tookOver(j, c.ClaimResult, confirmed)
	}
	var verdict effects.Verdict
	if c.Outcome == dedup.TookOver && j.tool.Prober != nil {
		// Ask the downstream first: an operation it has done is settled
		// with its result, one it has not is fired whatever on_abandoned
		// says, and on_abandoned decides only when it cannot tell.
		r, v, settled := w.probeTakeover(work, j, c)
		if settled {
			return r
		}
		verdict = v
	}
	switch {
	case c.Outcome == dedup.TookOver && pol.OnAbandoned == intent.AbandonHold && verdict != effects.VerdictNotDone:
		return w.holdUncertain(work, j, c)
	case c.OverBudget:
		// A new operation over its tool's budget (over_budget: approve):
		// parked, uncounted, until an operator decides.
		w.obs.parked(j, c.ClaimResult, confirmed, true)
		return w.parkForApproval(work, j, c.Lease)
	case pol.Approval && !rec.Approved(time.Now()) && !(c.Outcome == dedup.TookOver && rec.Decision != nil && rec.Decision.Op == intent.ControlApprove):
		// Needs an operator's approval first (or its approval lapsed before
		// the firing started). A takeover of an approved firing goes on.
		w.obs.parked(j, c.ClaimResult, confirmed, false)
		return w.parkForApproval(work, j, c.Lease)
	}
	if c.Outcome == dedup.TookOver {
		w.log.Info("lease taken over", zap.String("key", j.id.Key), zap.Int("attempt", rec.Attempt),
			zap.String("previous_holder", c.Previous.Holder))
	}
	f := w.firing(stop, work, j, c.Lease)
	w.obs.firing(f, c.ClaimResult, confirmed)
	return round{firing: f}
}

// holdUncertain holds an operation whose holder vanished mid-effect as
// uncertain: it may or may not have happened, and an operator resolves it.
func (w *Worker) holdUncertain(work context.Context, j *job, c claim) round {
	w.log.Warn("holder vanished mid-effect; holding the operation as uncertain", zap.String("key", j.id.Key),
		zap.String("previous_holder", c.Previous.Holder), zap.Int("attempt", c.Previous.Attempt))
	reason := fmt.Sprintf("attempt %d (holder %s) was firing this operation when its worker vanished: it may or may not have happened; an operator must resolve it",
		c.Previous.Attempt, c.Previous.Holder)
	return w.leaveToOperator(work, j, func(ctx context.Context) (dedup.Record, error) { return c.Lease.Hold(ctx, reason) })
}

// parkForApproval parks the operation until an operator decides; its
// record keeps the intent, which an approval fires.
func (w *Worker) parkForApproval(work context.Context, j *job, l lease) round {
	envelope, err := json.Marshal(j.env)
	if err != nil {
		return ended(w.reject(j, j.env.Tool, intent.CodeInvalidIntent, err))
	}
	return w.leaveToOperator(work, j, func(ctx context.Context) (dedup.Record, error) { return l.AwaitApproval(ctx, envelope) })
}

// leaveToOperator records a state that waits for an operator (uncertain,
// awaiting approval) with the lease's write and answers with it: this call
// parked the operation.
func (w *Worker) leaveToOperator(work context.Context, j *job, write func(context.Context) (dedup.Record, error)) round {
	rec, err := w.record(work, j, write)
	switch {
	case errors.Is(err, dedup.ErrLeaseLost):
		return claimAgain
	case err != nil:
		w.log.Warn("record state", zap.String("key", j.id.Key), zap.Error(err))
		return ended(unanswered(nak(w.retryDelay(j.meta.NumDelivered), "ledger unavailable")))
	}
	return ended(answered(w.fromRecord(j, rec, false), ack()))
}
