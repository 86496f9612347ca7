package toolsfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/internal/text"
	"github.com/idemgate/idemgate/pkg/effects/mcp"
	"github.com/idemgate/idemgate/pkg/effects/natsservice"
	"github.com/idemgate/idemgate/pkg/effects/noop"
	"github.com/idemgate/idemgate/pkg/effects/smtp"
	"github.com/idemgate/idemgate/pkg/effects/webhook"
	"github.com/idemgate/idemgate/pkg/intent"
)

// kindReader reads the settings of one effect kind — the mapping named
// after the kind under a tool (a tool's "webhook:"), empty when the tool has
// none — and builds the effect with the kind's constructor. It reads its
// fields with the section's getters and reports bad values with
// section.Invalid (the constructor's *effects.SettingErrors with
// section.invalidSettings); fields it does not read are reported as
// unknown. It returns an error only for a problem it did not report on the
// section (the error is then recorded at the section's line); once it has
// reported problems, its returned error and effect are ignored.
type kindReader func(s *section) (effects.Effect, error)

// builtinKinds are the effect kinds a tools file may name, each with its
// reader. The nats kind is there only with a connection (WithNATSConn).
// The list is fixed: a tool in another language is served through the nats
// effect (a NATS service) or the mcp effect (an MCP server), not a Go
// plug-in (docs/tools.md, "Adding a tool in another language").
func builtinKinds(nc *nats.Conn, withNATS bool) map[string]kindReader {
	k := map[string]kindReader{
		intent.EffectWebhook: readWebhook,
		intent.EffectSMTP:    readSMTP,
		intent.EffectMCP:     readMCP,
		intent.EffectNoop:    readNoop,
	}
	if withNATS {
		k[intent.EffectNATS] = readNATS(nc)
	}
	return k
}

// withKind makes kind available as a tool's effect, read by read, or
// replaces a built-in one: a test's seam. A kind is [a-z][a-z0-9_]{0,31}
// and may not be one of a tool's own field names.
func withKind(kind string, read kindReader) Option {
	return func(o *options) {
		switch {
		case !kindPattern.MatchString(kind):
			o.errs = append(o.errs, fmt.Errorf("toolsfile: effect kind %q: use [a-z][a-z0-9_]{0,31}", kind))
		case slices.Contains(toolFields, kind):
			o.errs = append(o.errs, fmt.Errorf("toolsfile: effect kind %q is a tool field name", kind))
		case read == nil:
			o.errs = append(o.errs, fmt.Errorf("toolsfile: effect kind %q: nil reader", kind))
		default:
			o.kinds[kind] = read
		}
	}
}

// invalidSettings reports what a kind's constructor refused: each
// *SettingError at its field, anything else at the section.
func (s *section) invalidSettings(err error) {
	if errs, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range errs.Unwrap() {
			s.invalidSettings(e)
		}
		return
	}
	if se, ok := errors.AsType[*effects.SettingError](err); ok {
		s.Invalid(se.Field, se.Problem, se.Hint)
		return
	}
	s.Invalid("", err.Error(), "")
}

// readWebhook builds a webhook from a tool's "webhook:" settings, allowed
// to reach the addresses its allow_private lists and those of
// WithAllowPrivate.
func readWebhook(s *section) (effects.Effect, error) {
	cfg := webhook.Config{
		URL:     s.String("url", ""),
		Method:  s.String("method", webhook.DefaultMethod),
		Headers: s.StringMap("headers"),
		Timeout: positiveDuration(s, "timeout", webhook.DefaultTimeout),
		Retry:   readRetry(s),
	}
	cfg.AllowPrivate = append(append([]netip.Prefix(nil), s.c.allow...), readAllowPrivate(s)...)
	if !s.Present() {
		s.Invalid("", "is missing", "add webhook: with at least url: http://...")
		return nil, nil
	}
	w, err := webhook.New(cfg)
	if err != nil {
		s.invalidSettings(err)
		return nil, nil
	}
	warnPrivateURL(s, cfg.URL, cfg.AllowPrivate, "webhook")
	return w, nil
}

// readSMTP builds an smtp effect from a tool's "smtp:" settings; the
// password comes from the environment variable password_env names.
func readSMTP(s *section) (effects.Effect, error) {
	cfg := smtp.Config{
		Addr:     s.String("addr", ""),
		From:     s.String("from", ""),
		StartTLS: smtp.StartTLSPolicy(s.String("starttls", string(smtp.StartTLSOpportunistic))),
		CAFile:   s.String("ca_file", ""),
		Username: s.String("username", ""),
		Timeout:  positiveDuration(s, "timeout", smtp.DefaultTimeout),
		Retry:    readRetry(s),
		Helo:     s.String("helo", smtp.DefaultHelo),
	}
	passwordOK := true
	if s.Has("password_env") {
		name := s.String("password_env", "")
		switch pw, set := os.LookupEnv(name); {
		case !envNamePattern.MatchString(name):
			s.Invalid("password_env", fmt.Sprintf("%q is not an environment variable name", name), "write e.g. password_env: SMTP_PASSWORD")
			passwordOK = false
		case !set || pw == "":
			s.Invalid("password_env", fmt.Sprintf("the environment variable %s is not set", name), "set it in the worker's environment; the password is never written in this file")
			passwordOK = false
		case cfg.Username == "":
			s.Invalid("password_env", "is set, but username is missing", "add username:, or remove password_env")
		default:
			cfg.Password = pw
		}
	} else if cfg.Username != "" {
		s.Invalid("password_env", "is missing", "add password_env: naming the environment variable that holds the password")
		passwordOK = false
	}
	if !s.Present() {
		s.Invalid("", "is missing", "add smtp: with at least addr: and from:")
		return nil, nil
	}
	if !passwordOK {
		cfg.Username = "" // reported above; the constructor must not report it again
	}
	eff, err := smtp.New(cfg)
	if err != nil {
		s.invalidSettings(err)
		return nil, nil
	}
	return eff, nil
}

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// readNATS returns the reader of a tool's "nats:" settings (subject,
// timeout, retry and headers; docs/tools.md describes them), whose effects
// send on nc. With a nil nc every nats tool is a problem.
func readNATS(nc *nats.Conn) kindReader {
	return func(s *section) (effects.Effect, error) {
		cfg := natsservice.Config{
			Subject: s.String("subject", ""),
			Timeout: positiveDuration(s, "timeout", natsservice.DefaultTimeout),
			Retry:   readRetry(s),
			Headers: s.StringMap("headers"),
		}
		if !s.Present() {
			s.Invalid("", "is missing", "add nats: with at least subject: ...")
			return nil, nil
		}
		if err := cfg.Validate(); err != nil {
			s.invalidSettings(err)
			return nil, nil
		}
		if nc == nil {
			return nil, errors.New("no NATS connection: the worker must pass one with WithNATSConn")
		}
		eff, err := natsservice.New(nc, cfg)
		if err != nil {
			return nil, err
		}
		return eff, nil
	}
}

// readNoop builds a noop from a tool's "noop:" settings.
func readNoop(s *section) (effects.Effect, error) {
	cfg := noop.Config{Delay: s.Duration("delay", 0)}
	if node, ok := s.Value("result"); ok {
		var v any
		if err := node.Decode(&v); err != nil {
			s.Invalid("result", "is not a plain value: "+err.Error(), "write a JSON-like value, e.g. result: {ok: true}")
			return nil, nil
		}
		data, err := json.Marshal(v)
		if err != nil {
			s.Invalid("result", "cannot be written as JSON", "use string keys and finite numbers")
			return nil, nil
		}
		cfg.Result = data
	}
	n, err := noop.New(cfg)
	if err != nil {
		s.invalidSettings(err)
		return nil, nil
	}
	return n, nil
}

// readMCP builds an mcp effect from a tool's "mcp:" settings: the upstream
// (by its name under mcp_upstreams, or a command or url of its own), the
// upstream's tool name, a timeout and a retry policy.
func readMCP(s *section) (effects.Effect, error) {
	cfg := mcp.Config{Tool: s.String("tool", ""), Timeout: positiveDuration(s, "timeout", mcp.DefaultTimeout), Retry: readRetry(s)}
	invalid := cfg.Validate()
	if invalid != nil {
		s.invalidSettings(invalid)
	}
	var conn *mcp.Conn
	name := s.String("upstream", "")
	up := readUpstream(s)
	switch {
	case name != "" && (len(up.Command) > 0 || up.URL != ""):
		s.Invalid("upstream", "is given with command or url", "name an mcp_upstreams entry, or give command or url, not both")
	case name != "" && s.Has("allow_private"):
		s.Invalid("allow_private", "is given with upstream", "write allow_private in the mcp_upstreams entry")
	case name != "":
		if conn = s.c.upstreams[name]; conn == nil {
			s.Invalid("upstream", fmt.Sprintf("no mcp_upstreams entry is named %q", name), "add it under mcp_upstreams, or give command or url")
		}
	default:
		if err := up.Validate(); err != nil {
			s.Invalid("", err.Error(), "write e.g. mcp: {url: https://mcp.example.com/mcp, tool: create_issue}")
		} else {
			warnPrivateURL(s, up.URL, up.AllowPrivate, "mcp upstream")
			conn = mcp.NewConn(up, nil)
			s.c.owned = append(s.c.owned, conn)
		}
	}
	if invalid != nil || conn == nil {
		return nil, nil // reported above
	}
	m, err := mcp.New(conn, cfg)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// readRetry reads a "retry:" block, reporting an explicit zero (which
// would mean "default" in code) as a mistake.
func readRetry(s *section) effects.RetryPolicy {
	r := s.Section("retry")
	p := effects.RetryPolicy{
		MaxAttempts:     r.Int("max_attempts", effects.DefaultMaxAttempts),
		InitialInterval: r.Duration("initial_interval", effects.DefaultInitialInterval),
		MaxInterval:     r.Duration("max_interval", effects.DefaultMaxInterval),
	}
	for _, f := range []struct {
		name string
		zero bool
		hint string
	}{
		{"max_attempts", p.MaxAttempts == 0, "write e.g. 4; 1 disables retries"},
		{"initial_interval", p.InitialInterval == 0, "write e.g. 200ms"},
		{"max_interval", p.MaxInterval == 0, "write e.g. 5s"},
	} {
		if f.zero && r.Has(f.name) {
			r.Invalid(f.name, "must be positive", f.hint)
		}
	}
	return p
}

// positiveDuration reads a duration field that must not be written as zero
// (zero means "default" in code).
func positiveDuration(s *section, name string, def time.Duration) time.Duration {
	d := s.Duration(name, def)
	if d == 0 && s.Has(name) {
		s.Invalid(name, "must be positive", "write e.g. "+text.FormatDuration(def))
	}
	return d
}
