package httpapi

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/console"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Defaults of Config.
const (
	DefaultAddr              = "127.0.0.1:8080"
	DefaultRate              = 50
	DefaultBurst             = 100
	DefaultMaxInFlight       = 256
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultBodyTimeout       = 10 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultWait              = 3 * time.Minute
	DefaultMaxWait           = 5 * time.Minute
	DefaultListMaxScan       = 10000
	// DefaultWorkerMetricsEvery is the console's (1m).
	DefaultWorkerMetricsEvery = console.DefaultWorkerMetricsEvery
	// maxHeaderBytes bounds a request's line and headers: over it the
	// request is answered 431, a problem.
	maxHeaderBytes = 16 << 10
	// hardHeaderBytes is where net/http stops reading headers (it answers
	// 431 itself, in plain text, and closes the connection): far past
	// maxHeaderBytes, so that the requests just over the limit get the
	// problem answer, and bounded, so that a connection cannot make the
	// server hold megabytes of headers.
	hardHeaderBytes = 64 << 10
)

// Config is the behaviour of a Server. The zero value of every field but
// Tokens means its documented default.
type Config struct {
	// Addr is where the API listens. A host that is not loopback (an IP
	// address, "localhost", or empty for every interface) needs TLS
	// (TLSCert and TLSKey) or InsecureListen. Default: "127.0.0.1:8080".
	Addr string
	// TLSCert and TLSKey are the PEM certificate and key HTTPS is served
	// with. Default: none, plain HTTP.
	TLSCert, TLSKey string
	// InsecureListen allows plain HTTP on an address that is not loopback
	// (behind a proxy that terminates TLS on the same host, say). Default:
	// false.
	InsecureListen bool
	// Tokens are the callers admitted. Required.
	Tokens *auth.Tokens
	// MaxBodyBytes is the largest request body; a larger one is answered 413.
	// It also bounds the intent built from a tool call, which the workers
	// refuse above their own limit. Default: intent.DefaultMaxBytes (256
	// KiB).
	MaxBodyBytes int
	// Rate is how many requests per second one token may make; over it
	// requests are answered 429 with Retry-After. Default: 50.
	Rate float64
	// Burst is how many requests a token may make at once above Rate.
	// Default: 100.
	Burst int
	// MaxInFlight bounds one token's requests in progress (each waiting
	// call holds a connection and a ledger watch); over it: 429. Default:
	// 256.
	MaxInFlight int
	// ReadHeaderTimeout bounds how long a client may take to send a
	// request's headers (a slowloris client is cut off). Default: 5s.
	ReadHeaderTimeout time.Duration
	// BodyTimeout bounds how long a client may take to send a request's
	// body after its headers; over it: 408. Default: 10s.
	BodyTimeout time.Duration
	// IdleTimeout closes a keep-alive connection idle this long. Default: 2m.
	IdleTimeout time.Duration
	// DefaultWait is how long a tool call waits for its answer when the
	// request has no Prefer: wait=N. It exceeds a crashed holder's recovery
	// at the default lease, as submit's does. Default: 3m.
	DefaultWait time.Duration
	// MaxWait caps Prefer: wait=N and ?wait=N. Default: 5m.
	MaxWait time.Duration
	// ListMaxScan bounds the records one listing request reads (see
	// dedup.Query.MaxScan): a selective filter over a large ledger returns
	// a short page and a cursor instead of holding the request. Default:
	// 10000.
	ListMaxScan int
	// WorkerMetrics are the workers' Prometheus /metrics URLs the console's
	// overview charts its rates from (docs/console.md). Default: none, no
	// rates.
	WorkerMetrics []string
	// WorkerMetricsEvery is how often the console reads WorkerMetrics: the
	// width of a chart's bar. Default: DefaultWorkerMetricsEvery (1m).
	WorkerMetricsEvery time.Duration
}

func (c *Config) setDefaults() {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = intent.DefaultMaxBytes
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.BodyTimeout == 0 {
		c.BodyTimeout = DefaultBodyTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.DefaultWait == 0 {
		c.DefaultWait = DefaultWait
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.ListMaxScan == 0 {
		c.ListMaxScan = DefaultListMaxScan
	}
	if c.WorkerMetricsEvery == 0 {
		c.WorkerMetricsEvery = DefaultWorkerMetricsEvery
	}
}

func (c *Config) validate() error {
	host, _, err := net.SplitHostPort(c.Addr)
	switch {
	case err != nil:
		return fmt.Errorf("httpapi: listen address %q: %w (use host:port, e.g. %s)", c.Addr, err, DefaultAddr)
	case c.Tokens == nil || c.Tokens.Len() == 0:
		return errors.New("httpapi: no tokens: give a tokens file (gateway token prints a line of one)")
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("httpapi: a TLS certificate needs its key and the key its certificate: give both --tls-cert and --tls-key")
	case !loopback(host) && c.TLSCert == "" && !c.InsecureListen:
		return fmt.Errorf("httpapi: listen address %q is not loopback: serve TLS (--tls-cert, --tls-key) or say --insecure-listen (a proxy on this host terminates TLS)", c.Addr)
	case c.MaxBodyBytes < 2:
		return fmt.Errorf("httpapi: max body bytes %d: must be at least 2 (an empty object)", c.MaxBodyBytes)
	case c.Rate < 0:
		return fmt.Errorf("httpapi: rate %g: must be positive (requests per second per token)", c.Rate)
	case c.Burst < 1:
		return fmt.Errorf("httpapi: burst %d: must be at least 1", c.Burst)
	case c.MaxInFlight < 1:
		return fmt.Errorf("httpapi: max in flight %d: must be at least 1", c.MaxInFlight)
	case c.ReadHeaderTimeout < 0 || c.BodyTimeout < 0 || c.IdleTimeout < 0:
		return errors.New("httpapi: timeouts must be positive (0 for the default)")
	case c.DefaultWait < time.Second || c.MaxWait < c.DefaultWait:
		return fmt.Errorf("httpapi: wait %s, max wait %s: the wait must be at least 1s and at most the max wait", c.DefaultWait, c.MaxWait)
	case c.ListMaxScan < 1:
		return fmt.Errorf("httpapi: list max scan %d: must be at least 1", c.ListMaxScan)
	}
	return nil // the console checks its own settings
}

// loopback reports whether host names only this machine.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
