package mcpgate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	mcpauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/pkg/intent"
)

// Paths of the HTTP transport besides HTTPPath.
const (
	// MetadataPath is where the protected resource metadata (RFC 9728) is
	// served; MetadataPath+HTTPPath describes the MCP endpoint itself.
	MetadataPath = "/.well-known/oauth-protected-resource"
	// HealthPath answers 200 while the NATS connection is up, 503 otherwise.
	HealthPath = "/healthz"
)

// tokenKey is the key of the caller's token in the SDK's auth.TokenInfo.Extra.
const tokenKey = "io.idemgate/token"

// ErrNoDoor is matched by errors.Is when HTTP would be served to other hosts
// without tokens.
var ErrNoDoor = errors.New("mcpgate: no tokens for an address that is not loopback")

// CheckListen refuses to serve HTTP on addr to other hosts than this one
// without tokens: every caller could then fire every tool and read every
// operation.
func CheckListen(addr string, tokens *auth.Tokens) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("mcpgate: listen address %q: %w (use host:port, e.g. 127.0.0.1:8081)", addr, err)
	}
	if tokens == nil && !loopback(host) {
		return fmt.Errorf("%w: %q is reachable from other hosts, and without tokens anyone who reaches it fires every tool: "+
			"give --tokens FILE (gateway token --role agent --namespace NS --tokens FILE makes one), or listen on 127.0.0.1", ErrNoDoor, addr)
	}
	return nil
}

// loopback reports whether host names only this machine.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// door is the HTTP surface of the gate: the MCP endpoint behind bearer
// tokens (when the gate has tokens) and the session and call limits, the
// protected resource metadata, and the health check.
type door struct {
	g        *Gate
	mcp      http.Handler // the streamable transport, with the token in the request's context
	resource *url.URL     // Config.ResourceURL, parsed; nil: from each request

	mu      sync.Mutex
	usage   map[string]*usage // by token hash ("" without tokens)
	total   usage
	waiters sync.WaitGroup // session watchers
}

// usage counts what one caller, or every caller, holds open.
type usage struct {
	sessions int // MCP sessions
	calls    int // requests in progress that carry a JSON-RPC request
}

func newDoor(g *Gate) *door {
	d := &door{g: g, usage: map[string]*usage{}}
	if g.cfg.ResourceURL != "" {
		d.resource, _ = url.Parse(g.cfg.ResourceURL) // validated
	}
	streamable := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server }, &mcp.StreamableHTTPOptions{
		Logger:         sdkLogger(g.cfg.Logger),
		SessionTimeout: g.cfg.SessionIdle,
	})
	d.mcp = streamable
	if g.cfg.Tokens != nil {
		// The SDK's middleware puts the token where the tool handlers find
		// it (CallToolRequest.Extra.TokenInfo), and binds each session to
		// the token that opened it: another token's request for it is
		// refused. door.ServeHTTP has already answered 401 to a request
		// without a valid token.
		d.mcp = mcpauth.RequireBearerToken(func(_ context.Context, secret string, _ *http.Request) (*mcpauth.TokenInfo, error) {
			tok, ok := g.cfg.Tokens.Lookup(secret)
			if !ok {
				return nil, mcpauth.ErrInvalidToken
			}
			return &mcpauth.TokenInfo{UserID: tok.Hash(), Extra: map[string]any{tokenKey: tok}}, nil
		}, &mcpauth.RequireBearerTokenOptions{AllowMissingExpiration: true})(streamable)
	}
	return d
}

func (d *door) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(HTTPPath, d)
	mux.HandleFunc(MetadataPath, d.metadata)
	mux.HandleFunc(MetadataPath+"/", d.metadata)
	mux.HandleFunc(HealthPath, d.health)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusNotFound, "no_route", "no endpoint %s: the MCP endpoint is %s", r.URL.Path, HTTPPath)
	})
	return mux
}

// ServeHTTP serves the MCP endpoint: it authenticates the caller, holds it
// to its limits and passes the request on to the streamable transport.
func (d *door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tok, ok := d.authenticate(w, r)
	if !ok {
		return
	}
	id, name := "", "the callers (no tokens)"
	if tok != nil {
		id, name = tok.Hash(), "token "+tok.Name
	}
	// over says whose limit of n a request reached.
	over := func(n int, all bool) string {
		if all {
			return fmt.Sprintf("all callers together have %d", n)
		}
		return fmt.Sprintf("%s has %d", name, n)
	}
	if r.Method != http.MethodPost {
		d.mcp.ServeHTTP(w, r)
		return
	}
	call, ok := d.readCall(w, r)
	if !ok {
		return
	}
	if call {
		if n, all, ok := d.enter(id, calls, d.g.cfg.MaxCalls, d.g.cfg.MaxCallsPerToken); !ok {
			tooMany(w, "%s calls in progress, the limit: call again once one has ended", over(n, all))
			return
		}
		defer d.leave(id, calls)
	}
	if r.Header.Get("Mcp-Session-Id") != "" {
		d.mcp.ServeHTTP(w, r)
		return
	}
	// No session id: the request opens a session.
	if n, all, ok := d.enter(id, sessions, d.g.cfg.MaxSessions, d.g.cfg.MaxSessionsPerToken); !ok {
		tooMany(w, "%s MCP sessions open, the limit: close one (DELETE %s with its Mcp-Session-Id), or open one once another has been idle for %s", over(n, all), HTTPPath, d.g.cfg.SessionIdle)
		return
	}
	d.mcp.ServeHTTP(w, r)
	d.watch(id, w.Header().Get("Mcp-Session-Id"))
}

// authenticate returns the request's token, or answers 401 with the
// challenge of the MCP authorization spec (RFC 6750, and RFC 9728's
// resource_metadata). A gate without tokens admits every request (tok nil).
func (d *door) authenticate(w http.ResponseWriter, r *http.Request) (tok *auth.Token, ok bool) {
	if d.g.cfg.Tokens == nil {
		return nil, true
	}
	fields := strings.Fields(r.Header.Get("Authorization"))
	challenge := fmt.Sprintf(`Bearer realm="idemgate", resource_metadata=%q`, d.metadataURL(r))
	if len(fields) != 2 || !strings.EqualFold(fields[0], "Bearer") {
		w.Header().Set("WWW-Authenticate", challenge)
		problem(w, http.StatusUnauthorized, "unauthorized", "send Authorization: Bearer <token> (a token of the tokens file; gateway token makes one)")
		return nil, false
	}
	tok, ok = d.g.cfg.Tokens.Lookup(fields[1])
	if !ok {
		w.Header().Set("WWW-Authenticate", challenge+`, error="invalid_token", error_description="the token is not in the tokens file"`)
		problem(w, http.StatusUnauthorized, "unauthorized", "the bearer token is not in the tokens file")
		return nil, false
	}
	return tok, true
}

// maxBody bounds a POST's body, as the SDK's transport does by default.
const maxBody = mcp.DefaultMaxRequestBodyBytes

// bodyTimeout bounds how long a client may take to send a POST's body.
const bodyTimeout = 10 * time.Second

// readCall reads a POST's body (bounded in size and time) and reports
// whether it carries a JSON-RPC request, which holds the POST open until it
// is answered: a tools/call waits for its operation. Notifications and the
// client's responses (an elicitation's answer) end at once and are not
// counted, so a caller at its limit can still answer the questions its held
// calls wait on. A malformed body is passed on for the transport to answer.
func (d *door) readCall(w http.ResponseWriter, r *http.Request) (call, ok bool) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyTimeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		problem(w, http.StatusRequestEntityTooLarge, intent.CodeTooLarge, "the body is over the limit of %d bytes", maxBody)
		return false, false
	case errors.Is(err, os.ErrDeadlineExceeded):
		w.Header().Set("Connection", "close")
		problem(w, http.StatusRequestTimeout, "request_timeout", "the body did not arrive within %s", bodyTimeout)
		return false, false
	case err != nil:
		problem(w, http.StatusBadRequest, "invalid_request", "read the body: %v", err)
		return false, false
	}
	_ = rc.SetReadDeadline(time.Time{})
	r.Body = io.NopCloser(bytes.NewReader(body))
	msgs := []json.RawMessage{body}
	if b := bytes.TrimSpace(body); len(b) > 0 && b[0] == '[' {
		if json.Unmarshal(b, &msgs) != nil {
			return false, true
		}
	}
	for _, m := range msgs {
		if msg, err := jsonrpc.DecodeMessage(m); err == nil {
			if req, isReq := msg.(*jsonrpc.Request); isReq && req.IsCall() {
				return true, true
			}
		}
	}
	return false, true
}

// The counters of a usage.
func sessions(u *usage) *int { return &u.sessions }
func calls(u *usage) *int    { return &u.calls }

// enter takes one of a caller's counters (which picks it) unless the
// caller's count is at perToken or the total at total; then it returns the
// limit reached and whether it is the total's.
func (d *door) enter(id string, which func(*usage) *int, total, perToken int) (limit int, all, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	u := d.usage[id]
	if u == nil {
		u = &usage{}
		d.usage[id] = u
	}
	switch {
	case *which(u) >= perToken:
		return perToken, false, false
	case *which(&d.total) >= total:
		if *u == (usage{}) {
			delete(d.usage, id)
		}
		return total, true, false
	}
	*which(u)++
	*which(&d.total)++
	return 0, false, true
}

// leave gives back what enter took.
func (d *door) leave(id string, which func(*usage) *int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	u := d.usage[id]
	*which(u)--
	*which(&d.total)--
	if *u == (usage{}) {
		delete(d.usage, id)
	}
}

// watch gives back the session slot a request took once the session it
// opened (sid, from the answer's Mcp-Session-Id) ends: at once when it
// opened none or the session already ended (a failed initialize).
func (d *door) watch(id, sid string) {
	if sid != "" {
		for ss := range d.g.server.Sessions() {
			if ss.ID() == sid {
				d.waiters.Go(func() {
					_ = ss.Wait() // until the client deletes it, it idles out or the gate stops
					d.leave(id, sessions)
				})
				return
			}
		}
	}
	d.leave(id, sessions)
}

// close ends every MCP session and waits for their slots to be given back.
func (d *door) close() {
	for ss := range d.g.server.Sessions() {
		_ = ss.Close()
	}
	d.waiters.Wait()
}

// metadataURL is the URL of the protected resource metadata of the MCP
// endpoint the request reached.
func (d *door) metadataURL(r *http.Request) string {
	res := d.resourceURL(r)
	return (&url.URL{Scheme: res.Scheme, Host: res.Host, Path: MetadataPath + res.Path}).String()
}

// resourceURL is the MCP endpoint's URL as clients reach it: Config.ResourceURL,
// else this server at the Host the request named.
func (d *door) resourceURL(r *http.Request) *url.URL {
	if d.resource != nil {
		u := *d.resource
		return &u
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return &url.URL{Scheme: scheme, Host: r.Host, Path: HTTPPath}
}

// metadata serves the protected resource metadata (RFC 9728) of the MCP
// endpoint at MetadataPath+<its path>, and of the server's origin at
// MetadataPath, as the MCP authorization spec has clients look for them.
// It names no authorization server: tokens are issued out of band (gateway
// token) and sent as a bearer header. Without tokens there is nothing to
// describe.
func (d *door) metadata(w http.ResponseWriter, r *http.Request) {
	res := d.resourceURL(r)
	if d.g.cfg.Tokens == nil {
		problem(w, http.StatusNotFound, "no_route", "this server takes no tokens: %s needs none", res)
		return
	}
	switch r.URL.Path {
	case MetadataPath + res.Path:
	case MetadataPath:
		res.Path = ""
	default:
		problem(w, http.StatusNotFound, "no_route", "no protected resource at %s: the MCP endpoint's metadata is at %s", r.URL.Path, MetadataPath+res.Path)
		return
	}
	mcpauth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource:               res.String(),
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "idemgate MCP server",
	}).ServeHTTP(w, r)
}

// health answers 200 while the NATS connection is up, 503 otherwise.
func (d *door) health(w http.ResponseWriter, _ *http.Request) {
	if !d.g.nc.IsConnected() {
		problem(w, http.StatusServiceUnavailable, "unavailable", "NATS connection %s", d.g.nc.Status())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
}

// tooMany answers 429 as the HTTP front door does: Retry-After and a
// problem with code rate_limited.
func tooMany(w http.ResponseWriter, format string, args ...any) {
	w.Header().Set("Retry-After", "1")
	problem(w, http.StatusTooManyRequests, intent.CodeRateLimited, format, args...)
}

// problem answers with an RFC 9457 problem of status and code, in the HTTP
// front door's form (docs/http.md).
func problem(w http.ResponseWriter, status int, code, format string, args ...any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
		Code   string `json:"code"`
	}{"urn:idemgate:problem:" + code, http.StatusText(status), status, fmt.Sprintf(format, args...), code})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// caller is the token a tools/call came with over HTTP, nil without one.
func caller(req *mcp.CallToolRequest) *auth.Token {
	if req.Extra == nil || req.Extra.TokenInfo == nil {
		return nil
	}
	tok, _ := req.Extra.TokenInfo.Extra[tokenKey].(*auth.Token)
	return tok
}
