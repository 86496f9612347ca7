package worker

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// handle is one intent's way through the worker (the stages: doc.go), on a
// handler goroutine of the pool (run). stop is cancelled when the worker is
// asked to stop (waits end then); work when its drain is over (effects and
// ledger writes use it). process takes the intent to what it comes to, and
// finish ends it here; or an effect to fire, handed off to a goroutine of
// its own, which finishes it there (fire.go).
func (w *Worker) handle(stop, work context.Context, msg message, run *poolRun) {
	j, work := w.receive(work, msg, run)
	if j.meta == nil {
		w.finish(work, j, unanswered(term("not a JetStream message")))
		return
	}
	h, f := w.process(stop, work, j)
	if f == nil {
		w.finish(work, j, h)
		return
	}
	go w.fire(f) // handed off: the effect's goroutine finishes j
}

// process runs j's stages (stages) on its handler's goroutine: what they
// come to, or the firing they hand its effect to, recorded as fired here,
// before the hand-off, so that the effect's goroutine runs nothing but the
// effect, on a small stack. A panic is recovered (rescue): the intent is
// delivered again.
func (w *Worker) process(stop, work context.Context, j *job) (h handled, f *firing) {
	defer w.rescue(j, &f, &h)
	if h, f = w.stages(stop, work, j); f != nil {
		w.obs.fired(f)
	}
	return h, f
}

// rescue is the worker's one recovery from a panic while handling j,
// deferred by the outermost frame that runs j's stages on each goroutine j
// runs on (a panic is recovered only on its own): its handler's (process,
// and concluded) and its effect's (effect). It makes what j came to, *h, a
// nak: the intent is delivered again; the key of *f, the firing j's effect
// runs under (if any), is given back, so that the redelivery need not wait
// out the lease, and *f is nil: nothing is handed off.
func (w *Worker) rescue(j *job, f **firing, h *handled) {
	r := recover()
	if r == nil {
		return
	}
	if fr := *f; fr != nil {
		fr.cancel()
		_ = fr.lease.Release(fr.work, fr.lease.Record().Attempts)
		fr.halt()
		*f = nil
	}
	w.log.Error("panic handling intent", zap.String("subject", j.msg.Subject()), zap.Any("panic", r), zap.Stack("stack"))
	*h = unanswered(nak(w.cfg.RetryDelay, "panic"))
}

// stages takes j through the stages up to the firing, each of which ends
// it (handled) or lets it on.
func (w *Worker) stages(stop, work context.Context, j *job) (handled, *firing) {
	if j.meta.NumDelivered > w.overdueAfter() {
		return w.overdue(j), nil
	}
	if op := w.res.names.ControlOp(j.msg.Subject()); op != "" {
		return w.control(stop, work, j, op)
	}
	if h, ok := w.admit(j); !ok {
		return h, nil
	}
	w.obs.admitted(j)
	if h, ok := w.limit(stop, j); !ok {
		return h, nil
	}
	if !j.tool.Policy.Ledger {
		return w.direct(work, j), nil
	}
	return w.claim(stop, work, j)
}

// finish ends j's way with h, on whichever goroutine j is on: its message's
// verdict sealed (a nak at the last delivery dead-letters it: letter), its
// caller answered — an intent dead-lettered without an answer is answered
// dead_lettered — its message settled, and what it held given back. It is
// the one place a caller is answered and a message settled; ctx carries the
// intent's span to the answer.
func (w *Worker) finish(ctx context.Context, j *job, h handled) {
	v := w.letter(j, h.verdict)
	if v.verb == verbTerm && !h.answers && j.meta != nil {
		h = answered(deadLettered(j.id, j.env, j.meta.NumDelivered, v.reason), v)
	}
	if h.answers {
		w.answer(ctx, j, h.answer)
	}
	if j.seat.tool != nil {
		<-j.seat.tool
	}
	if j.keep != nil {
		j.keep()
	}
	w.settle(j, v)
	w.obs.settled(j, v)
	w.free(j)
	w.handling.Done()
}

// handled is what handling an intent came to: the answer for its caller,
// if it has one, and the verdict its message is settled with. The stages
// that end an intent return it; finish acts on it.
type handled struct {
	verdict verdict
	answer  intent.Result
	answers bool // answer is set
}

// answered is an intent answered with res and settled with v.
func answered(res intent.Result, v verdict) handled {
	return handled{verdict: v, answer: res, answers: true}
}

// unanswered is an intent settled with v without an answer: delivered again
// (a nak), or dead-lettered and answered so (a term).
func unanswered(v verdict) handled { return handled{verdict: v} }

// job is one intent being handled: what the stages learn of it.
type job struct {
	msg     message
	meta    *jetstream.MsgMetadata // nil: not a JetStream message
	replyTo string
	env     *intent.Envelope
	tool    *effects.Tool
	id      intent.Identity
	// seq is the stream sequence of the call this job answers: the intent's
	// own, or — for an approval that fires a parked operation — the sequence
	// of the intent that parked it. A record written for another sequence
	// answers this job as a replay.
	seq uint64
	// submission names the call this job answers (intent.HeaderSubmission;
	// "" when the intent names none): a copy of a call that ran the
	// operation finds that call's outcome as its own.
	submission string
	// keep stops the intent's keep-alive (heartbeats.hold), which runs
	// from its receipt until it is settled, whatever stage it waits in: no
	// gap between stages in which the consumer's AckWait runs out.
	keep func()
	// span is the intent's, ended once it is settled.
	span trace.Span
	// seat is what the job occupies in the worker until it is settled.
	seat seat
	// stages are the times the job reached each stage, taken only when
	// Config.OnStages is set (nil otherwise: an intent in flight does not
	// carry them).
	stages *Stages
}

// seat is what an intent occupies in its worker while it is handled: one of
// Config.Concurrency slots (freed early while it queues for a capped tool:
// toolSlot), the handler goroutine it runs on (left before a wait that may
// last: detach; none while its effect runs on a goroutine of its own), and
// its tool's slot when the tool is capped (taken by toolSlot). finish gives
// back what it still holds.
type seat struct {
	run   *poolRun
	tool  chan struct{}
	freed bool
}

// detach takes the job's handler out of the pool before a wait that may
// last (see poolRun.detach); a job on no handler goroutine (its effect's, or
// a test's) has nothing to leave.
func (j *job) detach() {
	if j.seat.run != nil {
		j.seat.run.detach()
	}
}

// free gives j's concurrency slot back, once.
func (w *Worker) free(j *job) {
	if !j.seat.freed {
		j.seat.freed = true
		<-w.sem
	}
}

// dispatch hands msg to a handler goroutine of the pool once one of the
// Config.Concurrency slots is free.
func (w *Worker) dispatch(stop, work context.Context, msg message) {
	w.sem <- struct{}{}
	w.handling.Add(1)
	w.pool.run(func(run *poolRun) { w.handle(stop, work, msg, run) })
}

// receive starts j's handling on its handler goroutine (run): its
// observation (its span, returned with work: observe.received); its
// metadata (none for a message that is not a JetStream one) and its
// keep-alive.
func (w *Worker) receive(work context.Context, msg message, run *poolRun) (*job, context.Context) {
	j := &job{msg: msg, seat: seat{run: run}}
	work = w.obs.received(work, j)
	if meta, err := msg.Metadata(); err == nil {
		j.meta, j.replyTo, j.seq = meta, msg.Headers().Get(intent.HeaderReplyTo), meta.Sequence.Stream
		j.keep = w.beats.hold(context.Background(), msg, w.cfg.AckWait/3)
		w.obs.delivered(j)
	}
	return j, work
}

// lastDelivery reports whether the consumer will not deliver this intent again.
func (w *Worker) lastDelivery(j *job) bool { return j.meta.NumDelivered >= uint64(w.cfg.MaxDeliver) }
