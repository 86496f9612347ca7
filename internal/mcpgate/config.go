package mcpgate

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemgate/idemgate/pkg/effects"
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
)

// Config is the behaviour of a Gate. The zero value of every field means its
// documented default.
type Config struct {
	// Prefix names the installation's subjects, stream and bucket, as the
	// workers' --prefix. Default: intent.DefaultPrefix.
	Prefix string
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
	// Logger receives the gate's log. Default: discard.
	Logger *slog.Logger
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
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
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
	if c.Upstream != "" {
		up, err := effects.ParseMCPUpstream(c.Upstream)
		if err != nil {
			errs = append(errs, fmt.Errorf("mcpgate: upstream: %w", err))
		}
		c.Upstream = up.String()
	}
	if _, err := intent.NewNames(c.Prefix); err != nil {
		errs = append(errs, fmt.Errorf("mcpgate: %w", err))
	}
	return errors.Join(errs...)
}
