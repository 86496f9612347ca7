package worker

import (
	"bytes"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/idemgate/idemgate/pkg/intent"
)

// admit decodes and validates an intent and derives its key — the worker's
// own derivation, never the headers' — so that the intent may go on (ok);
// bad input is rejected: answered, dead-lettered, never delivered again.
func (w *Worker) admit(j *job) (h handled, ok bool) {
	subjectTool := w.res.names.ToolFromSubject(j.msg.Subject())
	w.obs.admitting(subjectTool)

	decoded, err := intent.DecodeEnvelope(j.msg.Data(), w.cfg.Limits)
	if err != nil {
		return w.reject(j, subjectTool, intent.Code(err), err), false
	}
	env := decoded.Envelope
	shareArgs(env, j.msg.Data())
	j.env = env
	if err := env.CheckSubject(subjectTool); err != nil {
		return w.reject(j, env.Tool, intent.Code(err), err), false
	}
	tool, ok := w.tools.Lookup(env.Tool)
	if !ok {
		return w.reject(j, env.Tool, intent.CodeUnknownTool, w.tools.UnknownTool(env.Tool)), false
	}
	j.tool = tool
	if err := w.schemas.check(tool, decoded); err != nil {
		return w.reject(j, env.Tool, intent.CodeInvalidIntent, err), false
	}
	if err := decoded.CheckKeyArgs(tool.Policy.Class, tool.KeySpec); err != nil {
		return w.reject(j, env.Tool, intent.CodeInvalidIntent, err), false
	}
	j.id, err = decoded.Derive(tool.KeySpec, intentTime(j.msg.Headers(), j.meta.Timestamp))
	if err != nil {
		return w.reject(j, env.Tool, intent.Code(err), err), false
	}
	if err := w.sameIdentity(j); err != nil {
		return w.reject(j, env.Tool, intent.CodeKeyMismatch, err), false
	}
	if j.submission, err = submissionOf(j.msg.Headers()); err != nil {
		return w.reject(j, env.Tool, intent.CodeInvalidIntent, err), false
	}
	return handled{}, true
}

// shareArgs points env.Args, the canonical form of the intent's args, into
// data, the message's own bytes, when they hold it verbatim (args sent
// canonical, as pkg/client sends them): an intent in flight then keeps its
// args once, not twice. The message's data is its own copy, never reused,
// and nothing writes to either; the capacity is cut so that an append
// copies.
func shareArgs(env *intent.Envelope, data []byte) {
	if i := bytes.Index(data, env.Args); i >= 0 && len(env.Args) > 0 {
		end := i + len(env.Args)
		env.Args = data[i:end:end]
	}
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

// submissionOf is the call an intent with headers h names
// (intent.HeaderSubmission), "" for none; an error for a malformed one.
func submissionOf(h nats.Header) (string, error) {
	vs := h.Values(intent.HeaderSubmission)
	switch {
	case len(vs) == 0:
		return "", nil
	case len(vs) > 1:
		return "", fmt.Errorf("the intent has %d %s headers; a call is named once", len(vs), intent.HeaderSubmission)
	case !intent.ValidSubmission(vs[0]):
		return "", fmt.Errorf("%s %q does not name a call: 8 to 64 characters of [A-Za-z0-9_-], one random value per call",
			intent.HeaderSubmission, clipped(vs[0]))
	}
	return vs[0], nil
}

// clipped is s cut to 80 bytes for an error message.
func clipped(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// reject is bad input, answered and terminated: never delivered again.
func (w *Worker) reject(j *job, tool, code string, err error) handled {
	w.log.Info("intent rejected", zap.String("subject", j.msg.Subject()), zap.String("code", code), zap.Error(err))
	// The identity is the worker's own derivation, or none: never the
	// headers', which anyone may copy from another caller's intent. The
	// client matches the answer by its Idem-Intent-Seq (see answer).
	res := intent.Rejected(code, err.Error())
	res.Key, res.Tool, res.Fingerprint = j.id.Key, tool, j.id.Fingerprint
	if j.env != nil {
		res.CallID = j.env.CallID
	}
	w.obs.rejected(&res)
	return answered(res, term(code+": "+err.Error()))
}
