package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/internal/tracing"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// job is one intent being handled.
type job struct {
	ctx     context.Context // carries the intent's span, for the answer
	msg     jetstream.Msg
	meta    *jetstream.MsgMetadata
	replyTo string
	env     *intent.Envelope
	tool    *effects.Tool
	id      intent.Identity
}

// lastDelivery reports whether the consumer will not deliver this intent again.
func (w *Worker) lastDelivery(j *job) bool { return j.meta.NumDelivered >= uint64(w.cfg.MaxDeliver) }

// process decodes, validates and runs one intent (or operator decision) and
// returns how to settle it.
func (w *Worker) process(stop, work context.Context, msg jetstream.Msg) verdict {
	meta, err := msg.Metadata()
	if err != nil {
		return term("not a JetStream message: " + err.Error())
	}
	j := &job{ctx: work, msg: msg, meta: meta, replyTo: msg.Headers().Get(intent.HeaderReplyTo)}
	if op := w.res.names.ControlOp(msg.Subject()); op != "" {
		return w.control(stop, work, j, op)
	}
	subjectTool := w.res.names.ToolFromSubject(msg.Subject())
	w.m.received.WithLabelValues(w.m.tool(subjectTool)).Inc()

	env, err := intent.Decode(msg.Data(), w.cfg.Limits)
	if err != nil {
		return w.reject(j, subjectTool, intent.Code(err), err)
	}
	j.env = env
	if err := env.CheckSubject(subjectTool); err != nil {
		return w.reject(j, env.Tool, intent.Code(err), err)
	}
	tool, ok := w.tools.Lookup(env.Tool)
	if !ok {
		return w.reject(j, env.Tool, intent.CodeUnknownTool, w.tools.UnknownTool(env.Tool))
	}
	j.tool = tool
	if !w.limits.allow(env.Session) {
		w.m.limited.WithLabelValues(env.Tool, "session_rate").Inc()
		w.answer(j, intent.Result{
			Tool: env.Tool, Status: intent.StatusRejected, Replayed: true, CallID: env.CallID, CompletedAt: time.Now().UTC(),
			Error: &intent.Error{Code: intent.CodeRateLimited, Message: fmt.Sprintf(
				"session %q is over its rate of %g intents/s: nothing was done; retry later with the same key", env.Session, w.cfg.SessionRate)},
		})
		return ack()
	}
	release, ok := w.slots.take(env.Tool)
	if !ok {
		// Back-pressure, not an error: delivered again shortly.
		w.m.limited.WithLabelValues(env.Tool, "tool_in_flight").Inc()
		return nak(w.cfg.RetryDelay, fmt.Sprintf("tool %s at its cap of %d in flight", env.Tool, tool.Policy.MaxInFlight))
	}
	defer release()
	if tool.Policy.Class == effects.ClassUnsafe {
		if err := derivable(env, tool.KeySpec); err != nil {
			return w.reject(j, env.Tool, intent.CodeInvalidIntent, err)
		}
	}
	j.id, err = intent.Derive(env, tool.KeySpec, meta.Timestamp)
	if err != nil {
		return w.reject(j, env.Tool, intent.Code(err), err)
	}
	trace.SpanFromContext(work).SetAttributes(attribute.String("idemgate.tool", env.Tool), attribute.String("idemgate.key", j.id.Key))
	if !tool.Policy.Ledger {
		return w.direct(work, j)
	}
	return w.run(stop, work, j)
}

// derivable refuses an unsafe intent whose key cannot name its operation: a
// configured key arg is missing and no explicit key was given.
func derivable(env *intent.Envelope, spec intent.KeySpec) error {
	if env.Key != "" || len(spec.KeyArgs) == 0 {
		return nil
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(env.Args, &args); err != nil {
		return fmt.Errorf("args: %w", err)
	}
	for _, k := range spec.KeyArgs {
		if _, ok := args[k]; !ok {
			return fmt.Errorf("tool %s is unsafe and its key arg %q is missing: give it, or an explicit key naming the operation", env.Tool, k)
		}
	}
	return nil
}

// reject answers bad input and terminates it: it is never delivered again.
func (w *Worker) reject(j *job, tool, code string, err error) verdict {
	w.log.Info("intent rejected", zap.String("subject", j.msg.Subject()), zap.String("code", code), zap.Error(err))
	w.m.badInputs.WithLabelValues(w.m.tool(tool), code).Inc()
	w.answer(j, intent.Result{
		Tool:        tool,
		Status:      intent.StatusRejected,
		Replayed:    true,
		Error:       &intent.Error{Code: code, Message: err.Error()},
		CompletedAt: time.Now().UTC(),
	})
	return term(code + ": " + err.Error())
}

// run claims the intent's key and fires, replays, or waits for the holder.
func (w *Worker) run(stop, work context.Context, j *job) verdict {
	req := dedup.ClaimRequest{
		Key:         j.id.Key,
		Tool:        j.env.Tool,
		Fingerprint: j.id.Fingerprint,
		Holder:      w.cfg.Holder,
		Lease:       j.tool.Lease,
		IntentSeq:   j.meta.Sequence.Stream,
		CallID:      j.env.CallID,
	}
	if rec, ok := w.answers.get(req.Key); ok {
		// A final record this worker wrote or read a moment ago: no need
		// to ask the ledger again.
		w.m.cacheHits.WithLabelValues(j.env.Tool).Inc()
		return w.replay(j, rec)
	}
	waitUntil := time.Now().Add(w.cfg.MaxWait)
	for {
		c, err := w.ledger.Claim(stop, req)
		if err != nil {
			w.log.Warn("claim", zap.String("key", req.Key), zap.Error(err))
			return nak(w.retryDelay(j.meta.NumDelivered), "ledger unavailable")
		}
		switch c.Outcome {
		case dedup.Acquired, dedup.TookOver:
			v, again := w.held(stop, work, j, c)
			if again {
				continue
			}
			return v
		case dedup.Done, dedup.Conflict:
			w.answers.put(req.Key, c.Record)
			return w.replay(j, c.Record)
		case dedup.Busy:
			if rec := c.Record; rec.Status == intent.StatusPending && !rec.Released() && rec.LeaseExpired(time.Now()) {
				// The lease expired: confirm the holder is gone — its record
				// stays unchanged for a grace period on this worker's clock —
				// before taking over. After an outage of the ledger every
				// live lease has expired at once; a live holder extends (or
				// records) within its heartbeat period, shorter than the grace.
				changed, err := w.confirmAbandoned(stop, j, c.Revision)
				switch {
				case err != nil:
					return nak(w.retryDelay(j.meta.NumDelivered), "ledger unavailable")
				case !changed:
					req.Confirmed = c.Revision
				}
				continue
			}
			// Wait for the holder (push, not poll) up to its lease, bounded by
			// MaxWait unless this is the last delivery.
			w.log.Debug("waiting for the holder", zap.String("key", req.Key), zap.String("holder", c.Record.Holder))
			rec, err := w.await(stop, j, waitUntil)
			switch {
			case err == nil && rec.Status.Answered():
				w.answers.put(req.Key, rec)
				if rec.Fingerprint == j.id.Fingerprint {
					w.m.coalesced.WithLabelValues(j.env.Tool).Inc()
				}
				return w.replay(j, rec)
			case err == nil, errors.Is(err, dedup.ErrReleased):
				continue // the lease expired or was released: claim again
			default:
				return nak(w.cfg.RetryDelay, "holder still in flight")
			}
		default:
			return nak(w.cfg.RetryDelay, "unknown claim outcome")
		}
	}
}

// replay answers j from rec, a record of its key that answers it without
// this worker firing: a conflict when the fingerprints differ (Claim reports
// that as Conflict, Done otherwise), else the record's outcome, replayed.
func (w *Worker) replay(j *job, rec dedup.Record) verdict {
	if rec.Fingerprint != j.id.Fingerprint {
		w.answer(j, w.conflict(j, rec))
		return ack()
	}
	w.m.replays.WithLabelValues(j.env.Tool).Inc()
	w.answer(j, w.fromRecord(j, rec, true))
	return ack()
}

// held decides what a claimant does with the lease it won: hold an abandoned
// operation as uncertain, park it for approval, or fire. again reports that
// the lease was lost before anything happened: claim again.
func (w *Worker) held(stop, work context.Context, j *job, c dedup.ClaimResult) (v verdict, again bool) {
	lease, rec, pol := c.Lease, c.Lease.Record(), j.tool.Policy
	var parked dedup.Record
	var err error
	switch {
	case c.Outcome == dedup.TookOver && pol.OnAbandoned == effects.AbandonHold:
		w.log.Warn("holder vanished mid-effect; holding the operation as uncertain", zap.String("key", j.id.Key), zap.String("holder", c.Record.Holder))
		parked, err = lease.Hold(work, "a worker vanished while firing this operation; it may or may not have happened: an operator must resolve it")
	case pol.Approval && !rec.Approved(time.Now()) && !(c.Outcome == dedup.TookOver && rec.Decision != nil && rec.Decision.Op == intent.ControlApprove):
		// Needs an operator's approval first (or its approval lapsed before
		// the firing started). A takeover of an approved firing goes on.
		var envelope []byte
		if envelope, err = json.Marshal(j.env); err == nil {
			parked, err = lease.AwaitApproval(work, envelope)
		}
	default:
		if c.Outcome == dedup.TookOver {
			w.m.takeovers.WithLabelValues(j.env.Tool).Inc()
			w.log.Info("lease taken over", zap.String("key", j.id.Key), zap.Int("attempt", rec.Attempt))
		}
		return w.fire(stop, work, j, lease), false
	}
	switch {
	case errors.Is(err, dedup.ErrLeaseLost):
		return verdict{}, true
	case err != nil:
		w.log.Warn("record state", zap.String("key", j.id.Key), zap.Error(err))
		return nak(w.retryDelay(j.meta.NumDelivered), "ledger unavailable"), false
	}
	w.answer(j, w.fromRecord(j, parked, true))
	return ack(), false
}

// confirmAbandoned watches the key for the takeover grace (one more lease of
// the tool) and reports whether its record moved past rev meanwhile. A live
// holder cut off by an outage reconnects, and extends or records, well within
// it: its heartbeat runs every third of a lease.
func (w *Worker) confirmAbandoned(stop context.Context, j *job, rev uint64) (bool, error) {
	ctx, cancel := context.WithTimeout(stop, j.tool.Lease)
	defer cancel()
	halt := w.beats.keepAlive(ctx, j.msg, w.cfg.AckWait/3, 0, nil, nil)
	defer halt()
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
	halt := w.beats.keepAlive(ctx, j.msg, w.cfg.AckWait/3, 0, nil, nil)
	defer halt()
	rec, _, err := w.ledger.Wait(ctx, j.id.Key)
	return rec, err
}

// fire runs the effect under the lease and records its outcome by CAS on the
// lease's revision.
func (w *Worker) fire(stop, work context.Context, j *job, lease *dedup.Lease) verdict {
	ectx, cancel := context.WithCancel(work)
	defer cancel()
	defer func() {
		// A panicking effect gives the key back, so the redelivery need not
		// wait out the lease; handle recovers the panic itself.
		if r := recover(); r != nil {
			cancel() // stops the lease heartbeat
			_ = lease.Release(work, lease.Record().Attempts)
			panic(r)
		}
	}()
	period := min(j.tool.Lease, w.cfg.AckWait) / 3
	halt := w.beats.keepAlive(ectx, j.msg, period, j.tool.Lease, func(ctx context.Context) error {
		return lease.Extend(ctx, j.tool.Lease)
	}, func(cutOff bool) {
		if cutOff {
			w.log.Warn("ledger unreachable past the lease deadline; cancelling the effect", zap.String("key", j.id.Key))
		} else {
			w.log.Warn("lease lost while the effect ran; cancelling it", zap.String("key", j.id.Key))
		}
		cancel()
	})
	// The heartbeat goes on until the outcome is recorded: a holder retrying
	// its completion through a ledger outage must keep its lease, or another
	// worker would fire the operation again.
	defer halt()
	claimed := time.Now()
	out, ferr := j.tool.Effect.Fire(ectx, effects.Call{
		Key:     j.id.Key,
		Tool:    j.env.Tool,
		Session: j.env.Session,
		CallID:  j.env.CallID,
		Args:    j.env.Args,
		Attempt: lease.Record().Attempt,
		Trace:   traceHeaders(ectx),
	})
	w.m.effectTime.WithLabelValues(j.env.Tool).Observe(time.Since(claimed).Seconds())
	attempts := lease.Record().Attempts + out.Invocations

	var rec dedup.Record
	var err error
	var pe *effects.PermanentError
	switch {
	case ferr == nil:
		w.m.fired.WithLabelValues(j.env.Tool).Inc()
		rec, err = w.record(work, j.tool.Lease, func(ctx context.Context) (dedup.Record, error) {
			return lease.Complete(ctx, out.Result, attempts)
		})
	case errors.As(ferr, &pe):
		w.m.failures.WithLabelValues(j.env.Tool, "permanent").Inc()
		code := pe.Code
		if code == "" {
			code = intent.CodeEffectFailed
		}
		rec, err = w.record(work, j.tool.Lease, func(ctx context.Context) (dedup.Record, error) {
			return lease.Fail(ctx, intent.Error{Code: code, Message: pe.Message}, attempts)
		})
	case w.lastDelivery(j):
		w.m.failures.WithLabelValues(j.env.Tool, "transient").Inc()
		msg := fmt.Sprintf("gave up after %d deliveries: %v", j.meta.NumDelivered, ferr)
		rec, err = w.record(work, j.tool.Lease, func(ctx context.Context) (dedup.Record, error) {
			return lease.Fail(ctx, intent.Error{Code: intent.CodeEffectFailed, Message: msg}, attempts)
		})
	default:
		w.m.failures.WithLabelValues(j.env.Tool, "transient").Inc()
		w.log.Info("effect failed transiently; releasing the key", zap.String("key", j.id.Key), zap.Error(ferr))
		if err := lease.Release(work, attempts); err != nil && !errors.Is(err, dedup.ErrLeaseLost) {
			w.log.Warn("release", zap.String("key", j.id.Key), zap.Error(err))
		}
		return nak(w.retryDelay(j.meta.NumDelivered), "effect failed transiently")
	}

	switch {
	case err == nil:
		w.m.claimToDone.WithLabelValues(j.env.Tool).Observe(time.Since(claimed).Seconds())
		w.answers.put(j.id.Key, rec)
		w.answer(j, w.fromRecord(j, rec, false))
		return ack()
	case errors.Is(err, dedup.ErrLeaseLost):
		// Another worker took the key over: never overwrite its record, answer
		// with its outcome once there is one.
		w.log.Warn("lease lost before recording; answering with the holder's outcome", zap.String("key", j.id.Key))
		rec, werr := w.await(stop, j, time.Now().Add(w.cfg.MaxWait))
		if werr == nil && rec.Status.Answered() {
			w.answer(j, w.fromRecord(j, rec, true))
			return ack()
		}
		return nak(w.cfg.RetryDelay, "lease lost; outcome not recorded yet")
	default:
		// The effect's outcome could not be recorded: the lease will expire
		// and the key be taken over (the crash window; the forwarded key lets
		// a keyed downstream absorb the repeat).
		w.log.Error("record outcome", zap.String("key", j.id.Key), zap.Error(err))
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

// record runs a ledger write, retrying while the ledger is unreachable (but
// not past a lost lease) for up to a minute. Each attempt gets a quarter of
// the lease: an attempt whose reply was lost to a server restart must not
// hold the lease's writes (its heartbeat among them) for the client's whole
// request timeout, or another worker would confirm the holder gone.
func (w *Worker) record(ctx context.Context, lease time.Duration, write func(context.Context) (dedup.Record, error)) (dedup.Record, error) {
	b := backoff.WithContext(backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(50*time.Millisecond),
		backoff.WithMaxInterval(500*time.Millisecond),
		backoff.WithMaxElapsedTime(time.Minute)), ctx)
	per := min(max(lease/4, 250*time.Millisecond), 5*time.Second)
	return backoff.RetryWithData(func() (dedup.Record, error) {
		actx, cancel := context.WithTimeout(ctx, per)
		defer cancel()
		rec, err := write(actx)
		if errors.Is(err, dedup.ErrLeaseLost) {
			return rec, backoff.Permanent(err)
		}
		return rec, err
	}, b)
}

// replyAllowed reports whether an answer may be published on subject: a
// literal subject (no wildcards, no spaces) under one of the reply prefixes.
func (w *Worker) replyAllowed(subject string) bool {
	if strings.ContainsAny(subject, "*> \t\r\n") || strings.HasPrefix(subject, "$") {
		return false
	}
	for _, p := range w.cfg.ReplyPrefixes {
		if strings.HasPrefix(subject, p) && len(subject) > len(p) {
			return true
		}
	}
	return false
}

// fromRecord is the answer a ledger record gives this job's caller.
func (w *Worker) fromRecord(j *job, rec dedup.Record, replayed bool) intent.Result {
	at := rec.CompletedAt
	if at.IsZero() {
		at = rec.UpdatedAt
	}
	res := intent.Result{
		Key:         j.id.Key,
		Tool:        rec.Tool,
		Status:      rec.Status,
		Replayed:    replayed,
		Fingerprint: rec.Fingerprint,
		Attempts:    rec.Attempts,
		Result:      rec.Result,
		Error:       rec.Error,
		CompletedAt: at,
	}
	if j.env != nil {
		res.Tool, res.CallID = j.env.Tool, j.env.CallID
	}
	return res
}

// conflict is the answer to an intent whose key was first used with other
// arguments: never fired, never replayed.
func (w *Worker) conflict(j *job, rec dedup.Record) intent.Result {
	w.m.conflicts.WithLabelValues(j.env.Tool).Inc()
	return intent.Result{
		Key:         j.id.Key,
		Tool:        j.env.Tool,
		Status:      intent.StatusConflict,
		Replayed:    true,
		Fingerprint: j.id.Fingerprint,
		Error: &intent.Error{Code: intent.CodeConflict, Message: fmt.Sprintf(
			"key %s was first used with other arguments (fingerprint %s, this intent's %s)",
			j.id.Key, rec.Fingerprint, j.id.Fingerprint)},
		CallID:      j.env.CallID,
		CompletedAt: time.Now().UTC(),
	}
}

// answer publishes res to the intent's reply subject, if it named one.
// Replies are at most once: callers without one watch the ledger.
func (w *Worker) answer(j *job, res intent.Result) {
	if j.replyTo != "" && !w.replyAllowed(j.replyTo) {
		// A reply header naming the ledger's KV subjects, a stream's subject
		// or a system subject would let a caller write there with the
		// worker's permissions: never answer there.
		w.log.Warn("refused reply subject", zap.String("reply_to", j.replyTo), zap.String("subject", j.msg.Subject()))
		w.m.badReplies.Inc()
		j.replyTo = ""
	}
	if j.meta != nil {
		w.m.endToEnd.WithLabelValues(w.m.tool(res.Tool)).Observe(since(j.meta.Timestamp))
	}
	if j.replyTo == "" {
		return
	}
	data, err := json.Marshal(res)
	if err != nil {
		w.log.Error("encode answer", zap.Error(err))
		return
	}
	out := nats.NewMsg(j.replyTo)
	out.Data = data
	if j.ctx != nil {
		otel.GetTextMapPropagator().Inject(j.ctx, tracing.Header(out.Header))
	}
	if err := w.nc.PublishMsg(out); err != nil {
		w.log.Warn("publish answer", zap.String("reply_to", j.replyTo), zap.Error(err))
	}
}
