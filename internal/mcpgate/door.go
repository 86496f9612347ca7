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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	mcpauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/internal/httpdoor"
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
//
// A request of protocol 2026-07-28 or later (its MCP-Protocol-Version
// header, or the protocol version its _meta names) is served statelessly:
// no session, every request whole in itself. An earlier client gets a
// session, as its protocol has them. Sessions are never part of a key, so
// a session may end at any time without changing what runs: a caller at
// its cap of sessions (or every caller at the total) ends its least
// recently used idle session to open a new one, rather than being refused.
type door struct {
	g         *Gate
	stateful  http.Handler // streamable transport with sessions, the token in the request's context
	stateless http.Handler // the same without sessions, for 2026-07-28 and later
	resource  *url.URL     // Config.ResourceURL, parsed; nil: from each request
	bearer    httpdoor.Bearer

	mu       sync.Mutex
	usage    map[string]*usage   // by token hash ("" without tokens)
	total    usage               // every caller's
	sessions map[string]*session // by MCP session id
	nextCall uint64
	waiters  sync.WaitGroup // session watchers
}

// usage is what one caller, or every caller, holds open.
type usage struct {
	sessions int                  // MCP sessions open or opening
	opening  int                  // of them, opening: their initialize in progress
	calls    map[uint64]time.Time // requests in progress that carry a JSON-RPC request, by when each began
}

// session is an open MCP session as the door tracks it.
type session struct {
	owner string // the token hash of the caller who opened it
	ss    *mcp.ServerSession
	used  time.Time // when a request last began or ended on it
	busy  int       // POSTs on it in progress
}

// modernVersion is the first protocol version served without sessions.
const modernVersion = "2026-07-28"

// metaProtocolVersion is the _meta field of a 2026-07-28 request naming its
// protocol version.
const metaProtocolVersion = "io.modelcontextprotocol/protocolVersion"

func newDoor(g *Gate) *door {
	d := &door{g: g, usage: map[string]*usage{}, sessions: map[string]*session{}}
	d.total.calls = map[uint64]time.Time{}
	if g.cfg.ResourceURL != "" {
		d.resource, _ = url.Parse(g.cfg.ResourceURL) // validated
	}
	d.bearer = httpdoor.Bearer{Tokens: g.cfg.Tokens, Metadata: d.metadataURL}
	server := func(*http.Request) *mcp.Server { return g.server }
	d.stateful = d.authorized(mcp.NewStreamableHTTPHandler(server, &mcp.StreamableHTTPOptions{
		Logger:         sdkLogger(g.log),
		SessionTimeout: g.cfg.SessionIdle,
	}))
	d.stateless = d.authorized(mcp.NewStreamableHTTPHandler(server, &mcp.StreamableHTTPOptions{
		Logger:    sdkLogger(g.log),
		Stateless: true,
		// The POST is the whole request: a client that goes away ends
		// the call's wait (never its operation).
		PropagateRequestCancellation: true,
	}))
	return d
}

// authorized puts the request's token where the tool handlers find it
// (CallToolRequest.Extra.TokenInfo) and binds each session to the token
// that opened it: another token's request for it is refused. ServeHTTP
// has already answered 401 to a request without a valid token.
func (d *door) authorized(h http.Handler) http.Handler {
	tokens := d.g.cfg.Tokens
	if tokens == nil {
		return h
	}
	return mcpauth.RequireBearerToken(func(_ context.Context, secret string, _ *http.Request) (*mcpauth.TokenInfo, error) {
		tok, ok := tokens.Lookup(secret)
		if !ok {
			return nil, mcpauth.ErrInvalidToken
		}
		return &mcpauth.TokenInfo{UserID: tok.Hash(), Extra: map[string]any{tokenKey: tok}}, nil
	}, &mcpauth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
}

func (d *door) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(HTTPPath, d)
	mux.HandleFunc(MetadataPath, d.metadata)
	mux.HandleFunc(MetadataPath+"/", d.metadata)
	mux.HandleFunc(HealthPath, d.health)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusNotFound, httpdoor.CodeNoRoute, "no endpoint %s: the MCP endpoint is %s", r.URL.Path, HTTPPath)
	})
	return mux
}

// ServeHTTP serves the MCP endpoint: it authenticates the caller, holds it
// to its limits and passes the request on to the streamable transport of
// its protocol version.
func (d *door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if o := r.Header.Get("Origin"); o != "" && !d.allowedOrigin(r, o) {
		problem(w, http.StatusForbidden, httpdoor.CodeForbidden, "Origin %q may not call this endpoint: only its own origin, or one given with --allow-origin, may (a page of another origin, e.g. after DNS rebinding)", o)
		return
	}
	tok, ok := d.authenticate(w, r)
	if !ok {
		return
	}
	id, name := "", "the callers (no tokens)"
	if tok != nil {
		id, name = tok.Hash(), "token "+tok.Name
	}
	modern := r.Header.Get("MCP-Protocol-Version") >= modernVersion
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" && !modern && d.foreign(id, sid) {
		d.bearer.Forbid(w, r, "the MCP session %s is another token's: open a session of your own", sid)
		return
	}
	if r.Method != http.MethodPost {
		if modern {
			d.stateless.ServeHTTP(w, r) // 405: no sessions to stream or end
			return
		}
		d.untouch(d.touch(id, r.Header.Get("Mcp-Session-Id"))) // a stream of server messages is a use, not a call in progress
		d.stateful.ServeHTTP(w, r)
		return
	}
	call, modernMeta, ok := d.readCall(w, r)
	if !ok {
		return
	}
	if call {
		n, limit, all, retry, ok := d.enterCall(id)
		if !ok {
			whose := fmt.Sprintf("%s has %d", name, limit)
			if all {
				whose = fmt.Sprintf("all callers together have %d", limit)
			}
			tooMany(w, retry, "%s calls in progress, the limit: a held call ends once its operation answers, within %s at the latest; call again then", whose, seconds(retry))
			return
		}
		defer d.leaveCall(id, n)
	}
	if modern || modernMeta {
		d.stateless.ServeHTTP(w, r)
		return
	}
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
		defer d.untouch(d.touch(id, sid))
		d.stateful.ServeHTTP(w, r)
		return
	}
	// No session id: the request opens a session.
	victim, limit, all, retry, ok := d.openSession(id)
	if !ok {
		whose := fmt.Sprintf("%s has %d", name, limit)
		if all {
			whose = fmt.Sprintf("all callers together have %d", limit)
		}
		tooMany(w, retry, "%s MCP sessions open, the limit, each with a call in progress: one ends within %s at the latest; open a session then, or use protocol %s, which needs none", whose, seconds(retry), modernVersion)
		return
	}
	if victim != nil {
		_ = victim.Close() // its client opens a new one if it comes back
	}
	d.stateful.ServeHTTP(w, r)
	d.watch(id, w.Header().Get("Mcp-Session-Id"))
}

// allowedOrigin reports whether a browser page of origin may call the
// endpoint: the endpoint's own origin (the Host the request named, and
// Config.ResourceURL's), or one of Config.AllowOrigins.
func (d *door) allowedOrigin(r *http.Request, origin string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false // "null", or not an origin
	}
	o := strings.ToLower(u.Scheme + "://" + u.Host)
	res := d.resourceURL(r)
	if o == strings.ToLower(res.Scheme+"://"+res.Host) || o == strings.ToLower(u.Scheme+"://"+r.Host) && (u.Scheme == "http" || u.Scheme == "https") {
		return true
	}
	return slices.Contains(d.g.cfg.AllowOrigins, o)
}

// authenticate returns the request's token, or answers 401 with the
// challenge of the MCP authorization spec (RFC 6750, and RFC 9728's
// resource_metadata) as the HTTP front door does (httpdoor.Bearer). A gate
// without tokens admits every request (tok nil).
func (d *door) authenticate(w http.ResponseWriter, r *http.Request) (tok *auth.Token, ok bool) {
	if d.g.cfg.Tokens == nil {
		return nil, true
	}
	return d.bearer.Authenticate(w, r)
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
// calls wait on. modern reports a message whose _meta names a protocol
// version (2026-07-28 and later do). A malformed body is passed on for the
// transport to answer.
func (d *door) readCall(w http.ResponseWriter, r *http.Request) (call, modern, ok bool) {
	body, ok := httpdoor.ReadBody(w, r, maxBody, bodyTimeout)
	if !ok {
		return false, false, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	msgs := []json.RawMessage{body}
	if b := bytes.TrimSpace(body); len(b) > 0 && b[0] == '[' {
		if json.Unmarshal(b, &msgs) != nil {
			return false, false, true
		}
	}
	for _, m := range msgs {
		msg, err := jsonrpc.DecodeMessage(m)
		if err != nil {
			continue
		}
		req, isReq := msg.(*jsonrpc.Request)
		if !isReq {
			continue
		}
		call = call || req.IsCall()
		var p struct {
			Meta map[string]any `json:"_meta"`
		}
		if json.Unmarshal(req.Params, &p) == nil && p.Meta[metaProtocolVersion] != nil {
			modern = true
		}
	}
	return call, modern, true
}

// callBound is the longest a held call lasts: a tools/call waits for its
// operation up to Config.Wait, idemgate_status up to MaxStatusWait.
func (d *door) callBound() time.Duration { return max(d.g.cfg.Wait, MaxStatusWait) }

// enterCall takes a call slot for the caller id unless its calls are at
// Config.MaxCallsPerToken or every caller's at Config.MaxCalls; then it
// returns the limit reached, whether it is the total's, and when the
// soonest of those held calls ends at the latest.
func (d *door) enterCall(id string) (n uint64, limit int, all bool, retry time.Duration, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	u := d.user(id)
	switch {
	case len(u.calls) >= d.g.cfg.MaxCallsPerToken:
		return 0, d.g.cfg.MaxCallsPerToken, false, d.soonest(u.calls), false
	case len(d.total.calls) >= d.g.cfg.MaxCalls:
		d.forget(id)
		return 0, d.g.cfg.MaxCalls, true, d.soonest(d.total.calls), false
	}
	d.nextCall++
	now := time.Now()
	u.calls[d.nextCall] = now
	d.total.calls[d.nextCall] = now
	return d.nextCall, 0, false, 0, true
}

// leaveCall gives back the call slot n of the caller id.
func (d *door) leaveCall(id string, n uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.usage[id].calls, n)
	delete(d.total.calls, n)
	d.forget(id)
}

// user is the usage of the caller id, made when missing; d.mu is held.
func (d *door) user(id string) *usage {
	u := d.usage[id]
	if u == nil {
		u = &usage{calls: map[uint64]time.Time{}}
		d.usage[id] = u
	}
	return u
}

// forget drops the usage of the caller id when it holds nothing; d.mu is
// held.
func (d *door) forget(id string) {
	if u := d.usage[id]; u != nil && u.sessions == 0 && u.opening == 0 && len(u.calls) == 0 {
		delete(d.usage, id)
	}
}

// soonest is how long until the first of calls reaches callBound: when one
// of them has ended at the latest (at least a second); d.mu is held.
func (d *door) soonest(calls map[uint64]time.Time) time.Duration {
	if len(calls) == 0 {
		return time.Second
	}
	first := time.Now()
	for _, at := range calls {
		if at.Before(first) {
			first = at
		}
	}
	return max(time.Until(first.Add(d.callBound())), time.Second)
}

// openSession takes a session slot for the caller id. A caller at
// Config.MaxSessionsPerToken gives up its least recently used idle session
// (no request in progress) for it; at Config.MaxSessions the caller with
// the most sessions gives up its least recently used idle one: victim,
// which the caller closes. Sessions are never part of a key, so nothing but
// a new initialize depends on one. While sessions of the caller are still
// opening, the cap may be passed until they are open (see watch), so that
// concurrent initializes are not refused; otherwise, when every candidate
// has a call in progress, the caller is refused, with when one of those
// calls ends at the latest.
func (d *door) openSession(id string) (victim *mcp.ServerSession, limit int, all bool, retry time.Duration, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	u := d.user(id)
	switch {
	case u.sessions >= d.g.cfg.MaxSessionsPerToken:
		limit = d.g.cfg.MaxSessionsPerToken
	case d.total.sessions >= d.g.cfg.MaxSessions:
		limit, all = d.g.cfg.MaxSessions, true
	}
	if limit > 0 {
		lru := d.evictable(id, all)
		switch {
		case lru != "":
			victim = d.sessions[lru].ss
			d.drop(lru)
			u = d.user(id) // drop may have forgotten it
		case u.opening == 0 && (!all || d.total.opening == 0):
			calls := u.calls
			if all {
				calls = d.total.calls
			}
			d.forget(id)
			return nil, limit, all, d.soonest(calls), false
		}
	}
	u.sessions++
	u.opening++
	d.total.sessions++
	d.total.opening++
	return victim, 0, false, 0, true
}

// evictable is the session to give up for the caller id: its own least
// recently used idle session, or with all the least recently used idle
// session of the caller holding the most sessions; "" when there is none.
// d.mu is held.
func (d *door) evictable(id string, all bool) string {
	most := 0
	if all {
		for _, s := range d.sessions {
			if s.busy == 0 {
				most = max(most, d.usage[s.owner].sessions)
			}
		}
	}
	lru := ""
	for sid, s := range d.sessions {
		if s.busy > 0 || (all && d.usage[s.owner].sessions != most) || (!all && s.owner != id) {
			continue
		}
		if lru == "" || s.used.Before(d.sessions[lru].used) {
			lru = sid
		}
	}
	return lru
}

// drop stops tracking the session sid and gives back its slot; d.mu is
// held. A session already dropped (evicted, then ended) is left alone.
func (d *door) drop(sid string) {
	s := d.sessions[sid]
	if s == nil {
		return
	}
	delete(d.sessions, sid)
	d.leaveSession(s.owner)
}

// leaveSession gives back a session slot of the caller id; d.mu is held.
func (d *door) leaveSession(id string) {
	d.usage[id].sessions--
	d.total.sessions--
	d.forget(id)
}

// touch marks the session sid of the caller id in use by a request, and
// returns it for untouch (nil when the door does not track it as id's).
func (d *door) touch(id, sid string) *session {
	if sid == "" {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.sessions[sid]
	if s == nil || s.owner != id {
		return nil
	}
	s.busy++
	s.used = time.Now()
	return s
}

// foreign reports whether the session sid is open and another caller's
// than id.
func (d *door) foreign(id, sid string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.sessions[sid]
	return s != nil && s.owner != id
}

// untouch ends what touch began.
func (d *door) untouch(s *session) {
	if s == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s.busy--
	s.used = time.Now()
}

// watch tracks the session a request opened (sid, from the answer's
// Mcp-Session-Id) until it ends, then gives back its slot: at once when it
// opened none or the session already ended (a failed initialize). A caller
// past its cap once its session is open (concurrent initializes) gives up
// its least recently used idle session.
func (d *door) watch(id, sid string) {
	var ss *mcp.ServerSession
	if sid != "" {
		for s := range d.g.server.Sessions() {
			if s.ID() == sid {
				ss = s
				break
			}
		}
	}
	d.mu.Lock()
	d.usage[id].opening--
	d.total.opening--
	if ss == nil {
		d.leaveSession(id)
		d.mu.Unlock()
		return
	}
	d.sessions[sid] = &session{owner: id, ss: ss, used: time.Now()}
	var victim *mcp.ServerSession
	if over := d.usage[id].sessions > d.g.cfg.MaxSessionsPerToken; over || d.total.sessions > d.g.cfg.MaxSessions {
		if lru := d.evictable(id, !over); lru != "" && lru != sid {
			victim = d.sessions[lru].ss
			d.drop(lru)
		}
	}
	d.mu.Unlock()
	if victim != nil {
		_ = victim.Close()
	}
	d.waiters.Go(func() {
		_ = ss.Wait() // until the client deletes it, it idles out, it is evicted or the gate stops
		d.mu.Lock()
		defer d.mu.Unlock()
		d.drop(sid)
	})
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
		problem(w, http.StatusNotFound, httpdoor.CodeNoRoute, "this server takes no tokens: %s needs none", res)
		return
	}
	switch r.URL.Path {
	case MetadataPath + res.Path:
	case MetadataPath:
		res.Path = ""
	default:
		problem(w, http.StatusNotFound, httpdoor.CodeNoRoute, "no protected resource at %s: the MCP endpoint's metadata is at %s", r.URL.Path, MetadataPath+res.Path)
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
		problem(w, http.StatusServiceUnavailable, httpdoor.CodeUnavailable, "NATS connection %s", d.g.nc.Status())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
}

// tooMany answers 429 as the HTTP front door does: a problem with code
// rate_limited, and Retry-After: retry in whole seconds, rounded up.
func tooMany(w http.ResponseWriter, retry time.Duration, format string, args ...any) {
	w.Header().Set("Retry-After", strconv.Itoa(int((retry+time.Second-1)/time.Second)))
	problem(w, http.StatusTooManyRequests, httpdoor.CodeRateLimited, format, args...)
}

// problem answers with an RFC 9457 problem of status and code, in the HTTP
// front door's form (docs/http.md).
func problem(w http.ResponseWriter, status int, code, format string, args ...any) {
	httpdoor.Problem(w, status, code, format, args...)
}

// seconds is d in whole seconds, rounded up, as a text says it.
func seconds(d time.Duration) string {
	return fmt.Sprintf("%ds", int((d+time.Second-1)/time.Second))
}

// caller is the token a tools/call came with over HTTP, nil without one.
func caller(req *mcp.CallToolRequest) *auth.Token {
	if req.Extra == nil || req.Extra.TokenInfo == nil {
		return nil
	}
	tok, _ := req.Extra.TokenInfo.Extra[tokenKey].(*auth.Token)
	return tok
}
