package worker

import (
	"context"
	"encoding/json"
	"fmt"

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
	msg     jetstream.Msg
	meta    *jetstream.MsgMetadata
	replyTo string
	env     *intent.Envelope
	tool    *effects.Tool
	id      intent.Identity
}

// lastDelivery reports whether the consumer will not deliver this intent again.
func (w *Worker) lastDelivery(j *job) bool { return j.meta.NumDelivered >= uint64(w.cfg.MaxDeliver) }

// admit decodes and validates one intent (or operator decision), applies
// the limits, derives its key and hands it on: to the ledger (claim), to a
// direct firing, or to the decision it carries. It returns how to settle it.
func (w *Worker) admit(stop, work context.Context, msg jetstream.Msg) verdict {
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
		return w.reject(j, env.Tool, intent.CodeUnknownTool, fmt.Errorf("no tool %q is configured", env.Tool))
	}
	j.tool = tool
	if !w.limits.allow(env.Session) {
		w.m.limited.WithLabelValues(env.Tool, "session_rate").Inc()
		res := intent.Rejected(intent.CodeRateLimited, fmt.Sprintf(
			"session %q is over its rate of %g intents/s: nothing was done; retry later with the same key", env.Session, w.cfg.SessionRate))
		res.Tool, res.CallID = env.Tool, env.CallID
		w.answer(j, res)
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
	return w.claim(stop, work, j)
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
	res := intent.Rejected(code, err.Error())
	res.Tool = tool
	w.answer(j, res)
	return term(code + ": " + err.Error())
}
