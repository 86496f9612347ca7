package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/stretchr/testify/require"
)

// The MCP server over HTTP as a hostile caller meets it: bearer tokens from
// the HTTP front door's tokens file (401 and the protected resource
// metadata without one), each token's namespace scoping its sessions and
// the operations it may read, and limits on sessions and held calls.

// newToken adds a token of role and namespace to the tokens file and
// returns its secret (gateway token, as an operator makes one).
func newToken(t *testing.T, file, role, namespace, name string) string {
	t.Helper()
	out, err := exec.Command(bin("gateway"), "token", "--role", role, "--namespace", namespace, "--name", name, "--tokens", file).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

// startMCPHTTP runs bin/mcp over HTTP on loopback against url with extra
// flags, and returns its endpoint.
func startMCPHTTP(t *testing.T, url string, extra ...string) string {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := startMCP(t, "http", append([]string{"--nats-url", url, "--http", addr}, extra...), nil)
	p.waitLog(t, "mcp serving", 30*time.Second)
	return "http://" + addr + "/mcp"
}

// bearer sends Authorization: Bearer <token> on every request.
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// mcpSession connects the Go SDK's client to endpoint with token (none when
// "").
func mcpSession(ctx context.Context, endpoint, token string) (*mcp.ClientSession, error) {
	hc := &http.Client{}
	if token != "" {
		hc.Transport = bearer(token)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	return c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, nil)
}

func mustSession(t *testing.T, endpoint, token string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcpSession(ctx, endpoint, token)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// legacySession connects the Go SDK's client to endpoint with token as a
// client of protocol 2025-11-25: initialize, and an MCP session.
func legacySession(t *testing.T, endpoint, token string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: bearer(token)}, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	require.NoError(t, err)
	require.NotEmpty(t, cs.ID(), "a 2025-11-25 client has a session")
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// post sends one JSON-RPC message to endpoint as a 2025-11-25 client does,
// in the MCP session sid (none when ""), with extra headers; it returns
// the answer's status, headers and body (an SSE stream's data, or JSON).
func post(hc *http.Client, endpoint, token, sid, msg string, extra ...string) (int, http.Header, string, error) {
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(msg))
	if err != nil {
		return 0, nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data), err
}

// alive reports whether the MCP session sid still answers a ping.
func alive(t *testing.T, hc *http.Client, endpoint, token, sid string) bool {
	t.Helper()
	code, _, body, err := post(hc, endpoint, token, sid, `{"jsonrpc":"2.0","id":7,"method":"ping"}`)
	require.NoError(t, err)
	require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, code, body)
	return code == http.StatusOK
}

// callIn calls tool with args, naming session in _meta.
func callIn(t *testing.T, cs *mcp.ClientSession, session, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: mcp.Meta{"io.idemgate/session": session}})
	require.NoError(t, err)
	return res
}

// rawInit POSTs an initialize request with token (none when ""); it returns
// the answer's status, headers and body.
func rawInit(t *testing.T, hc *http.Client, endpoint, token string) (int, http.Header, string) {
	t.Helper()
	code, h, body, err := tryInit(hc, endpoint, token)
	require.NoError(t, err)
	return code, h, body
}

// tryInit is rawInit for goroutines other than the test's.
func tryInit(hc *http.Client, endpoint, token string) (int, http.Header, string, error) {
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		return 0, nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data), err
}

// deleteSession ends an MCP session as its client would.
func deleteSession(t *testing.T, hc *http.Client, endpoint, token, id string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodDelete, endpoint, nil)
	require.NoError(t, err)
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// problemOf decodes a problem+json body.
func problemOf(t *testing.T, h http.Header, body string) map[string]any {
	t.Helper()
	require.Equal(t, "application/problem+json", h.Get("Content-Type"), body)
	var p map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	return p
}

// Without a valid token the MCP endpoint answers 401 with the challenge of
// the MCP authorization spec, and the protected resource metadata it names
// is there; the Go SDK's client with the token is served, and a session
// opened with one token cannot be used with another.
func TestMCPHTTPNeedsAToken(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, mcpDoorTools(hook.URL)))
	file := filepath.Join(t.TempDir(), "tokens")
	agent := newToken(t, file, "agent", "team-a", "a")
	other := newToken(t, file, "agent", "team-b", "b")
	endpoint := startMCPHTTP(t, url, "--tokens", file)
	hc := &http.Client{}

	code, h, body := rawInit(t, hc, endpoint, "")
	require.Equal(t, http.StatusUnauthorized, code, body)
	challenge, err := oauthex.ParseWWWAuthenticate(h.Values("WWW-Authenticate"))
	require.NoError(t, err)
	require.Len(t, challenge, 1)
	require.Equal(t, "bearer", strings.ToLower(challenge[0].Scheme))
	metadataURL := challenge[0].Params["resource_metadata"]
	require.Equal(t, strings.Replace(endpoint, "/mcp", "/.well-known/oauth-protected-resource/mcp", 1), metadataURL)
	require.Empty(t, challenge[0].Params["error"], "no token is not an invalid one (RFC 6750)")
	require.Equal(t, "unauthorized", problemOf(t, h, body)["code"])

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prm, err := oauthex.GetProtectedResourceMetadata(ctx, metadataURL, endpoint, hc)
	require.NoError(t, err, "the metadata names the endpoint as its resource")
	require.Equal(t, []string{"header"}, prm.BearerMethodsSupported)
	origin := strings.TrimSuffix(endpoint, "/mcp")
	_, err = oauthex.GetProtectedResourceMetadata(ctx, origin+"/.well-known/oauth-protected-resource", origin, hc)
	require.NoError(t, err, "and at the root, for the origin")

	code, h, _ = rawInit(t, hc, endpoint, agent+"x")
	require.Equal(t, http.StatusUnauthorized, code)
	challenge, err = oauthex.ParseWWWAuthenticate(h.Values("WWW-Authenticate"))
	require.NoError(t, err)
	require.Equal(t, "invalid_token", challenge[0].Params["error"])
	require.Equal(t, metadataURL, challenge[0].Params["resource_metadata"])

	_, err = mcpSession(ctx, endpoint, "")
	require.Error(t, err, "the SDK's client without a token is refused")
	cs := mustSession(t, endpoint, agent)
	res := callIn(t, cs, "run-1", "create_ticket", map[string]any{"title": "printer on fire"})
	require.False(t, res.IsError, mcpText(res))
	require.Equal(t, 1, hook.count())

	// Another token cannot use a 2025-11-25 client's session.
	cs = legacySession(t, endpoint, agent)
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	req.Header.Set("Authorization", "Bearer "+other)
	resp, err := hc.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "a session belongs to the token that opened it")

	// Health and metadata need no token; stdio takes none.
	resp, err = hc.Get(origin + "/healthz")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// A token's namespace scopes every session it names: a caller of team-a
// naming team-b's session (in _meta, in the Idem-Session header, or as
// "team-b/...") runs its own operation, is never replayed team-b's result,
// and reads team-b's operation through idemgate_status exactly as a missing
// one.
func TestMCPNamespacesKeepTenantsApart(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	var mu sync.Mutex
	var sessions []string
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sessions = append(sessions, r.Header.Get("Idem-Session"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"ticket":%d}`, n)
	})
	startWorker(t, "w1", url, writeTools(t, mcpDoorTools(hook.URL)))
	file := filepath.Join(t.TempDir(), "tokens")
	a := newToken(t, file, "agent", "team-a", "a")
	b := newToken(t, file, "agent", "team-b", "b")
	endpoint := startMCPHTTP(t, url, "--tokens", file)
	args := map[string]any{"title": "refund order 42"}

	victim := callIn(t, mustSession(t, endpoint, b), "run-1", "create_ticket", args)
	require.False(t, victim.IsError, mcpText(victim))
	victimKey := opOf(t, victim.Meta).Key

	attacker := mustSession(t, endpoint, a)
	keys := map[string]string{}
	for _, session := range []string{"run-1", "team-b/run-1", "../team-b/run-1"} {
		res := callIn(t, attacker, session, "create_ticket", args)
		require.False(t, res.IsError, mcpText(res))
		o := opOf(t, res.Meta)
		require.False(t, o.Replayed, "session %q: team-a is not replayed team-b's result", session)
		require.NotEqual(t, victimKey, o.Key)
		keys[session] = o.Key
	}
	// The Idem-Session header is scoped the same way: team-a's own
	// operation in "team-a/team-b/run-1" again.
	hc := &http.Client{Transport: headerTransport{"Authorization": "Bearer " + a, "Idem-Session": "team-b/run-1"}}
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, nil)
	require.NoError(t, err)
	defer hs.Close()
	res, err := hs.CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: args})
	require.NoError(t, err)
	require.Equal(t, keys["team-b/run-1"], opOf(t, res.Meta).Key)

	mu.Lock()
	require.Equal(t, []string{"team-b/run-1", "team-a/run-1", "team-a/team-b/run-1", "team-a/../team-b/run-1"}, sessions,
		"every call ran in its caller's namespace")
	mu.Unlock()

	// team-b's operation reads as a missing one, at once, wait or not.
	missingKey := "create_ticket." + strings.Repeat("0", 64)
	status := func(cs *mcp.ClientSession, key string, wait int) string {
		res := mcpCall(t, cs, "idemgate_status", map[string]any{"operation": key, "wait_seconds": wait})
		require.True(t, res.IsError)
		return strings.ReplaceAll(mcpText(res), key, "KEY")
	}
	require.Equal(t, status(attacker, missingKey, 0), status(attacker, victimKey, 0))
	require.Equal(t, status(attacker, missingKey, 30), status(attacker, victimKey, 30))
	require.Contains(t, status(attacker, victimKey, 0), "No operation")

	// team-b reads it.
	own := mcpCall(t, mustSession(t, endpoint, b), "idemgate_status", map[string]any{"operation": victimKey})
	require.False(t, own.IsError, mcpText(own))
}

// headerTransport sets fixed headers on every request.
type headerTransport map[string]string

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// HTTP on an address other hosts reach, without tokens, is refused at
// start, saying how to fix it.
func TestMCPHTTPRefusesOtherHostsWithoutTokens(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	startWorker(t, "w1", url, writeTools(t, mcpDoorTools("http://127.0.0.1:9")))
	for _, addr := range []string{fmt.Sprintf("0.0.0.0:%d", freePort(t)), fmt.Sprintf(":%d", freePort(t))} {
		p := startMCP(t, "open", []string{"--nats-url", url, "--http", addr}, nil)
		// It exits, or it serves (and fails the test).
		tick := time.NewTicker(20 * time.Millisecond)
	wait:
		for {
			select {
			case <-p.done:
				break wait
			case <-tick.C:
				require.NotContains(t, p.log.String(), "mcp serving", "bin/mcp --http %s without tokens serves", addr)
			}
		}
		tick.Stop()
		require.Error(t, p.err, "bin/mcp --http %s exits with an error", addr)
		require.Contains(t, p.log.String(), "--tokens", addr)
		require.NotContains(t, p.log.String(), "mcp serving", addr)
	}
}

// Sessions are capped per token and in all, and never lock a caller out:
// a token at its cap ends its least recently used idle session to open a
// new one, a caller at the total cap the least recently used idle session
// of any; thousands of sessions opened past the cap leave the count and
// the memory where they were.
func TestMCPSessionsAreBounded(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	startWorker(t, "w1", url, writeTools(t, mcpDoorTools("http://127.0.0.1:9")))
	file := filepath.Join(t.TempDir(), "tokens")
	a := newToken(t, file, "agent", "team-a", "a")
	b := newToken(t, file, "agent", "team-b", "b")
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := startMCP(t, "http", []string{"--nats-url", url, "--http", addr, "--tokens", file,
		"--max-sessions-per-token", "3", "--max-sessions", "5"}, nil)
	p.waitLog(t, "mcp serving", 30*time.Second)
	endpoint := "http://" + addr + "/mcp"
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

	open := func(token string) string {
		t.Helper()
		code, h, body := rawInit(t, hc, endpoint, token)
		require.Equal(t, http.StatusOK, code, body)
		require.NotEmpty(t, h.Get("Mcp-Session-Id"))
		return h.Get("Mcp-Session-Id")
	}
	var as []string
	for range 3 {
		as = append(as, open(a))
	}
	require.True(t, alive(t, hc, endpoint, a, as[0]), "a's first session, used last")
	as = append(as, open(a)) // past a's cap: its least recently used idle session ends
	require.False(t, alive(t, hc, endpoint, a, as[1]), "a's least recently used session ended")
	for _, sid := range []string{as[0], as[2], as[3]} {
		require.True(t, alive(t, hc, endpoint, a, sid), "a's other sessions go on")
	}
	bs := []string{open(b), open(b)} // b's own: 5 in all
	require.True(t, alive(t, hc, endpoint, a, as[2]))
	require.True(t, alive(t, hc, endpoint, a, as[3]))
	require.True(t, alive(t, hc, endpoint, b, bs[0]))
	require.True(t, alive(t, hc, endpoint, b, bs[1]))
	bs = append(bs, open(b)) // past the cap of all: the least recently used of the biggest holder's ends
	require.False(t, alive(t, hc, endpoint, a, as[0]), "a's least recently used session ended")
	require.True(t, alive(t, hc, endpoint, a, as[2]))

	before := rss(t, p)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				code, h, body, err := tryInit(hc, endpoint, a)
				if err != nil || code != http.StatusOK || h.Get("Mcp-Session-Id") == "" {
					t.Errorf("a session past the cap answered %d %s (%v)", code, body, err)
					return
				}
			}
		})
	}
	wg.Wait()
	after := rss(t, p)
	t.Logf("RSS %d KiB before 4000 sessions past the cap, %d KiB after", before, after)
	require.Less(t, after-before, int64(48<<10), "4000 sessions past the cap keep nothing (KiB)")
	left := 0
	for _, sid := range bs {
		if alive(t, hc, endpoint, b, sid) {
			left++
		}
	}
	require.Equal(t, 2, left, "a's sessions past the cap of all take b's only while b holds more")
}

// A 2025-11-25 client that opens a session per call and never closes it
// (LangChain's MCP adapters with a per-call Idem-Session header) makes
// 2 000 calls on one token, none refused, each answered; the sessions it
// leaves behind stay within the cap.
func TestMCPSessionChurnIsNeverRefused(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, mcpDoorTools(hook.URL)))
	file := filepath.Join(t.TempDir(), "tokens")
	a := newToken(t, file, "agent", "team-a", "a")
	endpoint := startMCPHTTP(t, url, "--tokens", file)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}

	const calls, workers = 2000, 4
	first := make([]string, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < calls; i += workers {
				code, h, body, err := tryInit(hc, endpoint, a)
				if err != nil || code != http.StatusOK {
					t.Errorf("call %d: initialize answered %d %s (%v)", i, code, body, err)
					return
				}
				sid := h.Get("Mcp-Session-Id")
				if first[w] == "" {
					first[w] = sid
				}
				code, _, body, err = post(hc, endpoint, a, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
				if err != nil || code != http.StatusAccepted {
					t.Errorf("call %d: initialized answered %d %s (%v)", i, code, body, err)
					return
				}
				call := fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_ticket","arguments":{"title":"t%d"}}}`, i%50)
				code, _, body, err = post(hc, endpoint, a, sid, call, "Idem-Session", fmt.Sprintf("run-%d", i%50))
				if err != nil || code != http.StatusOK || !strings.Contains(body, `"status":"completed"`) {
					t.Errorf("call %d answered %d %s (%v)", i, code, body, err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, 50, hook.count(), "each operation ran once")
	for _, sid := range first {
		require.False(t, alive(t, hc, endpoint, a, sid), "the first sessions gave way to later ones (the cap is 100)")
	}
}

// Held calls are capped per token and in all: a token's calls past its cap
// (or past all callers' together) are answered 429 at once and fire
// nothing; once held calls end, calls go through again.
func TestMCPHeldCallsAreBounded(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	release := make(chan struct{})
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/slow") {
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	startWorker(t, "w1", url, writeTools(t, mcpDoorTools(hook.URL)))
	file := filepath.Join(t.TempDir(), "tokens")
	a := newToken(t, file, "agent", "team-a", "a")
	b := newToken(t, file, "agent", "team-b", "b")
	endpoint := startMCPHTTP(t, url, "--tokens", file, "--max-calls-per-token", "2", "--max-calls", "3")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	slow := func(cs *mcp.ClientSession, n int) (*mcp.CallToolResult, error) {
		return cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"n": n}, Meta: mcp.Meta{"io.idemgate/session": "s"}})
	}
	csa, csb := mustSession(t, endpoint, a), mustSession(t, endpoint, b)

	var wg sync.WaitGroup
	held := make([]*mcp.CallToolResult, 3)
	errs := make([]error, 3)
	for i, c := range []struct {
		cs *mcp.ClientSession
		n  int
	}{{csa, 1}, {csa, 2}, {csb, 3}} {
		wg.Go(func() { held[i], errs[i] = slow(c.cs, c.n) })
		hook.waitHit(t, time.Minute) // held at the downstream
	}
	_, err := slow(csa, 4)
	require.ErrorContains(t, err, http.StatusText(http.StatusTooManyRequests), "a's third call, past its cap")
	code, h, body, err := post(&http.Client{}, endpoint, a, "", `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Equal(t, "rate_limited", problemOf(t, h, body)["code"])
	retry, err := strconv.Atoi(h.Get("Retry-After"))
	require.NoError(t, err)
	require.True(t, retry > 120 && retry <= 180, "Retry-After %d: when a held call ends at the latest (--wait 3m)", retry)
	_, err = slow(csb, 5)
	require.ErrorContains(t, err, http.StatusText(http.StatusTooManyRequests), "b's second call, past all callers' cap")
	require.Equal(t, 3, hook.count(), "the refused calls fired nothing")

	unblock()
	wg.Wait()
	for i := range held {
		require.NoError(t, errs[i])
		require.False(t, held[i].IsError, mcpText(held[i]))
	}
	res, err := slow(csa, 4)
	require.NoError(t, err, "the session goes on after a 429")
	require.False(t, res.IsError, mcpText(res))
	require.Equal(t, 4, hook.count())
}

// A token whose every session has a call in progress is refused a new
// one, with a Retry-After that says when a held call ends at the latest
// (--wait); once the call has ended, its session gives way to a new one.
func TestMCPBusySessionsSayWhenToComeBack(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	release := make(chan struct{})
	hook := newSink(t, func(n int, w http.ResponseWriter, r *http.Request) {
		<-release
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	startWorker(t, "w1", url, writeTools(t, mcpDoorTools(hook.URL)))
	file := filepath.Join(t.TempDir(), "tokens")
	a := newToken(t, file, "agent", "team-a", "a")
	endpoint := startMCPHTTP(t, url, "--tokens", file, "--max-sessions-per-token", "1", "--wait", "100s")
	cs := legacySession(t, endpoint, a)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"n": 1}})
		done <- err
	}()
	hook.waitHit(t, time.Minute)

	hc := &http.Client{}
	code, h, body := rawInit(t, hc, endpoint, a)
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Equal(t, "rate_limited", problemOf(t, h, body)["code"])
	retry, err := strconv.Atoi(h.Get("Retry-After"))
	require.NoError(t, err)
	require.True(t, retry > 60 && retry <= 100, "Retry-After %d: when the held call ends at the latest (--wait 100s)", retry)

	unblock()
	require.NoError(t, <-done)
	// The call's answer reaches the client a moment before its request
	// ends on the server; from then on its session is idle and gives way.
	require.Eventually(t, func() bool {
		var err error
		if code, _, body, err = tryInit(hc, endpoint, a); err != nil {
			code, body = 0, err.Error()
		}
		return code != http.StatusTooManyRequests
	}, time.Minute, 20*time.Millisecond)
	require.Equal(t, http.StatusOK, code, body)
	require.False(t, alive(t, hc, endpoint, a, cs.ID()), "the idle session gave way")
}

// A session idle for --session-idle ends, and its room with it.
func TestMCPIdleSessionsEnd(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	startWorker(t, "w1", url, writeTools(t, mcpDoorTools("http://127.0.0.1:9")))
	file := filepath.Join(t.TempDir(), "tokens")
	a := newToken(t, file, "agent", "team-a", "a")
	endpoint := startMCPHTTP(t, url, "--tokens", file, "--max-sessions-per-token", "1", "--session-idle", "1s")
	hc := &http.Client{}
	code, h, body := rawInit(t, hc, endpoint, a)
	require.Equal(t, http.StatusOK, code, body)
	first := h.Get("Mcp-Session-Id")
	require.NotEmpty(t, first)

	// The idle session ends on its own.
	require.Eventually(t, func() bool { return !alive(t, hc, endpoint, a, first) }, 2*time.Minute, 1500*time.Millisecond) // a ping is a use: poll slower than the idle time
	require.Equal(t, http.StatusNotFound, deleteSession(t, hc, endpoint, a, first), "the idle session is gone")
}

// rss is the process's resident memory in KiB (Linux).
func rss(t *testing.T, p *proc) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// mcpDoorTools are the tools of these tests: a ticket tool, and a slow one
// whose downstream holds every call until the test releases it.
func mcpDoorTools(sink string) string {
	return fmt.Sprintf(`tools:
  create_ticket:
    effect: webhook
    key_args: [title]
    webhook: {url: %[1]s/tickets}
  slow:
    effect: webhook
    key_args: [n]
    webhook: {url: %[1]s/slow, timeout: 5m}
    lease: 5m
`, sink)
}

// make run serves the MCP server behind the tokens file it makes: no token
// is refused, the agent token of data/agent.token is served.
func TestMakeRunMCPTakesTheAgentToken(t *testing.T) {
	skipShort(t, "make run (it builds every binary)")
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	data := t.TempDir()
	mcpPort := freePort(t)
	r := startMakeRun(t, t.TempDir(), fmt.Sprintf("NATS_PORT=%d", freePort(t)), fmt.Sprintf("SINK_PORT=%d", freePort(t)),
		fmt.Sprintf("GATEWAY_PORT=%d", freePort(t)), fmt.Sprintf("MCP_PORT=%d", mcpPort), "DATA="+data)
	r.says(t, "mcp serving")
	r.says(t, "worker consuming")

	endpoint := fmt.Sprintf("http://127.0.0.1:%d/mcp", mcpPort)
	code, _, _ := rawInit(t, &http.Client{}, endpoint, "")
	require.Equal(t, http.StatusUnauthorized, code)
	token, err := os.ReadFile(filepath.Join(data, "agent.token"))
	require.NoError(t, err)
	cs := mustSession(t, endpoint, strings.TrimSpace(string(token)))
	res := callIn(t, cs, "run-7", "send_email", map[string]any{"to": "ada@example.com", "subject": "Your order shipped"})
	require.False(t, res.IsError, mcpText(res))
	require.Equal(t, "completed", opOf(t, res.Meta).Status)
}

// The Go SDK's client of protocol 2026-07-28 is served statelessly over
// HTTP: no initialize, no MCP session; a retry is answered from the ledger
// all the same. GET and DELETE of that protocol answer 405, and a request
// whose header and _meta name different versions is refused.
func TestMCPStatelessOverHTTP(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, mcpDoorTools(hook.URL)))
	file := filepath.Join(t.TempDir(), "tokens")
	a := newToken(t, file, "agent", "team-a", "a")
	endpoint := startMCPHTTP(t, url, "--tokens", file)

	cs := mustSession(t, endpoint, a)
	require.Equal(t, "2026-07-28", cs.InitializeResult().ProtocolVersion)
	require.Empty(t, cs.ID(), "no MCP session")
	args := map[string]any{"title": "printer on fire"}
	res := callIn(t, cs, "run-1", "create_ticket", args)
	require.False(t, res.IsError, mcpText(res))
	res = callIn(t, mustSession(t, endpoint, a), "run-1", "create_ticket", args)
	require.True(t, opOf(t, res.Meta).Replayed, mcpText(res))
	require.Equal(t, 1, hook.count())

	hc := &http.Client{}
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		req, err := http.NewRequest(method, endpoint, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+a)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2026-07-28")
		resp, err := hc.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, method)
	}
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"%s","io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	code, _, body, err := post(hc, endpoint, a, "", fmt.Sprintf(list, "2026-07-28"), "MCP-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/list")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "create_ticket")
	code, _, body, err = post(hc, endpoint, a, "", fmt.Sprintf(list, "2026-07-28"), "MCP-Protocol-Version", "2025-11-25", "Mcp-Method", "tools/list")
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, code, "a header and _meta that disagree: %s", body)
}

// A client of protocol 2026-07-28 (the Go SDK's) is asked to approve a
// tool of approver: user by an input request of the call's answer, over
// stateless HTTP through bin/mcp: accepted, the operation fires once and
// the call answers its result; a client that cannot answer gets
// awaiting_approval, and its call fires nothing.
func TestMCPApprovalByInputRequest(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  refund:
    effect: webhook
    key_args: [order_id]
    approval: required
    approver: user
    webhook: {url: %s/refunds}
`, hook.URL)))
	file := filepath.Join(t.TempDir(), "tokens")
	a := newToken(t, file, "agent", "team-a", "a")
	endpoint := startMCPHTTP(t, url, "--tokens", file)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func(opts *mcp.ClientOptions) *mcp.ClientSession {
		t.Helper()
		c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, opts)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: bearer(a)}, MaxRetries: -1}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = cs.Close() })
		require.Equal(t, "2026-07-28", cs.InitializeResult().ProtocolVersion)
		require.Empty(t, cs.ID(), "no MCP session")
		return cs
	}
	var asked []string
	accept := connect(&mcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		asked = append(asked, req.Params.Message)
		return &mcp.ElicitResult{Action: "accept"}, nil
	}})
	res := callIn(t, accept, "run-1", "refund", map[string]any{"order_id": "o-1"})
	require.False(t, res.IsError, mcpText(res))
	require.Equal(t, "completed", opOf(t, res.Meta).Status, mcpText(res))
	require.Len(t, asked, 1)
	require.Contains(t, asked[0], `"order_id":"o-1"`, "the question shows the arguments")
	require.Equal(t, 1, hook.count())

	res = callIn(t, connect(nil), "run-1", "refund", map[string]any{"order_id": "o-2"})
	require.False(t, res.IsError, mcpText(res))
	require.Equal(t, "awaiting_approval", opOf(t, res.Meta).Status, mcpText(res))
	require.Contains(t, mcpText(res), "must approve")
	require.Equal(t, 1, hook.count(), "nothing fired without an approval")
}
