// Package mcp is the mcp effect kind: it calls a tool of an upstream MCP
// server over a shared client session (Conn), forwarding the operation's
// key in the call's _meta (see Effect). Package upstream names the server.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/internal/text"
	"github.com/idemgate/idemgate/pkg/effects/mcp/upstream"
	"github.com/idemgate/idemgate/pkg/effects/netguard"
	"github.com/idemgate/idemgate/pkg/intent"
)

// MetaKey is the _meta field of the tools/call the mcp effect sends
// upstream, holding the operation's idempotency key: an upstream that
// understands it can absorb a repeat too.
const MetaKey = "io.idemgate/key"

// MetaHolder and MetaAttempt are the _meta fields that carry the firing's
// holder and attempt (HeaderHolder, HeaderAttempt of the other effects).
const (
	MetaHolder  = "io.idemgate/holder"
	MetaAttempt = "io.idemgate/attempt"
)

// Defaults of the mcp effect.
const (
	// DefaultTimeout bounds one call to an upstream tool (connecting
	// included).
	DefaultTimeout = 30 * time.Second
)

// urlSecrets are the parts of a URL a message never quotes: its password,
// user and query values (and the whole query and fragment), longest first,
// as secretsOf collects a webhook's. Under four bytes they are left out.
func urlSecrets(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	var out []string
	add := func(v string) {
		if len(v) >= 4 {
			out = append(out, v)
		}
	}
	if u.User != nil {
		add(u.User.Username())
		if pw, ok := u.User.Password(); ok {
			add(pw)
		}
	}
	add(u.RawQuery)
	add(u.Fragment)
	for _, vs := range u.Query() {
		for _, v := range vs {
			add(v)
			add(url.QueryEscape(v))
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// redactedError is an error whose message had secrets removed; errors.Is
// and errors.As still see the error it wraps.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// ErrRedirect is matched by errors.Is when a URL upstream answered with a
// redirect: it is never followed.
var ErrRedirect = errors.New("the upstream answered with a redirect, which is not followed")

// Conn is a client session to an upstream MCP server, shared by every
// tool of that upstream and safe for concurrent use. It connects on first
// use, and again after a call finds the session broken (a killed stdio
// server is started again).
type Conn struct {
	up       upstream.Server
	onChange func()       // the upstream's tools changed
	http     *http.Client // a URL upstream's, dialling through its netguard.Guard
	secrets  []string     // what messages never quote (see hide)

	mu     sync.Mutex
	cs     *sdk.ClientSession
	closed bool
}

// NewConn returns a connection to up; onChange, when not nil, is called
// (on its own goroutine) when the upstream sends
// notifications/tools/list_changed.
func NewConn(up upstream.Server, onChange func()) *Conn {
	c := &Conn{up: up, onChange: onChange}
	if up.URL != "" {
		c.http = &http.Client{
			Transport: netguard.New(up.AllowPrivate...).Transport(DefaultTimeout),
			// A redirect would move a tools/call, with the model's arguments
			// and the key, to a host the tools file does not name.
			CheckRedirect: func(*http.Request, []*http.Request) error { return ErrRedirect },
		}
		c.secrets = urlSecrets(up.URL)
	}
	return c
}

// hide returns err with the upstream's secrets taken out of its message:
// the URL's credentials, query and fragment wherever the message quotes the
// URL or any of them (an HTTP client's error names the URL it requested,
// and an upstream may echo what it was sent). nil stays nil.
func (c *Conn) hide(err error) error {
	if err == nil {
		return nil
	}
	msg := c.hideText(err.Error())
	if msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, err: err}
}

// hideText is hide for a message.
func (c *Conn) hideText(msg string) string {
	if c.up.URL == "" {
		return msg
	}
	forms := []string{c.up.URL}
	if u, err := url.Parse(c.up.URL); err == nil && u.User != nil {
		// The forms an error may quote: url.URL.Redacted's, and the HTTP
		// client's, which writes the password as ***.
		forms = append(forms, u.Redacted())
		if _, ok := u.User.Password(); ok {
			forms = append(forms, strings.Replace(u.String(), u.User.String()+"@", u.User.Username()+":***@", 1))
		}
	}
	for _, f := range forms {
		msg = strings.ReplaceAll(msg, f, text.URL(c.up.URL))
	}
	return text.Redact(msg, c.secrets)
}

// Upstream is the server the connection reaches.
func (c *Conn) Upstream() upstream.Server { return c.up }

// session returns the live client session, connecting first if there is
// none.
func (c *Conn) session(ctx context.Context) (*sdk.ClientSession, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("effects: mcp connection closed")
	}
	if c.cs != nil {
		return c.cs, nil
	}
	var t sdk.Transport
	if c.up.URL != "" {
		t = &sdk.StreamableClientTransport{Endpoint: c.up.URL, HTTPClient: c.http, MaxRetries: -1}
	} else {
		// The process outlives ctx (a call's): it is stopped by Close or
		// when its session breaks.
		t = &sdk.CommandTransport{Command: exec.Command(c.up.Command[0], c.up.Command[1:]...), TerminateDuration: time.Second}
	}
	opts := &sdk.ClientOptions{}
	if c.onChange != nil {
		opts.ToolListChangedHandler = func(context.Context, *sdk.ToolListChangedRequest) { go c.onChange() }
	}
	cl := sdk.NewClient(&sdk.Implementation{Name: "idemgate", Version: "0.1.0"}, opts)
	cs, err := cl.Connect(ctx, t, nil)
	if err != nil {
		return nil, c.hide(fmt.Errorf("connect to %s: %w", c.up, err))
	}
	c.cs = cs
	return cs, nil
}

// drop forgets cs after a failure of its transport; the next call
// connects again.
func (c *Conn) drop(cs *sdk.ClientSession) {
	c.mu.Lock()
	if c.cs == cs {
		c.cs = nil
	}
	c.mu.Unlock()
	_ = cs.Close()
}

// Tools lists the upstream's tools.
func (c *Conn) Tools(ctx context.Context) ([]*sdk.Tool, error) {
	cs, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	var out []*sdk.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			if !isRPCError(err) {
				c.drop(cs)
			}
			return nil, c.hide(fmt.Errorf("list the tools of %s: %w", c.up, err))
		}
		out = append(out, t)
	}
	return out, nil
}

// Close ends the session (and stops a stdio server).
func (c *Conn) Close() error {
	c.mu.Lock()
	cs := c.cs
	c.cs, c.closed = nil, true
	c.mu.Unlock()
	if c.http != nil {
		defer c.http.CloseIdleConnections()
	}
	if cs != nil {
		return cs.Close()
	}
	return nil
}

// Effect is the effect that calls a tool of an upstream MCP server, forwarding
// the operation's key in the call's _meta (MetaKey).
//
// A broken transport (a refused connection, a killed server, a timeout) is
// retried with the same key and then transient: the worker tries the
// operation again later. A result with isError, or a JSON-RPC error (an
// unknown tool, invalid params), is a permanent outcome, recorded and
// replayed. The recorded result is the upstream's result: {"content": [...],
// "structuredContent": ...}. A connection to an address a URL upstream may
// not reach (see upstream.Server.AllowPrivate) is a *PermanentError wrapping a
// *netguard.DestinationError: nothing was sent.
type Effect struct {
	conn    *Conn
	tool    string
	timeout time.Duration
	retry   effects.RetryPolicy
}

// Config configures an mcp effect. Zero fields mean the defaults.
type Config struct {
	// Tool is the upstream's name of the tool to call. Required.
	Tool string
	// Timeout bounds one call, connecting included. Default
	// DefaultTimeout.
	Timeout time.Duration
	// Retry is the retry policy, as for a webhook.
	Retry effects.RetryPolicy
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
	errs := c.Retry.Problems(intent.EffectMCP)
	if c.Tool == "" {
		errs = append(errs, &effects.SettingError{Kind: intent.EffectMCP, Field: "tool", Problem: "is missing", Hint: "name the upstream's tool, e.g. tool: create_issue"})
	}
	if c.Timeout < 0 {
		errs = append(errs, &effects.SettingError{Kind: intent.EffectMCP, Field: "timeout", Problem: "is negative", Hint: "write e.g. 30s"})
	}
	return errors.Join(errs...)
}

// New returns an effect that calls cfg.Tool on conn, which it shares
// (closing it is the caller's), or the error of cfg.Validate.
func New(conn *Conn, cfg Config) (*Effect, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if conn == nil {
		return nil, &effects.SettingError{Kind: intent.EffectMCP, Field: "connection", Problem: "is nil", Hint: "pass a connection to the upstream (NewConn)"}
	}
	cfg = cfg.withDefaults()
	return &Effect{conn: conn, tool: cfg.Tool, timeout: cfg.Timeout, retry: cfg.Retry}, nil
}

// Upstream is the server the effect calls.
func (m *Effect) Upstream() upstream.Server { return m.conn.up }

// UpstreamTool is the upstream's name of the tool the effect calls.
func (m *Effect) UpstreamTool() string { return m.tool }

// Fire calls the upstream tool with the call's args.
func (m *Effect) Fire(ctx context.Context, call effects.Call) (effects.Outcome, error) {
	what := fmt.Sprintf("mcp %s tool %s", m.conn.up, m.tool)
	return effects.Retry(ctx, m.retry, what, "call", func(ctx context.Context) (json.RawMessage, error) {
		actx, cancel := context.WithTimeout(ctx, m.timeout)
		defer cancel()
		cs, err := m.conn.session(actx)
		if err != nil {
			return nil, refused(what, err)
		}
		meta := sdk.Meta{MetaKey: call.Key}
		holder, attempt := call.FiringHeaders()
		if holder != "" {
			meta[MetaHolder] = holder
		}
		if attempt != "" {
			meta[MetaAttempt] = attempt
		}
		res, err := cs.CallTool(actx, &sdk.CallToolParams{Name: m.tool, Arguments: json.RawMessage(call.Args), Meta: meta})
		switch {
		case err != nil && isRPCError(err):
			return nil, effects.Permanentf("", "%s: %v", what, m.conn.hide(err))
		case err != nil:
			m.conn.drop(cs)
			return nil, refused(what, m.conn.hide(fmt.Errorf("%s: %w", what, err)))
		case res.IsError:
			return nil, effects.Permanentf("", "%s answered an error: %s", what, m.conn.hideText(contentText(res.Content)))
		}
		out := struct {
			Content           []sdk.Content `json:"content"`
			StructuredContent any           `json:"structuredContent,omitempty"`
		}{res.Content, res.StructuredContent}
		if out.Content == nil {
			out.Content = []sdk.Content{}
		}
		data, err := json.Marshal(out)
		if err != nil {
			return nil, effects.Permanentf("", "%s: its result cannot be recorded: %v", what, err)
		}
		return data, nil
	})
}

// refused makes a connection the upstream's guard refused, and a
// redirect, permanent failures (a retry would meet them again); it returns
// any other error as it is.
func refused(what string, err error) error {
	var de *netguard.DestinationError
	switch {
	case errors.As(err, &de):
		return &effects.PermanentError{Code: intent.CodeEffectFailed, Err: de, Message: fmt.Sprintf(
			"%s: %v (nothing was sent; list it in the upstream's allow_private or the worker's --webhook-allow to allow it)", what, de)}
	case errors.Is(err, ErrRedirect):
		return &effects.PermanentError{Code: intent.CodeEffectFailed, Err: err, Message: fmt.Sprintf(
			"%s: %v: configure the final URL (the request may have reached the upstream; nothing was sent where it pointed)", what, ErrRedirect)}
	}
	return err
}

// MaxDuration bounds one Fire: every attempt's timeout and the waits.
func (m *Effect) MaxDuration() time.Duration {
	return time.Duration(m.retry.MaxAttempts)*(m.timeout+m.retry.MaxInterval) - m.retry.MaxInterval
}

// isRPCError reports whether err is the upstream's answer that the request
// itself is wrong (no such method or tool, invalid params): retrying it
// cannot help. Other JSON-RPC errors (an internal error, a request the
// transport rejected) may pass.
func isRPCError(err error) bool {
	var we *jsonrpc.Error
	if !errors.As(err, &we) {
		return false
	}
	switch we.Code {
	case jsonrpc.CodeInvalidRequest, jsonrpc.CodeMethodNotFound, jsonrpc.CodeInvalidParams:
		return true
	}
	return false
}

// contentText is the text of an upstream's content blocks, bounded.
func contentText(content []sdk.Content) string {
	var b strings.Builder
	for _, c := range content {
		if tc, ok := c.(*sdk.TextContent); ok {
			if b.Len() > 0 {
				b.WriteString(" ")
			}
			b.WriteString(tc.Text)
		}
	}
	s := b.String()
	if s == "" {
		return "(no text)"
	}
	if len(s) > 512 {
		s = s[:512] + "…"
	}
	return s
}
