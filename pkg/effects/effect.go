package effects

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
)

// Call is one firing of an effect: everything an effect may use to act on the
// outside world and to identify the operation to it.
type Call struct {
	// Key is the operation's idempotency key. It names the operation, never the
	// attempt: every retry and every re-firing of the operation carries the same
	// key, and an effect forwards it downstream (see the package doc).
	Key string
	// Tool is the tool's name, as configured in the tools file.
	Tool string
	// Session is the session or tenant scope of the intent ("" when absent).
	Session string
	// CallID is the model's tool_call_id, informational only ("" when absent).
	CallID string
	// Args are the intent's arguments: a canonical JSON object.
	Args json.RawMessage
	// Attempt is the ledger's claim number for the key, 1-based: 2 and above
	// mean an earlier holder claimed the key and did not record a result.
	// Effects send it downstream (HeaderAttempt) when it is set.
	Attempt int
	// Holder names the worker that fires: the holder of the key's lease in
	// the ledger ("" when unknown). With Attempt it tells a downstream which
	// claim a request belongs to; effects send it downstream (HeaderHolder).
	Holder string
	// Trace holds the W3C trace-context headers (traceparent, tracestate) of
	// the intent's trace; effects forward them downstream as headers.
	Trace map[string]string
}

// Headers that identify the operation, sent downstream by the built-in
// effects: the webhook and nats effects send all four as request headers;
// an email carries HeaderIdempotencyKey (and names the tool in
// HeaderMailTool).
const (
	HeaderIdempotencyKey = "Idempotency-Key" // the operation's key, the same on every retry
	HeaderTool           = "Idem-Tool"       // the tool's name
	HeaderSession        = "Idem-Session"    // the session, when the intent has one
	HeaderCallID         = "Idem-Call-Id"    // the model's tool_call_id, when the intent has one
)

// Headers that identify the firing, sent by every built-in effect next to
// Idempotency-Key (webhook and NATS request headers, email headers). The key
// names the operation; these name one claim of it: a repeat with a higher
// attempt follows a claim that recorded no result, a repeat with the same
// holder and attempt is a retry inside one firing.
const (
	HeaderHolder  = "Idem-Holder"  // Call.Holder, when set
	HeaderAttempt = "Idem-Attempt" // Call.Attempt in decimal, when at least 1
)

// ReservedHeader reports whether a tool's config may not set the header
// name (in any case) on its requests, because the effect sets it for the
// operation: HeaderIdempotencyKey and every Idem-* header (HeaderTool,
// HeaderSession, HeaderCallID, HeaderHolder, HeaderAttempt and those to
// come). Each effect adds the headers of its own transport.
func ReservedHeader(name string) bool {
	return strings.EqualFold(name, HeaderIdempotencyKey) || len(name) >= len(reservedPrefix) && strings.EqualFold(name[:len(reservedPrefix)], reservedPrefix)
}

// reservedPrefix begins the name of every header of the operation but
// HeaderIdempotencyKey.
const reservedPrefix = "Idem-"

// FiringHeaders returns the values of HeaderHolder and HeaderAttempt for
// the call ("" for one to leave out). A control character in the holder (a
// line break would end the header) becomes '?'.
func (call Call) FiringHeaders() (holder, attempt string) {
	holder = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return '?'
		}
		return r
	}, call.Holder)
	if call.Attempt >= 1 {
		attempt = strconv.Itoa(call.Attempt)
	}
	return holder, attempt
}

// Headers returns the request headers an effect that sends headers (the
// webhook and nats kinds) gives the call: the trace context, then
// HeaderIdempotencyKey and HeaderTool, and HeaderSession, HeaderCallID,
// HeaderHolder and HeaderAttempt when set (see FiringHeaders).
func (call Call) Headers() map[string]string {
	h := make(map[string]string, len(call.Trace)+6)
	for k, v := range call.Trace {
		h[k] = v
	}
	h[HeaderIdempotencyKey] = call.Key
	h[HeaderTool] = call.Tool
	holder, attempt := call.FiringHeaders()
	for name, v := range map[string]string{HeaderSession: call.Session, HeaderCallID: call.CallID, HeaderHolder: holder, HeaderAttempt: attempt} {
		if v != "" {
			h[name] = v
		}
	}
	return h
}

// Outcome is what an effect did.
type Outcome struct {
	// Result is the effect's result, a JSON value recorded in the ledger and
	// replayed to every caller of the operation. Only meaningful when Fire
	// returns no error.
	Result json.RawMessage
	// Invocations counts the calls the effect made to the outside world for
	// this Fire, retries included. It is at least 1 when anything was
	// attempted, and it is reported with an error too.
	Invocations int
}

// Effect is a tool's side effect.
//
// Fire performs the effect once for call, retrying internally as its policy
// says, and reports what happened. A nil error means the effect happened and
// Outcome.Result is its result. An error is transient (the worker releases
// the claim and the operation is tried again later, with the same key) unless
// it is a *PermanentError (see Permanent and IsPermanent), which is recorded
// and replayed to every caller. Context cancellation is transient.
//
// Fire must honour ctx: when ctx is done it stops retrying and returns.
// Fire may be called concurrently for different keys.
type Effect interface {
	Fire(ctx context.Context, call Call) (Outcome, error)
}

// EffectFunc adapts an ordinary function to the Effect interface, like
// http.HandlerFunc.
type EffectFunc func(ctx context.Context, call Call) (Outcome, error)

// Fire calls f(ctx, call).
func (f EffectFunc) Fire(ctx context.Context, call Call) (Outcome, error) {
	return f(ctx, call)
}
