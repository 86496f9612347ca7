package effects

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Verdict is what a probe found out about an operation downstream.
type Verdict string

// The verdicts of a probe.
const (
	// VerdictDone: the downstream has done the operation with this key; the
	// probe's answer carries its result.
	VerdictDone Verdict = "done"
	// VerdictNotDone: the downstream has no operation with this key; firing
	// it is not a repeat.
	VerdictNotDone Verdict = "not_done"
	// VerdictUnknown: the downstream's answer does not tell (or there was
	// none); the tool's on_abandoned policy decides.
	VerdictUnknown Verdict = "unknown"
)

// Probe bounds and defaults.
const (
	// DefaultProbeTimeout bounds a probe when its tool does not say: the
	// whole exchange, answer included.
	DefaultProbeTimeout = 5 * time.Second
	// MaxProbeEvidence is how much of an answer's body a probe's Evidence
	// keeps, in bytes: it is stored in the ledger record for an operator.
	MaxProbeEvidence = 1 << 10
)

// ErrProbe is matched by errors.Is for every probe that got no answer to
// judge (the downstream could not be reached, or did not answer in time):
// its verdict is unknown.
var ErrProbe = errors.New("effects: probe failed")

// Evidence is what a probe asked and what came back, kept on the ledger
// record for an operator. Secrets (static header values, URL credentials and
// query values) are replaced by [redacted], as in an effect's messages.
type Evidence struct {
	// Request names what was asked: "GET https://api.example/refunds?idempotency_key=…",
	// "nats billing.refund.probe", "mcp find_refund".
	Request string `json:"request"`
	// Status is the answer's status ("200 OK", "done"), or what went wrong
	// when there was none ("no answer within 5s").
	Status string `json:"status,omitempty"`
	// Body is the start of the answer's body, at most MaxProbeEvidence bytes.
	Body string `json:"body,omitempty"`
}

// ProbeAnswer is a probe's answer.
type ProbeAnswer struct {
	// Verdict is what the probe found out.
	Verdict Verdict
	// Result is the operation's result as the downstream reported it, when
	// Verdict is VerdictDone: a JSON value recorded and replayed like a
	// fired effect's.
	Result json.RawMessage
	// Evidence is what was asked and what came back.
	Evidence Evidence
}

// Prober asks the downstream of an effect whether the operation with a key
// already happened: the reconciliation of an operation whose holder vanished
// after firing and before recording. The built-in webhook, nats and mcp
// kinds each make one from a tool's probe settings (see Tool.Prober).
//
// Probe asks once, for call.Key, forwarding the key as the effect does, and
// returns within its own time bound even when ctx has none. It returns an
// error wrapping ErrProbe when it got no answer to judge; the answer then
// has VerdictUnknown and the Evidence of what was asked. Probe may be called
// concurrently.
type Prober interface {
	Probe(ctx context.Context, call Call) (ProbeAnswer, error)
}

// ProberFunc adapts an ordinary function to the Prober interface.
type ProberFunc func(ctx context.Context, call Call) (ProbeAnswer, error)

// Probe calls f(ctx, call).
func (f ProberFunc) Probe(ctx context.Context, call Call) (ProbeAnswer, error) {
	return f(ctx, call)
}

// ClipEvidence cuts s to MaxProbeEvidence bytes at a character boundary,
// ending in "…" when it was cut, with invalid UTF-8 replaced.
func ClipEvidence(s string) string {
	return TruncateMessage(s, MaxProbeEvidence)
}
