package natsservice

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/internal/reply"
	"github.com/idemgate/idemgate/pkg/effects/internal/text"
)

// HeaderProbeVerdict is the reply header in which a service answers a probe:
// done, not_done or unknown.
const HeaderProbeVerdict = "Idem-Probe-Verdict"

// ProbeConfig configures a NATS service's probe (see Effect.Prober). Zero
// fields mean the defaults.
type ProbeConfig struct {
	// Subject is where probes go, e.g. "billing.refund.probe": a valid
	// subject without wildcards. Required.
	Subject string
	// Timeout bounds the probe, reply included. Default
	// effects.DefaultProbeTimeout.
	Timeout time.Duration
}

// Validate reports every invalid field of c, each a *effects.SettingError
// whose Field is the probe's field name.
func (c ProbeConfig) Validate() error {
	var errs []error
	add := func(field, problem, hint string) {
		errs = append(errs, &effects.SettingError{Kind: "probe", Field: field, Problem: problem, Hint: hint})
	}
	const hint = "write e.g. subject: billing.refund.probe"
	if c.Subject == "" {
		add("subject", "is missing", hint)
	} else if msg := subjectProblem(c.Subject); msg != "" {
		add("subject", fmt.Sprintf("%q %s", c.Subject, msg), hint)
	}
	if c.Timeout < 0 {
		add("timeout", "is negative", "write e.g. 5s")
	}
	return errors.Join(errs...)
}

// Prober is a NATS service's probe: one request that asks the service
// whether the operation with a key happened (see Probe).
type Prober struct {
	nc      *nats.Conn
	subject string
	timeout time.Duration
	headers nats.Header
}

var _ effects.Prober = (*Prober)(nil)

// Prober returns the probe cfg describes, sent on the effect's connection
// with its static headers, or an error joining a *effects.SettingError for
// every invalid field.
func (s *Effect) Prober(cfg ProbeConfig) (*Prober, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = effects.DefaultProbeTimeout
	}
	return &Prober{nc: s.nc, subject: cfg.Subject, timeout: cfg.Timeout, headers: s.headers}, nil
}

// Probe sends one request to the probe subject, whose data is {"key": K}
// and whose headers are those a firing sends (Idempotency-Key and the
// others) and the static headers. The reply's verdict is its
// Idem-Probe-Verdict header, or else the "verdict" member of its data (a
// JSON object): done, not_done or unknown. The result of a done is the
// data's "result" member when the verdict came in the data, else the whole
// data (JSON, else a JSON string). An error reply (Nats-Service-Error) or
// any other verdict is unknown. No reply within the timeout, or no service
// on the subject, is an error wrapping effects.ErrProbe.
func (p *Prober) Probe(ctx context.Context, call effects.Call) (effects.ProbeAnswer, error) {
	ans := effects.ProbeAnswer{Verdict: effects.VerdictUnknown, Evidence: effects.Evidence{Request: "nats " + p.subject}}
	msg := nats.NewMsg(p.subject)
	msg.Data, _ = json.Marshal(map[string]string{"key": call.Key})
	for k, v := range p.headers {
		msg.Header[k] = v
	}
	for k, v := range call.Headers() {
		msg.Header.Set(k, v)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	answer, err := p.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			err = errors.New("no service listens on the subject")
		case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
			err = fmt.Errorf("no answer within %s", text.FormatDuration(p.timeout))
		}
		ans.Evidence.Status = effects.ClipEvidence(err.Error())
		return ans, fmt.Errorf("%w: nats %s: %w", effects.ErrProbe, p.subject, err)
	}
	ans.Evidence.Body = effects.ClipEvidence(strings.TrimSpace(string(answer.Data)))
	if desc, code := answer.Header.Get(headerServiceError), answer.Header.Get(headerServiceErrorCode); desc != "" || code != "" {
		ans.Evidence.Status = effects.ClipEvidence(strings.TrimSpace("service error " + code + " " + desc))
		return ans, nil
	}
	verdict, result := answer.Header.Get(HeaderProbeVerdict), json.RawMessage(nil)
	if verdict != "" {
		ans.Evidence.Status = HeaderProbeVerdict + ": " + verdict
		result = reply.Result(answer.Data)
	} else {
		var body struct {
			Verdict string          `json:"verdict"`
			Result  json.RawMessage `json:"result"`
		}
		dec := json.NewDecoder(bytes.NewReader(answer.Data))
		if dec.Decode(&body) == nil {
			verdict, result = body.Verdict, body.Result
		}
		ans.Evidence.Status = "verdict: " + verdict
	}
	switch effects.Verdict(verdict) {
	case effects.VerdictDone:
		if len(result) == 0 {
			result = json.RawMessage("null")
		}
		ans.Verdict, ans.Result = effects.VerdictDone, result
	case effects.VerdictNotDone:
		ans.Verdict = effects.VerdictNotDone
	}
	return ans, nil
}
