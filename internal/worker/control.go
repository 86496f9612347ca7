package worker

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// control applies an operator decision published on the control subjects:
// approve (then fire the approved operation, exactly once however many
// approvals and workers see it), deny, resolve an uncertain outcome, or
// probe one (ask its downstream through the tool's probe). The
// decision's caller is answered with the operation's resulting record;
// callers waiting on the key see it on the ledger. A user's decision
// (intent.ControlUserApprove, ControlUserDeny) applies only to an operation
// whose tool names the user as its approver: any other is refused, nothing
// recorded and nothing fired.
func (w *Worker) control(stop, work context.Context, j *job, subjectOp string) (handled, *firing) {
	c, err := intent.DecodeControl(subjectOp, j.msg.Data())
	if err != nil {
		return w.reject(j, "", intent.CodeInvalidIntent, err), nil
	}
	j.id = intent.Identity{Key: c.Key}
	op, byUser := intent.UserDecision(subjectOp)
	w.log.Info("operator decision", zap.String("op", subjectOp), zap.String("key", c.Key), zap.String("by", c.By))
	w.obs.decision(subjectOp)
	if byUser {
		if err := w.userDecides(stop, c.Key); err != nil {
			return w.undecided(j, err), nil
		}
	}
	var rec dedup.Record
	dctx, wrote := captureReceipt(stop)
	// A decision that changes nothing (approved or denied already) is
	// answered with the record, but is no decision of the trail's.
	dctx, unchanged := dedup.ReportUnchanged(dctx)
	switch op {
	case intent.ControlApprove:
		cur, _, err := w.ledger.Get(stop, c.Key)
		if err != nil {
			return w.undecided(j, err), nil
		}
		tool, known := w.tools.Lookup(cur.Tool)
		ttl := effects.DefaultApprovalTTL
		if known {
			ttl = tool.Policy.ApprovalTTL
		}
		if !intent.ValidKey(c.Key) && intent.CompactLedgerKey(c.Key) && len(cur.Intent) > 0 {
			// The key as a compact ledger lists it: the firing forwards the
			// operation's own key, derived again from the kept intent. (A
			// record that keeps none never awaited approval: the ledger
			// refuses the approval by the key as it is.)
			full, err := fullKey(c.Key, cur, tool, known)
			if err != nil {
				return w.undecided(j, err), nil
			}
			c.Key, j.id.Key = full, full
		}
		actx, unchanged := dedup.ReportUnchanged(stop)
		if rec, _, err = w.ledger.Approve(actx, c.Key, c.Fingerprint, c.By, c.Reason, ttl); err != nil {
			return w.undecided(j, err), nil
		}
		if !*unchanged {
			w.obs.decided(op, c, rec, nil)
		}
		if known && len(rec.Intent) > 0 && (rec.Status == intent.StatusApproved || rec.Status == intent.StatusPending) {
			env, err := intent.Decode(rec.Intent, intent.Limits{MaxBytes: len(rec.Intent) + 1})
			if err != nil {
				return w.undecided(j, fmt.Errorf("the recorded intent does not decode: %w", err)), nil
			}
			// The firing answers the call that parked the operation: its
			// record keeps that call's sequence.
			j.env, j.tool, j.id.Fingerprint, j.seq = env, tool, rec.Fingerprint, rec.IntentSeq
			if n := len(rec.Submissions); n > 0 {
				j.submission = rec.Submissions[n-1]
			}
			return w.claim(stop, work, j) // claim the approved key and fire, or wait for who does
		}
	case intent.ControlDeny:
		if rec, _, err = w.ledger.Deny(dctx, c.Key, c.By, c.Reason); err != nil {
			return w.undecided(j, err), nil
		}
	case intent.ControlResolve:
		if rec, _, err = w.ledger.Resolve(dctx, c.Key, c.Outcome == intent.OutcomeSucceeded, c.Result, c.By, c.Reason); err != nil {
			return w.undecided(j, err), nil
		}
	case intent.ControlProbe:
		// Ask the downstream now: done completes the operation, anything
		// else leaves it uncertain with the new evidence.
		cur, _, err := w.ledger.Get(stop, c.Key)
		if err != nil {
			return w.undecided(j, err), nil
		}
		if rec, err = w.probeUncertain(dctx, c.Key, cur); err != nil {
			return w.undecided(j, err), nil
		}
	}
	if op != intent.ControlApprove && !*unchanged {
		w.obs.decided(op, c, rec, wrote)
	}
	return answered(w.fromRecord(j, rec, false), ack()), nil // the decision's own outcome
}

// userDecides returns nil when the operation of key belongs to a tool whose
// approver is the user at the agent's client, else why a user's decision
// does not apply to it. The decision's subject is all that tells a user's
// decision from an operator's (NATS does not tell the worker who
// published), so the tool's approver is checked here, before anything is
// recorded.
func (w *Worker) userDecides(ctx context.Context, key string) error {
	cur, _, err := w.ledger.Get(ctx, key)
	if err != nil {
		return err
	}
	if tool, known := w.tools.Lookup(cur.Tool); !known || !tool.Policy.UserApproves {
		return fmt.Errorf("%w: %s: tool %q is approved by an operator, not by the user at the client: "+
			"a user's decision does not apply to it (an operator approves or denies it)", dedup.ErrInvalid, key, cur.Tool)
	}
	return nil
}

// undecided answers a decision that could not be applied. A decision that
// does not apply (no such key, wrong state, other arguments) is answered and
// acknowledged — it is an answer, not a poison message; a ledger that cannot
// be reached is retried later.
func (w *Worker) undecided(j *job, err error) handled {
	var code string
	switch {
	case errors.Is(err, dedup.ErrNotFound):
		code = intent.CodeNotFound
	case errors.Is(err, dedup.ErrWrongState):
		code = intent.CodeWrongState
	case errors.Is(err, dedup.ErrFingerprintMismatch):
		code = intent.CodeConflict
	case errors.Is(err, dedup.ErrInvalid), errors.Is(err, intent.ErrInvalid):
		code = intent.CodeInvalidIntent
	default:
		w.log.Warn("operator decision", zap.String("key", j.id.Key), zap.Error(err))
		return unanswered(nak(w.retryDelay(j.meta.NumDelivered), "ledger unavailable"))
	}
	res := intent.Rejected(code, err.Error())
	res.Key = j.id.Key
	return answered(res, ack())
}

// fullKey returns the derived key whose compact ledger key is stored, from
// the intent rec keeps: an approval fires the operation, which must carry
// its own key downstream, as every other attempt of it does.
func fullKey(stored string, rec dedup.Record, tool *effects.Tool, known bool) (string, error) {
	how := "approve it by its full key (submit key prints it from the tool and arguments)"
	if !known || len(rec.Intent) == 0 {
		return "", fmt.Errorf("%w: %s: the record keeps no intent of a known tool to derive its key from: %s", dedup.ErrInvalid, stored, how)
	}
	env, err := intent.Decode(rec.Intent, intent.Limits{MaxBytes: len(rec.Intent) + 1})
	if err != nil {
		return "", fmt.Errorf("%w: %s: the recorded intent does not decode (%w): %s", dedup.ErrInvalid, stored, err, how)
	}
	id, err := intent.Derive(env, tool.KeySpec, rec.CreatedAt)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w: %s", dedup.ErrInvalid, stored, err, how)
	}
	if sk, err := intent.LedgerKey(id.Key, intent.LayoutCompact); err != nil || sk != stored {
		return "", fmt.Errorf("%w: %s: the recorded intent derives another key (%s): %s", dedup.ErrInvalid, stored, id.Key, how)
	}
	return id.Key, nil
}
