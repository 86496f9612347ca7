package mcpgate

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/pkg/effects/mcp/upstream"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Defaults of Config.
const (
	// DefaultWait bounds how long one tools/call waits for its operation's
	// answer before it returns a reference to check later.
	DefaultWait = 3 * time.Minute
	// DefaultProgressEvery is how often a waiting call reports progress.
	DefaultProgressEvery = time.Second
	// DefaultRefresh is how often the tool catalogue is read again.
	DefaultRefresh = 30 * time.Second
	// DefaultMaxArgsBytes bounds a call's arguments.
	DefaultMaxArgsBytes = intent.DefaultMaxBytes - 4<<10
	// MaxStatusWait bounds the wait an idemgate_status call may ask for.
	MaxStatusWait = time.Minute
	// DefaultMaxSessions bounds the MCP sessions open over HTTP at once.
	DefaultMaxSessions = 1000
	// DefaultMaxSessionsPerToken bounds one token's MCP sessions.
	DefaultMaxSessionsPerToken = 100
	// DefaultMaxCalls bounds the calls in progress over HTTP at once.
	DefaultMaxCalls = 1000
	// DefaultMaxCallsPerToken bounds one token's calls in progress, as the
	// HTTP front door's --max-in-flight.
	DefaultMaxCallsPerToken = 256
	// DefaultSessionIdle closes an MCP session that has had no request for
	// this long.
	DefaultSessionIdle = 10 * time.Minute
)

// Config is the behaviour of a Gate. The zero value of every field means its
// documented default.
type Config struct {
	// Session is the scope of every call that names none itself (neither the
	// io.idemgate/session _meta field nor the Idem-Session HTTP header).
	// Default "": one scope for every caller, within the ledger's retention.
	Session string
	// Wait bounds how long a call waits for its operation's answer; past it
	// the call returns the operation's reference for idemgate_status. The
	// operation goes on. Default DefaultWait.
	Wait time.Duration
	// ProgressEvery is how often a waiting call whose request carries a
	// progress token is sent a progress notification. Default
	// DefaultProgressEvery.
	ProgressEvery time.Duration
	// Refresh is how often the tool catalogue is read again, so tools that
	// appear or go are offered or withdrawn (clients are sent
	// notifications/tools/list_changed). Default DefaultRefresh.
	Refresh time.Duration
	// MaxArgsBytes bounds a call's arguments in bytes; larger ones are
	// refused before publishing. Default DefaultMaxArgsBytes.
	MaxArgsBytes int
	// Upstream, when set, is the MCP server this gate stands in front of
	// (proxy mode): a command ("npx some-server") or a streamable HTTP URL.
	// The gate serves only the catalogue's tools of that upstream (the
	// workers' tools file lists it under mcp_upstreams), and idemgate_status.
	// Default "": every catalogue tool.
	Upstream string
	// Tokens are the callers admitted over HTTP, from the tokens file the
	// HTTP front door reads: a request to HTTPPath needs "Authorization:
	// Bearer <token>" of one of them, or is answered 401. The token's
	// namespace scopes every session its calls name (as the HTTP front
	// door's: "<namespace>" or "<namespace>/<session>") and the operations
	// idemgate_status reads. stdio takes no token. Default nil: no
	// authentication, which CheckListen allows on a loopback address only.
	Tokens *auth.Tokens
	// ResourceURL is the URL clients reach HTTPPath at, as named by the
	// protected resource metadata and by 401 answers (behind a proxy:
	// https://mcp.example.com/mcp). Default: http://<the request's Host>/mcp.
	ResourceURL string
	// MaxSessions bounds the MCP sessions (protocol 2025-11-25 and earlier)
	// open over HTTP at once, every caller's together; a request that would
	// open another ends the least recently used idle session of the caller
	// holding the most, and is answered 429 only when none is idle. Default
	// DefaultMaxSessions.
	MaxSessions int
	// MaxSessionsPerToken bounds one token's MCP sessions (callers without a
	// token share one allowance); over it the token's least recently used
	// idle session ends, and only when none is idle: 429. Default
	// DefaultMaxSessionsPerToken.
	MaxSessionsPerToken int
	// MaxCalls bounds the HTTP requests carrying a JSON-RPC request (a
	// tools/call waiting for its operation, a list, a ping) in progress at
	// once, every caller's together; over it: 429. Default DefaultMaxCalls.
	MaxCalls int
	// MaxCallsPerToken bounds one token's requests in progress as MaxCalls
	// does all of them. Default DefaultMaxCallsPerToken.
	MaxCallsPerToken int
	// SessionIdle closes an MCP session over HTTP that has had no request for
	// this long; its client must initialize a new one. Default
	// DefaultSessionIdle.
	SessionIdle time.Duration
	// AllowOrigins are the origins (scheme://host[:port]) besides the
	// endpoint's own whose browser pages may call HTTPPath: a request with
	// an Origin header naming any other is refused (403), as the MCP
	// transport spec asks against DNS rebinding. A request without Origin
	// (not sent by a browser) is served. Default none: the endpoint's own
	// origin only (the request's Host, and ResourceURL's).
	AllowOrigins []string
}

func (c *Config) setDefaults() {
	if c.Wait == 0 {
		c.Wait = DefaultWait
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = DefaultProgressEvery
	}
	if c.Refresh == 0 {
		c.Refresh = DefaultRefresh
	}
	if c.MaxArgsBytes == 0 {
		c.MaxArgsBytes = DefaultMaxArgsBytes
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.MaxSessionsPerToken == 0 {
		c.MaxSessionsPerToken = DefaultMaxSessionsPerToken
	}
	if c.MaxCalls == 0 {
		c.MaxCalls = DefaultMaxCalls
	}
	if c.MaxCallsPerToken == 0 {
		c.MaxCallsPerToken = DefaultMaxCallsPerToken
	}
	if c.SessionIdle == 0 {
		c.SessionIdle = DefaultSessionIdle
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.Wait < 0 {
		errs = append(errs, fmt.Errorf("mcpgate: wait %s is negative: use e.g. 3m", c.Wait))
	}
	if c.ProgressEvery < 0 {
		errs = append(errs, fmt.Errorf("mcpgate: progress interval %s is negative: use e.g. 1s", c.ProgressEvery))
	}
	if c.Refresh < 0 {
		errs = append(errs, fmt.Errorf("mcpgate: refresh %s is negative: use e.g. 30s", c.Refresh))
	}
	if c.MaxArgsBytes < 0 || c.MaxArgsBytes > intent.DefaultMaxBytes {
		errs = append(errs, fmt.Errorf("mcpgate: max args bytes %d: use 1 to %d", c.MaxArgsBytes, intent.DefaultMaxBytes))
	}
	for name, n := range map[string]int{"max sessions": c.MaxSessions, "max sessions per token": c.MaxSessionsPerToken, "max calls": c.MaxCalls, "max calls per token": c.MaxCallsPerToken} {
		if n < 1 {
			errs = append(errs, fmt.Errorf("mcpgate: %s %d: must be at least 1", name, n))
		}
	}
	if c.SessionIdle < 0 {
		errs = append(errs, fmt.Errorf("mcpgate: session idle %s is negative: use e.g. 10m", c.SessionIdle))
	}
	if c.ResourceURL != "" {
		u, err := url.Parse(c.ResourceURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			errs = append(errs, fmt.Errorf("mcpgate: resource URL %q: give the absolute URL clients reach the MCP endpoint at, e.g. https://mcp.example.com/mcp (no query, fragment or user)", c.ResourceURL))
		}
	}
	for i, o := range c.AllowOrigins {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			errs = append(errs, fmt.Errorf("mcpgate: allowed origin %q: give scheme://host[:port], e.g. https://app.example.com", o))
			continue
		}
		c.AllowOrigins[i] = u.Scheme + "://" + strings.ToLower(u.Host)
	}
	if c.Upstream != "" {
		up, err := upstream.Parse(c.Upstream)
		if err != nil {
			errs = append(errs, fmt.Errorf("mcpgate: upstream: %w", err))
		}
		c.Upstream = up.String()
	}
	return errors.Join(errs...)
}
