package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/internal/reply"
	"github.com/idemgate/idemgate/pkg/effects/internal/text"
	"github.com/idemgate/idemgate/pkg/effects/netguard"
)

// KeyPlaceholder is replaced in a probe's URL by the operation's key,
// percent-escaped (a space as %20), so it may stand in a path segment or a
// query value.
const KeyPlaceholder = "{key}"

// DefaultProbeMethod is the HTTP method of a probe that names none.
const DefaultProbeMethod = http.MethodGet

// ProbeConfig configures a webhook's probe (see Effect.Prober). Zero fields
// mean the defaults.
type ProbeConfig struct {
	// URL is the probe's URL, where KeyPlaceholder stands for the key, e.g.
	// https://api.example/refunds?idempotency_key={key}. http or https,
	// with a host that is not the placeholder. Required.
	URL string
	// Method is GET, HEAD or POST (a POST sends no body). Default
	// DefaultProbeMethod.
	Method string
	// Timeout bounds the probe, answer included. Default
	// effects.DefaultProbeTimeout.
	Timeout time.Duration
	// Done are the statuses that mean the operation happened; the answer's
	// body is then its result. Default [200].
	Done []int
	// NotDone are the statuses that mean it did not. Default [404].
	NotDone []int
}

func (c ProbeConfig) withDefaults() ProbeConfig {
	if c.Method == "" {
		c.Method = DefaultProbeMethod
	}
	c.Method = strings.ToUpper(c.Method)
	if c.Timeout == 0 {
		c.Timeout = effects.DefaultProbeTimeout
	}
	if len(c.Done) == 0 {
		c.Done = []int{http.StatusOK}
	}
	if len(c.NotDone) == 0 {
		c.NotDone = []int{http.StatusNotFound}
	}
	return c
}

// Validate reports every invalid field of c (with its defaults applied),
// each a *effects.SettingError whose Field is the probe's field name.
func (c ProbeConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	add := func(field, problem, hint string) {
		errs = append(errs, &effects.SettingError{Kind: "probe", Field: field, Problem: problem, Hint: hint})
	}
	const urlHint = "write e.g. https://api.example/refunds?idempotency_key={key}"
	const mark = "idemgate-probe-key"
	switch u, err := url.Parse(strings.ReplaceAll(c.URL, KeyPlaceholder, mark)); {
	case c.URL == "":
		add("url", "is missing", urlHint)
	case err != nil:
		add("url", fmt.Sprintf("%q is not a URL", c.URL), urlHint)
	case u.Scheme != "http" && u.Scheme != "https":
		add("url", fmt.Sprintf("%q is not an http or https URL", c.URL), urlHint)
	case u.Hostname() == "":
		add("url", fmt.Sprintf("%q has no host", c.URL), urlHint)
	case strings.Contains(u.Host, mark), strings.Contains(u.User.String(), mark):
		add("url", "has "+KeyPlaceholder+" before its path", "the probe goes to a fixed host: put "+KeyPlaceholder+" in the path or the query")
	}
	switch c.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost:
	default:
		add("method", fmt.Sprintf("%q is not one of GET, HEAD, POST", c.Method), "write e.g. method: GET")
	}
	if c.Timeout < 0 {
		add("timeout", "is negative", "write e.g. 5s")
	}
	for _, s := range append(slices.Clone(c.Done), c.NotDone...) {
		if s < 100 || s > 599 {
			add("done", fmt.Sprintf("status %d is not an HTTP status", s), "write e.g. done: {status: 200}")
		}
	}
	for _, s := range c.Done {
		if slices.Contains(c.NotDone, s) {
			add("not_done", fmt.Sprintf("status %d also means done", s), "give each status one meaning")
		}
	}
	return errors.Join(errs...)
}

// Prober is a webhook's probe: one HTTP request that asks the downstream
// whether the operation with a key happened (see Probe).
type Prober struct {
	url     string // the template
	shown   string // the template for the evidence: no credentials, query values other than the key's redacted
	method  string
	timeout time.Duration
	done    []int
	notDone []int
	headers http.Header
	secrets []string
	client  *http.Client
}

var _ effects.Prober = (*Prober)(nil)

// Prober returns the probe of the webhook's downstream that cfg describes,
// or an error joining a *effects.SettingError for every invalid field. The
// probe sends the webhook's static headers and goes only where the webhook
// may (its allow_private), and its messages and evidence redact the same
// secrets, and those of the probe's URL.
func (w *Effect) Prober(cfg ProbeConfig) (*Prober, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	u, _ := url.Parse(strings.ReplaceAll(cfg.URL, KeyPlaceholder, ""))
	var secrets []string
	for _, s := range append(secretsOf(u, nil), w.secrets...) {
		if !strings.Contains(s, KeyPlaceholder) {
			secrets = append(secrets, s)
		}
	}
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	h := w.headers.Clone()
	h.Del("Content-Type")
	return &Prober{
		url:     cfg.URL,
		shown:   shownTemplate(cfg.URL),
		method:  cfg.Method,
		timeout: cfg.Timeout,
		done:    cfg.Done,
		notDone: cfg.NotDone,
		headers: h,
		secrets: secrets,
		client: &http.Client{
			Transport:     netguard.New(w.allow...).Transport(cfg.Timeout),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

// shownTemplate is the probe's URL template as its evidence names it:
// without user and password, each query value but those holding the key
// replaced by [redacted] (a query may carry an API key), the key's
// placeholder kept.
func shownTemplate(template string) string {
	u, err := url.Parse(template)
	if err != nil {
		return "(an invalid URL)"
	}
	query := u.RawQuery
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	base := strings.ReplaceAll(u.String(), "%7Bkey%7D", KeyPlaceholder) // the path's placeholder, escaped by String
	if query == "" {
		return base
	}
	parts := strings.Split(query, "&")
	for i, part := range parts {
		if name, value, ok := strings.Cut(part, "="); ok && !strings.Contains(value, KeyPlaceholder) {
			parts[i] = name + "=[redacted]"
		}
	}
	return base + "?" + strings.Join(parts, "&")
}

// escapeKey escapes key for a path segment or a query value.
func escapeKey(key string) string {
	return strings.ReplaceAll(url.QueryEscape(key), "+", "%20")
}

// Probe sends one request to the probe's URL, with KeyPlaceholder replaced
// by call.Key and the headers a firing sends (Idempotency-Key and the
// others, and the webhook's static headers), and judges the answer by its
// status: one of Done is VerdictDone, its body (JSON, else a JSON string)
// the result; one of NotDone is VerdictNotDone; any other VerdictUnknown. A
// redirect is not followed. No answer within the timeout, a connection
// error or a refused destination is an error wrapping effects.ErrProbe.
func (p *Prober) Probe(ctx context.Context, call effects.Call) (effects.ProbeAnswer, error) {
	key := escapeKey(call.Key)
	target := strings.ReplaceAll(p.url, KeyPlaceholder, key)
	ans := effects.ProbeAnswer{Verdict: effects.VerdictUnknown}
	ans.Evidence.Request = p.method + " " + strings.ReplaceAll(p.shown, KeyPlaceholder, key)
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, p.method, target, nil)
	if err != nil {
		return ans, p.failed(&ans, fmt.Errorf("the probe's URL for this key is not a URL: %w", err))
	}
	req.Header = p.headers.Clone()
	for k, v := range call.Headers() {
		req.Header.Set(k, v)
	}
	if name, bad := unsendableHeader(req.Header); bad {
		return ans, p.failed(&ans, fmt.Errorf("the %s header's value holds a control character", name))
	}
	resp, err := p.client.Do(req)
	if err != nil {
		var de *netguard.DestinationError
		var ue *url.Error
		switch {
		case errors.As(err, &de):
			err = fmt.Errorf("%w (list it in the tool's webhook allow_private or the worker's --webhook-allow to allow it)", de)
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			err = fmt.Errorf("no answer within %s", p.timeout)
		case errors.As(err, &ue):
			err = ue.Err // its message repeats the full URL
		}
		return ans, p.failed(&ans, err)
	}
	defer func() {
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		_ = resp.Body.Close()
	}()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponse+1))
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("no complete answer within %s", p.timeout)
		}
		return ans, p.failed(&ans, fmt.Errorf("reading the %s answer: %w", resp.Status, err))
	}
	ans.Evidence.Status = resp.Status
	ans.Evidence.Body = effects.ClipEvidence(text.Redact(strings.TrimSpace(string(data)), p.secrets))
	switch {
	case slices.Contains(p.done, resp.StatusCode):
		ans.Verdict, ans.Result = effects.VerdictDone, reply.Result(data)
	case slices.Contains(p.notDone, resp.StatusCode):
		ans.Verdict = effects.VerdictNotDone
	}
	return ans, nil
}

// failed records err as the answer's status and returns it wrapping
// effects.ErrProbe.
func (p *Prober) failed(ans *effects.ProbeAnswer, err error) error {
	msg := text.Redact(err.Error(), p.secrets)
	ans.Evidence.Status = effects.ClipEvidence(msg)
	return fmt.Errorf("%w: %s: %s", effects.ErrProbe, ans.Evidence.Request, msg)
}

// Close releases the probe's idle connections.
func (p *Prober) Close() error {
	p.client.CloseIdleConnections()
	return nil
}
