// Package natsservice is the nats effect kind: a request to a NATS service
// in any language (one built with nats.go's micro package, for one), with
// the operation's key in the Idempotency-Key header, its reply read by the
// micro error convention (see Effect). It sends on the caller's connection.
package natsservice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/net/http/httpguts"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/internal/reply"
	"github.com/idemgate/idemgate/pkg/effects/internal/text"
	"github.com/idemgate/idemgate/pkg/intent"
)

// DefaultTimeout bounds one request to a NATS service.
const DefaultTimeout = 10 * time.Second

// Reply headers of the NATS service error convention, the ones nats.go's
// micro package sets when a handler answers with an error.
const (
	// headerServiceError carries the error's description; its presence marks
	// the reply as an error.
	headerServiceError = "Nats-Service-Error"
	// headerServiceErrorCode carries the error's code, an HTTP-like status
	// such as "400" or "503".
	headerServiceErrorCode = "Nats-Service-Error-Code"
)

// Config configures a NATS service effect. Zero fields mean the
// defaults.
type Config struct {
	// Subject is where requests go: a valid NATS subject without wildcards,
	// e.g. "billing.charge". Required.
	Subject string
	// Timeout bounds one request, from sending it to the reply. It must
	// exceed what the service may legitimately take: a request that times
	// out may still have acted, and its retry is a second firing (same key).
	// Default DefaultTimeout.
	Timeout time.Duration
	// Retry is the retry policy, as for a webhook.
	Retry effects.RetryPolicy
	// Headers are static headers added to every request. Names are
	// case-sensitive, as NATS headers are; they may not be Idempotency-Key,
	// nor start with Idem- or Nats- (any case).
	Headers map[string]string
}

// Effect is the effect that sends an intent to a NATS service (kind
// nats): a request-reply to a configured subject, answered by a service
// written in any language, such as one built with nats.go's micro package.
//
// Each Fire sends one request per attempt: the data is the call's args (a
// JSON object), the headers are Idempotency-Key (the operation's key, the
// same on every attempt), Idem-Tool, Idem-Session, Idem-Call-Id, Idem-Holder
// and Idem-Attempt (each when set) and the static headers. The reply decides the outcome:
//
//   - no Nats-Service-Error header (and no Nats-Service-Error-Code): success.
//     The result is the reply's data when it is JSON, the data as a JSON
//     string when it is not, and null when it is empty; at most
//     webhook.MaxResponse bytes are kept, as for a webhook.
//   - an error reply (the micro convention: Nats-Service-Error holds the
//     description, Nats-Service-Error-Code the code) with code 408, 429 or
//     5xx, with no code, or with a code that is not a 4xx: transient,
//     retried with backoff up to RetryPolicy.MaxAttempts requests, the same
//     key on every one. When the attempts run out, the error wraps
//     ErrExhausted: the worker tries the operation later.
//   - an error reply with any other 4xx code: a *PermanentError with code
//     effect_failed, quoting the service's code, description and the start
//     of its data.
//   - no responders (nothing listens on the subject), a lost connection or
//     a timeout: transient, retried as above.
//
// A retry after a timeout is a second firing with the same key: the first
// request may have reached the service, which may have acted and whose reply
// was lost or late. Only a keyed service absorbs it: one that stores the
// Idempotency-Key with what it did and answers a repeat with the stored
// reply. The same holds when the worker crashes after the request and before
// the result is recorded.
//
// The connection belongs to the caller; an Effect does not close it
// and needs no Close.
type Effect struct {
	nc      *nats.Conn
	subject string
	headers nats.Header
	timeout time.Duration
	retry   effects.RetryPolicy
}

// New returns a NATS service effect that sends its requests on
// nc, or an error joining a *SettingError for every invalid field.
func New(nc *nats.Conn, cfg Config) (*Effect, error) {
	err := cfg.Validate()
	if nc == nil {
		err = errors.Join(err, &effects.SettingError{Kind: intent.EffectNATS, Field: "connection", Problem: "is nil", Hint: "pass the worker's NATS connection"})
	}
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	h := make(nats.Header, len(cfg.Headers))
	for k, v := range cfg.Headers {
		h.Set(k, v)
	}
	return &Effect{nc: nc, subject: cfg.Subject, headers: h, timeout: cfg.Timeout, retry: cfg.Retry}, nil
}

func (c Config) withDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	c.Retry = c.Retry.WithDefaults()
	return c
}

// Validate returns an error joining a *SettingError for every invalid field
// of c, its defaults applied.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	add := func(field, problem, hint string) {
		errs = append(errs, &effects.SettingError{Kind: intent.EffectNATS, Field: field, Problem: problem, Hint: hint})
	}
	const subjectHint = "write e.g. subject: billing.charge"
	if c.Subject == "" {
		add("subject", "is missing", subjectHint)
	} else if msg := subjectProblem(c.Subject); msg != "" {
		add("subject", fmt.Sprintf("%q %s", c.Subject, msg), subjectHint)
	}
	for name, value := range c.Headers {
		field := "headers." + name
		lower := strings.ToLower(name)
		switch {
		case !httpguts.ValidHeaderFieldName(name):
			add(field, fmt.Sprintf("%q is not a header name", name), "use letters, digits and '-', e.g. Authorization")
		case effects.ReservedHeader(name):
			add(field, "is set by the effect itself", "remove it")
		case strings.HasPrefix(lower, "nats-"):
			add(field, "is reserved for NATS", "choose another name")
		case strings.ContainsAny(value, "\r\n\x00"):
			add(field, "holds a line break or NUL", "write the value on one line")
		}
	}
	if c.Timeout < 0 {
		add("timeout", "is negative", "write e.g. 10s")
	}
	return errors.Join(append(errs, c.Retry.Problems(intent.EffectNATS)...)...)
}

// subjectProblem says what is wrong with a subject to publish to ("" when
// nothing is).
func subjectProblem(subject string) string {
	for _, r := range subject {
		if r <= ' ' || r == 0x7f {
			return "holds a space or a control character"
		}
	}
	for tok := range strings.SplitSeq(subject, ".") {
		switch tok {
		case "":
			return "has an empty token"
		case "*", ">":
			return "holds a wildcard"
		}
	}
	return ""
}

// MaxDuration is the longest one Fire may take: every request timing out,
// with the longest wait between them.
func (s *Effect) MaxDuration() time.Duration {
	n := time.Duration(s.retry.MaxAttempts)
	return n*s.timeout + (n-1)*s.retry.MaxInterval
}

// Fire sends call to the service, retrying as the policy says. See
// Effect for the request and how replies are classified.
// Outcome.Invocations is the number of requests sent.
func (s *Effect) Fire(ctx context.Context, call effects.Call) (effects.Outcome, error) {
	data := []byte(call.Args)
	if len(data) == 0 {
		data = []byte("{}")
	}
	return effects.Retry(ctx, s.retry, "nats "+s.subject, "request", func(ctx context.Context) (json.RawMessage, error) {
		return s.request(ctx, call, data)
	})
}

// request sends one request and classifies its reply.
func (s *Effect) request(ctx context.Context, call effects.Call, data []byte) (json.RawMessage, error) {
	msg := nats.NewMsg(s.subject)
	msg.Data = data
	for k, v := range s.headers {
		msg.Header[k] = v
	}
	for k, v := range call.Headers() {
		msg.Header.Set(k, v)
	}

	reqCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	answer, err := s.nc.RequestMsgWithContext(reqCtx, msg)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, fmt.Errorf("nats %s: %w", s.subject, ctx.Err())
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("nats %s: no service listens on the subject: %w", s.subject, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return nil, fmt.Errorf("nats %s: no reply within %s (the request may have reached the service)", s.subject, text.FormatDuration(s.timeout))
	default:
		return nil, fmt.Errorf("nats %s: %w", s.subject, err)
	}

	desc, code := answer.Header.Get(headerServiceError), answer.Header.Get(headerServiceErrorCode)
	if desc == "" && code == "" {
		return reply.Result(answer.Data), nil
	}
	what := "nats service " + s.subject + " answered"
	if code != "" {
		what += " " + code
	}
	if desc != "" {
		what += ": " + reply.Quote([]byte(desc))
	}
	if snippet := reply.Quote(answer.Data); snippet != "" {
		what += " (" + snippet + ")"
	}
	n, numErr := strconv.Atoi(code)
	if numErr == nil && n >= 400 && n < 500 && n != 408 && n != 429 {
		return nil, effects.Permanent(intent.CodeEffectFailed, what)
	}
	return nil, errors.New(what)
}
