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

// fire is the effect's goroutine: it fires the effect (process has
// recorded the firing), then hands the conclusion — recording the outcome
// (conclude), answering and settling (finish) — to a handler goroutine,
// warm: its stack grown already. An effect that panicked is finished here.
func (w *Worker) fire(f *firing) {
	if h, ok := w.effect(f); !ok {
		w.finish(f.work, f.j, h)
		return
	}
	w.pool.runNext(func(r *poolRun) {
		f.j.seat.run = r
		w.finish(f.work, f.j, w.concluded(f))
	})
}

// effect fires f's effect; not ok: it panicked (rescue), and h is what
// the intent came to.
func (w *Worker) effect(f *firing) (h handled, ok bool) {
	defer w.rescue(f.j, &f, &h)
	f.out, f.err = w.invoke(f.ctx, f.j, f.lease)
	return h, true
}

// concluded is what f's intent came to: its outcome recorded (conclude), or
// a panic recovered (rescue); f's heartbeat and effect context end.
func (w *Worker) concluded(f *firing) (h handled) {
	defer w.rescue(f.j, &f, &h)
	h = w.conclude(f)
	f.halt()
	f.cancel()
	return h
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
