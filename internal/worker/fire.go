package worker

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/effects"
)

// firing is an effect its handler hands off to a goroutine of its own
// (fire): a running effect then holds only its own stack, not the
// handler's, grown by the decoding and the claim (10 000 effects in flight
// cost 16 KiB of stack each on the handlers'). It carries the intent, the
// lease the effect fires under, the handler's contexts (stop, work) for the
// conclusion, the effect's own context, and the heartbeat that holds the
// message and extends the lease until the outcome is recorded.
type firing struct {
	j          *job
	lease      lease
	stop, work context.Context
	ctx        context.Context // the effect's: cancelled when the lease is lost
	cancel     context.CancelFunc
	halt       func() // stops the heartbeat
	started    time.Time
	claimed    *audit.Event // the claim's event, recorded with the firing's (nil: recorded already, or no trail)
	out        effects.Outcome
	err        error
}

// firing makes the hand-off of j's effect under lease: its context and its
// heartbeat, which starts now. The job leaves its handler's goroutine.
func (w *Worker) firing(stop, work context.Context, j *job, lease lease) *firing {
	ectx, cancel := context.WithCancel(work)
	period := min(j.tool.Lease, w.cfg.AckWait) / 3
	// The heartbeat lives on work, not on the effect's context: it goes on
	// extending the lease (the intent's keep-alive holds the message) until
	// the outcome is recorded — a holder retrying its completion through a
	// ledger outage must keep both, or another worker would fire the
	// operation again.
	halt := w.beats.guard(work, nil, period, j.tool.Lease, func(ctx context.Context) error {
		return lease.Extend(ctx, j.tool.Lease)
	}, func(cutOff bool) {
		if cutOff {
			w.log.Warn("ledger unreachable past the lease deadline; cancelling the effect", zap.String("key", j.id.Key))
		} else {
			w.log.Warn("lease lost while the effect ran; cancelling it", zap.String("key", j.id.Key))
		}
		cancel()
	})
	j.seat.run = nil
	return &firing{j: j, lease: lease, stop: stop, work: work, ctx: ectx, cancel: cancel, halt: halt}
}

// start records the firing in the trail (with the claim's event, which is
// then let go) on the handler's goroutine, before the hand-off: the
// effect's goroutine runs nothing but the effect, on a small stack. false:
// it panicked, and the recovery finished the intent.
func (w *Worker) start(f *firing) (started bool) {
	defer w.recoverFiring(f)
	f.started = time.Now()
	w.audit.fired(f.j, f.lease, f.claimed)
	f.claimed = nil
	return true
}

// fire is the effect's goroutine: it fires the effect (start has recorded
// the firing), then hands the conclusion — recording the outcome
// (conclude), answering and settling (finish) — to a handler goroutine,
// warm: its stack grown already.
func (w *Worker) fire(f *firing) {
	defer w.recoverFiring(f)
	f.out, f.err = w.invoke(f.ctx, f.j, f.lease)
	w.pool.runNext(func(r *poolRun) {
		defer w.recoverFiring(f)
		f.j.seat.run = r
		h := w.conclude(f)
		f.halt()
		f.cancel()
		w.finish(f.work, f.j, h)
	})
}

// recoverFiring is a firing's recovery from a panic (the effect's, or its
// recording's): the key is given back, so that the redelivery need not wait
// out the lease, and the intent is delivered again.
func (w *Worker) recoverFiring(f *firing) {
	r := recover()
	if r == nil {
		return
	}
	f.cancel()
	_ = f.lease.Release(f.work, f.lease.Record().Attempts)
	w.log.Error("panic handling intent", zap.String("subject", f.j.msg.Subject()), zap.Any("panic", r), zap.Stack("stack"))
	f.halt()
	w.finish(f.work, f.j, unanswered(nak(w.cfg.RetryDelay, "panic")))
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
