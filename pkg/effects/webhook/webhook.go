// Package webhook is the webhook effect kind: it sends an intent's args to
// an HTTP endpoint, with the operation's key in Idempotency-Key, and reads
// the response as a result, a retry or a permanent failure (see Effect).
// Its connections go only where package netguard allows.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/internal/reply"
	"github.com/idemgate/idemgate/pkg/effects/internal/text"
	"github.com/idemgate/idemgate/pkg/effects/netguard"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Webhook defaults and limits.
const (
	// DefaultMethod is the HTTP method when a webhook names none.
	DefaultMethod = http.MethodPost
	// DefaultTimeout bounds one HTTP request, response body included.
	DefaultTimeout = 10 * time.Second
	// MaxResponse is how much of a response body a webhook reads. The
	// result is recorded in the ledger and sent to every caller, both NATS
	// messages (1 MiB by default, all fields together), so a longer body is
	// cut here and recorded as a JSON string of its first MaxResponse
	// bytes.
	MaxResponse = reply.MaxResult
)

// Config configures a webhook effect. Zero fields mean the defaults.
type Config struct {
	// URL is where requests go: http or https, with a host. Required.
	URL string
	// Method is POST, PUT, PATCH or DELETE. Default DefaultMethod.
	Method string
	// Headers are static headers added to every request, e.g. Authorization.
	// They may not set Content-Type, Content-Length, Transfer-Encoding,
	// Host, Idempotency-Key or any Idem-* header: the webhook sets those.
	Headers map[string]string
	// Timeout bounds one request, response body included. It must exceed
	// what the downstream may legitimately take: a request that times out
	// may still have acted, and its retry is a second firing (same key).
	// Default DefaultTimeout.
	Timeout time.Duration
	// Retry is the retry policy.
	Retry effects.RetryPolicy
	// AllowPrivate lists the addresses outside the public internet the
	// webhook may connect to: loopback, private, link-local, CGNAT and the
	// other ranges a netguard.Guard refuses by default. Every connection is
	// checked when it is dialled, against the address the URL's host
	// resolved to. Default: none (public addresses only).
	AllowPrivate []netip.Prefix
}

// Effect is the effect that sends an intent's args to an HTTP endpoint.
//
// Each Fire sends call.Args as a JSON body with the headers Content-Type:
// application/json, Idempotency-Key: <call.Key> (the same on every retry),
// Idem-Tool, Idem-Session, Idem-Call-Id, Idem-Holder and Idem-Attempt (each
// when set) and the static headers, and classifies the response:
//
//   - 2xx: success. The result is the body when it is JSON, else the body
//     as a JSON string; an empty body is null. Bodies are read up to
//     MaxResponse.
//   - 408, 429, 5xx, a connection error or a request timeout: retried, with
//     exponential backoff and up to RetryPolicy.MaxAttempts requests. When
//     such a response carries Retry-After (seconds or an HTTP date), the
//     wait is that long instead, capped by MaxInterval. When the attempts run out the error is
//     transient and wraps ErrExhausted: the worker tries the operation later.
//   - any other status (other 4xx, and 3xx: redirects are not followed, so
//     the URL must be the final one): a *PermanentError with code
//     effect_failed and a message quoting the status and the start of the
//     body.
//   - a connection to an address the webhook may not reach (see netguard.Guard
//     and Config.AllowPrivate): a *PermanentError with code
//     effect_failed that wraps a *netguard.DestinationError. Nothing was sent.
//
// Messages name the URL without its credentials and query, and the quoted
// body has the values of the static headers, the URL's password and its
// query values replaced by [redacted], so a downstream that echoes a token
// back does not put it in a result.
//
// A retry after a request timed out on this side is a second firing of the
// operation with the same key: the first request may have reached the
// downstream and acted. Only a downstream that honours Idempotency-Key
// absorbs it, so the timeout must exceed what the downstream may
// legitimately take. The same holds when the worker crashes after the
// request and before the result is recorded.
//
// An Effect holds one http.Client with its own connection pool; Close
// releases its idle connections.
type Effect struct {
	url     string
	target  string   // the URL without query or credentials, for messages
	secrets []string // values that messages never quote
	method  string
	headers http.Header
	timeout time.Duration
	retry   effects.RetryPolicy
	client  *http.Client
	allow   []netip.Prefix // Config.AllowPrivate, for the probe
}

// New returns a webhook effect for cfg, or an error joining a
// *SettingError for every invalid field.
func New(cfg Config) (*Effect, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	u, _ := url.Parse(cfg.URL)
	h := make(http.Header, len(cfg.Headers)+1)
	for k, v := range cfg.Headers {
		h.Set(k, v)
	}
	h.Set("Content-Type", "application/json")
	transport := netguard.New(cfg.AllowPrivate...).Transport(cfg.Timeout)
	return &Effect{
		url:     cfg.URL,
		target:  text.URL(cfg.URL),
		secrets: secretsOf(u, cfg.Headers),
		method:  cfg.Method,
		headers: h,
		timeout: cfg.Timeout,
		retry:   cfg.Retry,
		allow:   cfg.AllowPrivate,
		client: &http.Client{
			Transport: transport,
			// A redirect would resend the effect somewhere else (and a 303
			// would turn it into a GET); the URL must be the final one.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

func (c Config) withDefaults() Config {
	if c.Method == "" {
		c.Method = DefaultMethod
	}
	c.Method = strings.ToUpper(c.Method)
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	c.Retry = c.Retry.WithDefaults()
	return c
}

// httpHeaders are set by the webhook itself, besides the operation's
// (effects.ReservedHeader).
var httpHeaders = []string{"Content-Type", "Content-Length", "Transfer-Encoding", "Host"}

// validate checks a config with its defaults applied.
func (c Config) validate() error {
	var errs []error
	add := func(field, problem, hint string) {
		errs = append(errs, &effects.SettingError{Kind: intent.EffectWebhook, Field: field, Problem: problem, Hint: hint})
	}
	const urlHint = "write e.g. http://127.0.0.1:8080/hooks/email"
	if c.URL == "" {
		add("url", "is missing", urlHint)
	} else if u, err := url.Parse(c.URL); err != nil {
		add("url", fmt.Sprintf("%q is not a URL", c.URL), urlHint)
	} else if u.Scheme != "http" && u.Scheme != "https" {
		add("url", fmt.Sprintf("%q is not an http or https URL", c.URL), urlHint)
	} else if u.Host == "" || u.Hostname() == "" {
		add("url", fmt.Sprintf("%q has no host", c.URL), urlHint)
	}
	switch c.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		add("method", fmt.Sprintf("%q is not one of POST, PUT, PATCH, DELETE", c.Method), "write e.g. method: POST")
	}
	for name, value := range c.Headers {
		field := "headers." + name
		switch {
		case !httpguts.ValidHeaderFieldName(name):
			add(field, fmt.Sprintf("%q is not a header name", name), "use letters, digits and '-', e.g. Authorization")
		case isReservedHeader(name):
			add(field, "is set by the webhook itself", "remove it")
		case !httpguts.ValidHeaderFieldValue(value):
			add(field, "holds a line break or another control character", "write the value on one line, without control characters")
		}
	}
	if c.Timeout < 0 {
		add("timeout", "is negative", "write e.g. 10s")
	}
	return errors.Join(append(errs, c.Retry.Problems(intent.EffectWebhook)...)...)
}

func isReservedHeader(name string) bool {
	return effects.ReservedHeader(name) || slices.Contains(httpHeaders, http.CanonicalHeaderKey(name))
}

// unsendableHeader returns the name of a header of h the HTTP client would
// refuse to send.
func unsendableHeader(h http.Header) (string, bool) {
	for name, vs := range h {
		if !httpguts.ValidHeaderFieldName(name) {
			return name, true
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return name, true
			}
		}
	}
	return "", false
}

// MaxDuration is the longest one Fire may take: every attempt timing out,
// with the longest wait between them.
func (w *Effect) MaxDuration() time.Duration {
	n := time.Duration(w.retry.MaxAttempts)
	return n*w.timeout + (n-1)*w.retry.MaxInterval
}

// Close releases the webhook's idle connections. Fire must not be called
// afterwards.
func (w *Effect) Close() error {
	if w != nil {
		w.client.CloseIdleConnections()
	}
	return nil
}

// Fire sends call to the webhook, retrying as the policy says. See Effect
// for the request and how responses are classified. Outcome.Invocations is
// the number of requests sent.
func (w *Effect) Fire(ctx context.Context, call effects.Call) (effects.Outcome, error) {
	body := []byte(call.Args)
	if len(body) == 0 {
		body = []byte("{}")
	}
	return effects.Retry(ctx, w.retry, "webhook "+w.method+" "+w.target, "request", func(ctx context.Context) (json.RawMessage, error) {
		result, retryAfter, err := w.send(ctx, call, body)
		if err != nil && retryAfter >= 0 {
			return nil, effects.RetryAfter(err, retryAfter)
		}
		return result, err
	})
}

// send sends one request. It returns the result on 2xx; otherwise an error,
// a *PermanentError when retrying cannot help, and the wait a Retry-After
// header asked for (-1 when none).
func (w *Effect) send(ctx context.Context, call effects.Call, body []byte) (json.RawMessage, time.Duration, error) {
	reqCtx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, w.method, w.url, bytes.NewReader(body))
	if err != nil {
		return nil, -1, effects.Permanentf(intent.CodeEffectFailed, "webhook %s %s: %v", w.method, w.target, err)
	}
	req.Header = w.headers.Clone()
	for k, v := range call.Headers() {
		req.Header.Set(k, v)
	}
	if name, bad := unsendableHeader(req.Header); bad {
		// The HTTP client would refuse the request before sending it, on
		// every attempt: retrying cannot help.
		return nil, -1, effects.Permanentf(intent.CodeEffectFailed, "webhook %s %s: the %s header's value holds a control character, which HTTP does not allow: the request cannot be sent (nothing was sent)", w.method, w.target, name)
	}

	resp, err := w.client.Do(req)
	if err != nil {
		var de *netguard.DestinationError
		if errors.As(err, &de) {
			return nil, -1, &effects.PermanentError{Code: intent.CodeEffectFailed, Err: de, Message: fmt.Sprintf(
				"webhook %s %s: %v (nothing was sent; list it in the tool's webhook allow_private or the worker's --webhook-allow to allow it)",
				w.method, w.target, de)}
		}
		return nil, -1, w.requestError(ctx, reqCtx, err)
	}
	defer func() {
		// Drain a little so the connection can be reused, then close.
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		_ = resp.Body.Close()
	}()

	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponse+1))
		if err != nil {
			return nil, -1, w.requestError(ctx, reqCtx, fmt.Errorf("reading the %s response: %w", resp.Status, err))
		}
		return reply.Result(data), -1, nil
	}

	data, _ := io.ReadAll(io.LimitReader(resp.Body, reply.QuoteLimit+1))
	msg := fmt.Sprintf("webhook %s %s answered %s", w.method, w.target, resp.Status)
	if snippet := text.Redact(reply.Quote(data), w.secrets); snippet != "" {
		msg += ": " + snippet
	}
	switch code := resp.StatusCode; {
	case code == http.StatusRequestTimeout, code == http.StatusTooManyRequests, code >= 500:
		return nil, retryAfter(resp.Header.Get("Retry-After")), errors.New(msg)
	case code >= 300 && code < 400:
		return nil, -1, effects.Permanent(intent.CodeEffectFailed, msg+" (redirects are not followed: configure the final URL)")
	default:
		return nil, -1, effects.Permanent(intent.CodeEffectFailed, msg)
	}
}

// requestError describes a failed request; all are transient.
func (w *Effect) requestError(ctx, reqCtx context.Context, err error) error {
	if ctx.Err() == nil && errors.Is(reqCtx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("webhook %s %s: no complete response within %s (the request may have reached the downstream)", w.method, w.target, w.timeout)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // its message repeats the full URL, credentials and query included
	}
	return fmt.Errorf("webhook %s %s: %w", w.method, w.target, err)
}

// secretsOf collects the values a message must not quote: the static
// headers' values (and the credentials of an Authorization-style "scheme
// token" value), the URL's password and its query values. Values under four
// bytes are left out: replacing them would garble messages and hide little.
func secretsOf(u *url.URL, headers map[string]string) []string {
	var out []string
	add := func(v string) {
		if v = strings.TrimSpace(v); len(v) >= 4 {
			out = append(out, v)
		}
	}
	for _, v := range headers {
		add(v)
		if _, cred, ok := strings.Cut(strings.TrimSpace(v), " "); ok {
			add(cred)
		}
	}
	if u != nil {
		if pw, ok := u.User.Password(); ok {
			add(pw)
		}
		for _, vs := range u.Query() {
			for _, v := range vs {
				add(v)
			}
		}
	}
	// Longest first, so a value that contains another is replaced whole.
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// retryAfter parses a Retry-After header: delay seconds or an HTTP date.
// It returns -1 when the header is absent or malformed.
func retryAfter(v string) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return -1
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return -1
		}
		return time.Duration(min(secs, int64(24*time.Hour/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return -1
}
