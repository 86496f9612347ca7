package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// job is one intent being handled.
type job struct {
	ctx     context.Context // carries the intent's span, for the answer
	msg     message
	meta    *jetstream.MsgMetadata
	replyTo string
	env     *intent.Envelope
	tool    *effects.Tool
	id      intent.Identity
	// seq is the stream sequence of the call this job answers: the intent's
	// own, or — for an approval that fires a parked operation — the sequence
	// of the intent that parked it. A record written for another sequence
	// answers this job as a replay.
	seq uint64
	// free gives the handler's concurrency slot back while the job waits in
	// a tool's queue (see toolSlot); nil in tests that build a job by hand.
	free func()
	// done is called once the job is settled (see Worker.finish); nil in
	// tests that build a job by hand.
	done func()
	// releaseTool gives the tool's slot back (see toolSlot), once settled.
	releaseTool func()
	// run is the handler's goroutine in the pool, which a wait that may last
	// leaves (nil in tests that build a job by hand, and once handed off).
	run *poolRun
	// span is the intent's, ended once settled.
	span trace.Span
	// handedOff reports that the job's effect goroutine settles it (see
	// fire), not its handler.
	handedOff bool
	// answered reports that the job's caller was answered.
	answered bool
	// stages are the times the job reached each stage, taken only when
	// Config.OnStages is set.
	stages Stages
}

// detach takes the job's handler out of the pool before a wait that may
// last (see poolRun.detach); a job without one (handed off to its effect's
// goroutine, or built by hand) has nothing to leave.
func (j *job) detach() {
	if j.run != nil {
		j.run.detach()
	}
}

// lastDelivery reports whether the consumer will not deliver this intent again.
func (w *Worker) lastDelivery(j *job) bool { return j.meta.NumDelivered >= uint64(w.cfg.MaxDeliver) }

// admit decodes and validates one intent (or operator decision), derives its
// key, applies the limits and hands it on: to the ledger (claim), to a
// direct firing, or to the decision it carries. It returns how to settle it.
func (w *Worker) admit(stop, work context.Context, j *job) verdict {
	if op := w.res.names.ControlOp(j.msg.Subject()); op != "" {
		return w.control(stop, work, j, op)
	}
	subjectTool := w.res.names.ToolFromSubject(j.msg.Subject())
	w.m.received.WithLabelValues(w.m.tool(subjectTool)).Inc()

	decoded, err := intent.DecodeEnvelope(j.msg.Data(), w.cfg.Limits)
	if err != nil {
		return w.reject(j, subjectTool, intent.Code(err), err)
	}
	env := decoded.Envelope
	j.env = env
	if err := env.CheckSubject(subjectTool); err != nil {
		return w.reject(j, env.Tool, intent.Code(err), err)
	}
	tool, ok := w.tools.Lookup(env.Tool)
	if !ok {
		return w.reject(j, env.Tool, intent.CodeUnknownTool, w.tools.UnknownTool(env.Tool))
	}
	j.tool = tool
	if err := w.schemas.check(tool, env.Args); err != nil {
		return w.reject(j, env.Tool, intent.CodeInvalidIntent, err)
	}
	if tool.Policy.Class == effects.ClassUnsafe {
		if err := derivable(env, tool.KeySpec); err != nil {
			return w.reject(j, env.Tool, intent.CodeInvalidIntent, err)
		}
	}
	j.id, err = decoded.Derive(tool.KeySpec, intentTime(j.msg.Headers(), j.meta.Timestamp))
	if err != nil {
		return w.reject(j, env.Tool, intent.Code(err), err)
	}
	if err := w.sameIdentity(j); err != nil {
		return w.reject(j, env.Tool, intent.CodeKeyMismatch, err)
	}
	trace.SpanFromContext(work).SetAttributes(attribute.String("idemgate.tool", env.Tool), attribute.String("idemgate.key", j.id.Key))
	if !w.limits.allow(env.Session) {
		w.m.limited.WithLabelValues(env.Tool, "session_rate").Inc()
		res := intent.Rejected(intent.CodeRateLimited, fmt.Sprintf(
			"session %q is over its rate of %g intents/s: nothing was done; retry later with the same key", env.Session, w.cfg.SessionRate))
		res.Key, res.Tool, res.Fingerprint, res.CallID = j.id.Key, env.Tool, j.id.Fingerprint, env.CallID
		w.answer(j, res)
		return ack()
	}
	release, err := w.toolSlot(stop, j)
	if err != nil {
		return nak(0, "worker stopping while the intent waited for its tool")
	}
	j.releaseTool = release
	if !tool.Policy.Ledger {
		return w.direct(work, j)
	}
	return w.claim(stop, work, j)
}

// intentTime is the time a window key derives from when the envelope has no
// created_at: the message's timestamp, or the original's for a replayed dead
// letter (intent.HeaderIntentTime among its headers h).
func intentTime(h nats.Header, timestamp time.Time) time.Time {
	if v := h.Get(intent.HeaderIntentTime); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return t
		}
	}
	return timestamp
}

// sameIdentity refuses an intent whose client derived another key or
// fingerprint (intent.HeaderKey, HeaderFingerprint) than the worker: the
// client's key spec of the tool is out of date, so its publish dedup and its
// ledger watch would use the wrong key.
func (w *Worker) sameIdentity(j *job) error {
	h := j.msg.Headers()
	key, fp := h.Get(intent.HeaderKey), h.Get(intent.HeaderFingerprint)
	if (key == "" || key == j.id.Key) && (fp == "" || fp == j.id.Fingerprint) {
		return nil
	}
	return fmt.Errorf("the client derived key %s and fingerprint %s, the workers derive %s and %s for tool %s: "+
		"refresh the client's key spec of the tool from the tool catalogue (%s) and send it again",
		orNone(key), orNone(fp), j.id.Key, j.id.Fingerprint, j.env.Tool, w.res.names.ToolsSubject)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
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
	// The identity is the worker's own derivation, or none: never the
	// headers', which anyone may copy from another caller's intent. The
	// client matches the answer by its Idem-Intent-Seq (see answer).
	res := intent.Rejected(code, err.Error())
	res.Key, res.Tool, res.Fingerprint = j.id.Key, tool, j.id.Fingerprint
	if j.env != nil {
		res.CallID = j.env.CallID
	}
	w.answer(j, res)
	return term(code + ": " + err.Error())
}
