package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Defaults of Config.
const (
	DefaultListMaxScan        = 10000
	DefaultWorkerMetricsEvery = time.Minute
)

// Config is what a Console serves. Tokens and Limiter are required; the zero value of every other field means its documented
// default.
type Config struct {
	// Tokens are the tokens an operator logs in with (an operator token
	// logs in, an agent's does not). Required.
	Tokens *auth.Tokens
	// Limiter admits a logged-in operator's requests within its token's
	// limits. Required.
	Limiter Limiter
	// MaxBodyBytes bounds a form's body. Default: intent.DefaultMaxBytes
	// (256 KiB).
	MaxBodyBytes int
	// ListMaxScan bounds the records one queue or search page reads (see
	// dedup.Query.MaxScan). Default: 10000.
	ListMaxScan int
	// HTTPS says that the browser reaches the console over HTTPS (the front
	// door serves TLS, or a proxy on its host terminates it): the session
	// cookie is Secure and the commands the pages show name https URLs.
	// Default: false.
	HTTPS bool
	// WorkerMetrics are the workers' Prometheus /metrics URLs the overview
	// charts its rates from (docs/console.md). Default: none, no rates.
	WorkerMetrics []string
	// WorkerMetricsEvery is how often the console reads WorkerMetrics: the
	// width of a chart's bar. Default: 1m.
	WorkerMetricsEvery time.Duration
}

// Limiter admits a logged-in operator's requests: the front door that
// mounts the console applies the token's limits, shared with its other
// requests.
type Limiter interface {
	// Admit admits a request of tok and returns leave, which the request
	// calls once it ends; or it refuses it: a nil leave, how long to wait
	// before trying again, and why, as a sentence for the operator.
	Admit(tok *auth.Token) (leave func(), wait time.Duration, why string)
}

// LimiterFunc is a function as a Limiter.
type LimiterFunc func(tok *auth.Token) (leave func(), wait time.Duration, why string)

// Admit calls f.
func (f LimiterFunc) Admit(tok *auth.Token) (func(), time.Duration, string) { return f(tok) }

func (c *Config) setDefaults() {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = intent.DefaultMaxBytes
	}
	if c.ListMaxScan == 0 {
		c.ListMaxScan = DefaultListMaxScan
	}
	if c.WorkerMetricsEvery == 0 {
		c.WorkerMetricsEvery = DefaultWorkerMetricsEvery
	}
}

func (c *Config) validate() error {
	switch {
	case c.Tokens == nil || c.Tokens.Len() == 0:
		return errors.New("console: no tokens: give the tokens file operators log in with")
	case c.Limiter == nil:
		return errors.New("console: no limiter: give the Limiter that admits an operator's requests")
	case c.MaxBodyBytes < 1:
		return fmt.Errorf("console: max body bytes %d: must be positive", c.MaxBodyBytes)
	case c.ListMaxScan < 1:
		return fmt.Errorf("console: list max scan %d: must be at least 1", c.ListMaxScan)
	case c.WorkerMetricsEvery < time.Second:
		return fmt.Errorf("console: worker metrics every %s: use at least 1s", c.WorkerMetricsEvery)
	}
	for _, u := range c.WorkerMetrics {
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("console: worker metrics URL %q: give a worker's http(s)://host:port/metrics (its --admin-addr)", clip(u))
		}
	}
	return nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// retryAfter sets Retry-After to d, rounded up to whole seconds (at least
// one).
func retryAfter(w http.ResponseWriter, d time.Duration) {
	s := int((d + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(max(s, 1)))
}
