package worker

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/internal/tracing"
	"github.com/idemgate/idemgate/pkg/audit"
	"github.com/idemgate/idemgate/pkg/dedup"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// observe is the one place that tells what happens to an intent: its
// span, its stage times (Stages), the worker's metrics (Metrics) and the
// audit trail's events (auditor), each recorded from what a stage came to
// — the value it returned, or the event it names. The stages apply their
// rules and call it at their events; nothing else of theirs records.
// Its methods take what they record as arguments (no closures, no
// interfaces): observing costs an intent no allocation.
type observe struct{ w *Worker }

// received starts j's observation as its handler starts: its span, a child
// of the intent's trace context (a traceparent header), returned with
// work; its count in flight; its stage times, when Config.OnStages takes
// them.
func (o observe) received(work context.Context, j *job) context.Context {
	ctx := otel.GetTextMapPropagator().Extract(context.Background(), tracing.Header(j.msg.Headers()))
	_, j.span = tracer.Start(ctx, "idemgate.intent", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("messaging.destination.name", j.msg.Subject())))
	o.w.m.inFlight.Inc()
	if o.w.cfg.OnStages != nil {
		j.stages = new(Stages)
	}
	return trace.ContextWithSpan(work, j.span)
}

// delivered marks j, a JetStream message, delivered.
func (o observe) delivered(j *job) { j.mark(stageDelivered) }

// admitting counts j delivered, under the tool its subject names.
func (o observe) admitting(subjectTool string) {
	o.w.m.received.WithLabelValues(o.w.m.tool(subjectTool)).Inc()
}

// admitted names j's tool and key on its span.
func (o observe) admitted(j *job) {
	j.span.SetAttributes(attribute.String("idemgate.tool", j.env.Tool), attribute.String("idemgate.key", j.id.Key))
}

// rejected counts res, the answer to bad input.
func (o observe) rejected(res *intent.Result) {
	o.w.m.badInputs.WithLabelValues(o.w.m.tool(res.Tool), res.Error.Code).Inc()
}

// limited counts j held back by limit (session_rate, tool_in_flight).
func (o observe) limited(j *job, limit string) {
	o.w.m.limited.WithLabelValues(j.env.Tool, limit).Inc()
}

// decision counts an operator's decision on subjectOp.
func (o observe) decision(subjectOp string) { o.w.m.decisions.WithLabelValues(subjectOp).Inc() }

// decided puts a decision that applied on the trail (auditor.decided).
func (o observe) decided(op string, c intent.Control, rec dedup.Record, wrote *receiptCapture) {
	o.w.audit.decided(op, c, rec, wrote)
}

// cached marks j claimed by the answer cache, and counts the hit.
func (o observe) cached(j *job) {
	j.mark(stageClaimed)
	o.w.m.cacheHits.WithLabelValues(j.env.Tool).Inc()
}

// claimed marks j claimed: the ledger answered its claim.
func (o observe) claimed(j *job) { j.mark(stageClaimed) }

// replayed counts res, j's answer from a record: a replay, or a conflict
// (conflict), whose receipt it signs and puts on the trail.
func (o observe) replayed(j *job, res *intent.Result, conflict bool) {
	if !conflict {
		o.w.m.replays.WithLabelValues(j.env.Tool).Inc()
		return
	}
	o.w.m.conflicts.WithLabelValues(j.env.Tool).Inc()
	res.Receipt = o.w.audit.conflict(j, res)
}

// coalesced counts j answered by another's call: a holder it waited for,
// a read in flight it shared.
func (o observe) coalesced(j *job) { o.w.m.coalesced.WithLabelValues(j.env.Tool).Inc() }

// overBudget counts j, a new operation over its tool's budget.
func (o observe) overBudget(j *job) { o.w.m.overBudget.WithLabelValues(j.env.Tool).Inc() }

// tookOver puts a takeover j won on the trail at once, before anything
// else happens (its probe included); confirmed: after the grace.
func (o observe) tookOver(j *job, c dedup.ClaimResult, confirmed bool) {
	o.w.audit.claimed(j, c, confirmed)
}

// parked puts a claim j won on the trail (a takeover is there already)
// as its operation is parked for an approval (overBudget: over its tool's
// budget, counted).
func (o observe) parked(j *job, c dedup.ClaimResult, confirmed, overBudget bool) {
	if overBudget {
		o.w.audit.claimed(j, c, confirmed)
		o.overBudget(j)
		return
	}
	if c.Outcome != dedup.TookOver {
		o.w.audit.claimed(j, c, confirmed)
	}
}

// firing counts a takeover that fires; a claim that fires at once keeps
// its event for the firing's (fired), one event for both.
func (o observe) firing(f *firing, c dedup.ClaimResult, confirmed bool) {
	if c.Outcome == dedup.TookOver {
		o.w.m.takeovers.WithLabelValues(f.j.env.Tool).Inc()
		return
	}
	if o.w.audit.trailing() {
		claimed := o.w.audit.claimEvent(f.j, c, confirmed)
		f.claimed = &claimed
	}
}

// fired puts f on the trail as it is handed to its effect (with its
// claim's event, which is then let go) and starts its effect's clock.
func (o observe) fired(f *firing) {
	f.started = time.Now()
	o.w.audit.fired(f.j, f.lease, f.claimed)
	f.claimed = nil
}

// effected marks f's effect returned, times it, and counts what it came
// to (out).
func (o observe) effected(f *firing, out outcome) {
	o.w.m.effectTime.WithLabelValues(f.j.env.Tool).Observe(time.Since(f.started).Seconds())
	f.j.mark(stageFired)
	o.outcome(f.j, out, false)
}

// directed counts what j's effect, fired without the ledger, came to
// (out); shared: another caller's call answered it.
func (o observe) directed(j *job, out outcome, shared bool) {
	if shared {
		o.coalesced(j)
	}
	o.outcome(j, out, shared)
}

// outcome counts what an effect of j came to: a failure by its kind, an
// effect that happened (unless shared: another's call).
func (o observe) outcome(j *job, out outcome, shared bool) {
	switch {
	case out.kind == outcomeDone && !shared:
		o.w.m.fired.WithLabelValues(j.env.Tool).Inc()
	case out.kind == outcomeFailed && out.permanent:
		o.w.m.failures.WithLabelValues(j.env.Tool, "permanent").Inc()
	case out.kind != outcomeDone:
		o.w.m.failures.WithLabelValues(j.env.Tool, "transient").Inc()
	}
}

// released puts a key given back after a transient failure on the trail.
func (o observe) released(j *job, attempts int, cause error) { o.w.audit.released(j, attempts, cause) }

// recorded puts an outcome the worker wrote under key on the trail.
func (o observe) recorded(key string, rec dedup.Record) { o.w.audit.recorded(key, rec) }

// concluded marks f's outcome's ledger write returned, and times from the
// firing to the record when it was written (err nil).
func (o observe) concluded(f *firing, err error) {
	f.j.mark(stageRecorded)
	if err == nil {
		o.w.m.claimToDone.WithLabelValues(f.j.env.Tool).Observe(time.Since(f.started).Seconds())
	}
}

// probed counts a probe of call's downstream (tool's) and its answer
// (ans), and puts it on the trail.
func (o observe) probed(tool *effects.Tool, call effects.Call, ans effects.ProbeAnswer) {
	o.w.m.probes.WithLabelValues(o.w.m.tool(call.Tool), string(ans.Verdict)).Inc()
	if a := o.w.audit; a.trailing() {
		a.trail.Append(a.partition(call.Key), audit.Event{Kind: audit.KindProbed, Key: call.Key, Tool: call.Tool,
			Holder: a.holder, Attempt: call.Attempt, Effect: tool.Kind, Destination: ans.Evidence.Request,
			Reason: string(ans.Verdict), At: time.Now()})
	}
}

// refusedReply counts an answer not published: its reply subject is not
// allowed.
func (o observe) refusedReply() { o.w.m.badReplies.Inc() }

// answered times res, j's answer, handed to its caller's connection from
// the intent's publish, and gives j's stage times to Config.OnStages.
func (o observe) answered(j *job, res *intent.Result) {
	o.w.m.endToEnd.WithLabelValues(o.w.m.tool(res.Tool)).Observe(since(j.meta.Timestamp))
	if j.stages != nil {
		j.stages.Key, j.stages.Stored, j.stages.Answered = res.Key, j.meta.Timestamp, time.Now()
		o.w.cfg.OnStages(*j.stages)
	}
}

// deadLettered counts a message of subject copied to the dead-letter
// stream.
func (o observe) deadLettered(subject string) {
	o.w.m.deadLetters.WithLabelValues(o.w.m.tool(o.w.res.names.ToolFromSubject(subject))).Inc()
}

// settled ends j's observation as its message is settled with v: its
// span, with the verdict, and its count in flight.
func (o observe) settled(j *job, v verdict) {
	j.span.SetAttributes(attribute.String("idemgate.verdict", v.verb.String()))
	j.span.End()
	o.w.m.inFlight.Dec()
}
