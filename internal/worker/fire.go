package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// actOnLease decides what a claimant does with the lease it won: hold an
// abandoned operation as uncertain, park it for approval, or fire. again
// reports that the lease was lost before anything happened: claim again.
func (w *Worker) actOnLease(stop, work context.Context, j *job, c claim) (v verdict, again bool) {
	lease, rec, pol := c.Lease, c.Lease.Record(), j.tool.Policy
	var write func(context.Context) (dedup.Record, error)
	switch {
	case c.Outcome == dedup.TookOver && pol.OnAbandoned == effects.AbandonHold:
		w.log.Warn("holder vanished mid-effect; holding the operation as uncertain", zap.String("key", j.id.Key),
			zap.String("previous_holder", c.Previous.Holder), zap.Int("attempt", c.Previous.Attempt))
		reason := fmt.Sprintf("attempt %d (holder %s) was firing this operation when its worker vanished: it may or may not have happened; an operator must resolve it",
			c.Previous.Attempt, c.Previous.Holder)
		write = func(ctx context.Context) (dedup.Record, error) { return lease.Hold(ctx, reason) }
	case pol.Approval && !rec.Approved(time.Now()) && !(c.Outcome == dedup.TookOver && rec.Decision != nil && rec.Decision.Op == intent.ControlApprove):
		// Needs an operator's approval first (or its approval lapsed before
		// the firing started). A takeover of an approved firing goes on.
		envelope, err := json.Marshal(j.env)
		if err != nil {
			return w.reject(j, j.env.Tool, intent.CodeInvalidIntent, err), false
		}
		write = func(ctx context.Context) (dedup.Record, error) { return lease.AwaitApproval(ctx, envelope) }
	default:
		if c.Outcome == dedup.TookOver {
			w.m.takeovers.WithLabelValues(j.env.Tool).Inc()
			w.log.Info("lease taken over", zap.String("key", j.id.Key), zap.Int("attempt", rec.Attempt),
				zap.String("previous_holder", c.Previous.Holder))
		}
		return w.fire(stop, work, j, lease), false
	}
	parked, err := w.record(work, j, write)
	switch {
	case errors.Is(err, dedup.ErrLeaseLost):
		return verdict{}, true
	case err != nil:
		w.log.Warn("record state", zap.String("key", j.id.Key), zap.Error(err))
		return nak(w.retryDelay(j.meta.NumDelivered), "ledger unavailable"), false
	}
	w.audit.recorded(j.id.Key, parked)
	w.answer(j, w.fromRecord(j, parked, false)) // this call parked it
	return ack(), false
}

// fire runs the effect under the lease on a goroutine of its own, to which
// the handler hands the intent (it returns at once): a running effect then
// holds only its own stack, not the handler's, grown by the decoding and the
// claim (10 000 effects in flight cost 16 KiB of stack each on the
// handlers'). Once the effect returns, a handler goroutine (warm: its stack
// grown already) records the outcome by CAS on the lease's revision,
// answers and settles. The returned verdict is not to be settled.
func (w *Worker) fire(stop, work context.Context, j *job, lease lease) verdict {
	ectx, cancel := context.WithCancel(work)
	period := min(j.tool.Lease, w.cfg.AckWait) / 3
	// The heartbeat lives on work, not on the effect's context: it goes on,
	// holding the message and extending the lease, until the outcome is
	// recorded — a holder retrying its completion through a ledger outage
	// must keep both, or another worker would fire the operation again.
	halt := w.beats.guard(work, j.msg, period, j.tool.Lease, func(ctx context.Context) error {
		return lease.Extend(ctx, j.tool.Lease)
	}, func(cutOff bool) {
		if cutOff {
			w.log.Warn("ledger unreachable past the lease deadline; cancelling the effect", zap.String("key", j.id.Key))
		} else {
			w.log.Warn("lease lost while the effect ran; cancelling it", zap.String("key", j.id.Key))
		}
		cancel()
	})
	j.handedOff, j.run = true, nil
	f := &firing{stop: stop, work: work, ectx: ectx, cancel: cancel, halt: halt, j: j, lease: lease}
	go w.runEffect(f)
	return verdict{}
}

// firing is one effect handed off by its handler (see fire).
type firing struct {
	stop, work, ectx context.Context
	cancel           context.CancelFunc
	halt             func()
	j                *job
	lease            lease
	claimed          time.Time
	out              effects.Outcome
	err              error
}

// runEffect is the effect's goroutine: it fires the effect and hands what
// it returned to a handler goroutine (conclude), or concludes itself before
// the worker runs one.
func (w *Worker) runEffect(f *firing) {
	defer w.recoverFiring(f)
	f.claimed = time.Now()
	w.audit.fired(f.j, f.lease)
	f.out, f.err = w.invoke(f.ectx, f.j, f.lease)
	if w.pool == nil {
		w.concludeFiring(f)
		return
	}
	w.pool.runNext(func(r *poolRun) {
		defer w.recoverFiring(f)
		f.j.run = r
		w.concludeFiring(f)
	})
}

// concludeFiring records, answers and settles f.
func (w *Worker) concludeFiring(f *firing) {
	v := w.conclude(f.stop, f.work, f.j, f.lease, f.claimed, f.out, f.err)
	f.halt()
	f.cancel()
	w.finish(f.j, v)
}

// recoverFiring is a firing's recovery from a panic (the effect's, or its
// recording's): the key is given back, so that the redelivery need not wait
// out the lease, and the intent is nak'd.
func (w *Worker) recoverFiring(f *firing) {
	r := recover()
	if r == nil {
		return
	}
	f.cancel()
	_ = f.lease.Release(f.work, f.lease.Record().Attempts)
	w.log.Error("panic handling intent", zap.String("subject", f.j.msg.Subject()), zap.Any("panic", r), zap.Stack("stack"))
	f.halt()
	w.finish(f.j, nak(w.cfg.RetryDelay, "panic"))
}

// invoke fires j's effect. It is all that is on the effect goroutine's stack
// while the effect runs: keep its frame small.
func (w *Worker) invoke(ectx context.Context, j *job, lease lease) (effects.Outcome, error) {
	return j.tool.Effect.Fire(ectx, effects.Call{
		Key:     j.id.Key,
		Tool:    j.env.Tool,
		Session: j.env.Session,
		CallID:  j.env.CallID,
		Args:    j.env.Args,
		Attempt: lease.Record().Attempt,
		Holder:  w.cfg.Holder,
		Trace:   traceHeaders(ectx),
	})
}

// conclude records what the effect returned (out, ferr) under the lease and
// answers j's caller; claimed is when the effect started.
func (w *Worker) conclude(stop, work context.Context, j *job, lease lease, claimed time.Time, out effects.Outcome, ferr error) verdict {
	w.m.effectTime.WithLabelValues(j.env.Tool).Observe(time.Since(claimed).Seconds())
	w.mark(&j.stages.Fired)
	attempts := lease.Record().Attempts + out.Invocations

	var rec dedup.Record
	var err error
	switch o := w.outcomeOf(j, out.Result, ferr); o.kind {
	case outcomeDone:
		w.m.fired.WithLabelValues(j.env.Tool).Inc()
		rec, err = w.record(work, j, func(ctx context.Context) (dedup.Record, error) {
			return lease.Complete(ctx, o.result, attempts)
		})
	case outcomeFailed:
		rec, err = w.record(work, j, func(ctx context.Context) (dedup.Record, error) {
			return lease.Fail(ctx, o.err, attempts)
		})
	default:
		w.log.Info("effect failed transiently; releasing the key", zap.String("key", j.id.Key), zap.Error(o.cause))
		if err := lease.Release(work, attempts); err != nil && !errors.Is(err, dedup.ErrLeaseLost) {
			w.log.Warn("release", zap.String("key", j.id.Key), zap.Error(err))
		}
		w.audit.released(j, attempts, o.cause)
		return nak(w.retryDelay(j.meta.NumDelivered), "effect failed transiently")
	}

	w.mark(&j.stages.Recorded)
	switch {
	case err == nil:
		w.m.claimToDone.WithLabelValues(j.env.Tool).Observe(time.Since(claimed).Seconds())
		w.audit.recorded(j.id.Key, rec)
		w.answers.put(j.id.Key, rec)
		w.answer(j, w.fromRecord(j, rec, false))
		return ack()
	case errors.Is(err, dedup.ErrLeaseLost):
		// Another worker took the key over: never overwrite its record, answer
		// with its outcome once there is one.
		w.log.Warn("lease lost before recording; answering with the holder's outcome", zap.String("key", j.id.Key))
		rec, werr := w.await(stop, j, time.Now().Add(w.cfg.MaxWait))
		if werr == nil && rec.Status.Answered() {
			w.answer(j, w.fromRecord(j, rec, rec.IntentSeq != j.seq))
			return ack()
		}
		return nak(w.cfg.RetryDelay, "lease lost; outcome not recorded yet")
	default:
		// The worker stopped (its drain is over) before the outcome could be
		// recorded: the lease will expire and the key be taken over (the
		// crash window; the forwarded key lets a keyed downstream absorb the
		// repeat).
		w.log.Error("outcome not recorded: the worker stopped before the ledger took it", zap.String("key", j.id.Key), zap.Error(err))
		return nak(w.retryDelay(j.meta.NumDelivered), "outcome not recorded")
	}
}

// traceHeaders are the trace-context headers of ctx's span, for the effect
// to forward (nil when there is no trace).
func traceHeaders(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	h := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, h)
	return h
}

// record runs a lease's write (a completion, a failure, a hold for an
// operator), trying again for as long as the ledger cannot be reached: a
// holder that knows its outcome keeps it until it is recorded, the lease is
// lost (another claimant took over: ErrLeaseLost), or ctx ends (the worker's
// drain is over). Meanwhile j's heartbeat holds the message and extends the
// lease. Each try gets a quarter of the lease: a try whose reply was lost to
// a server restart must not hold the lease's writes (its heartbeat among
// them) for the client's whole request timeout, or another worker would
// confirm the holder gone.
func (w *Worker) record(ctx context.Context, j *job, write func(context.Context) (dedup.Record, error)) (dedup.Record, error) {
	per := min(max(j.tool.Lease/4, 250*time.Millisecond), 5*time.Second)
	pause := 50 * time.Millisecond
	var since, logged time.Time
	for {
		actx, cancel := context.WithTimeout(ctx, per)
		rec, err := write(actx)
		cancel()
		switch {
		case err == nil && !since.IsZero():
			w.log.Info("outcome recorded after the ledger came back", zap.String("key", j.id.Key), zap.Duration("after", time.Since(since)))
			return rec, nil
		case err == nil, errors.Is(err, dedup.ErrLeaseLost), errors.Is(err, dedup.ErrLeaseDone), errors.Is(err, dedup.ErrInvalid), ctx.Err() != nil:
			return rec, err
		}
		now := time.Now()
		if since.IsZero() {
			since = now
			j.detach() // the ledger is out: this may take a while
		}
		if now.Sub(logged) >= time.Minute {
			logged = now
			w.log.Warn("ledger unreachable; keeping the outcome until it can be recorded", zap.String("key", j.id.Key),
				zap.Duration("for", now.Sub(since)), zap.Error(err))
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return rec, err
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}
