package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/mcp"
	"github.com/idemgate/idemgate/pkg/effects/netguard"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
	"github.com/idemgate/idemgate/pkg/intent"
)

// testUpstream is an MCP server over streamable HTTP with a counting
// side-effect tool (charge), a read (lookup), a tool that fails (decline)
// and one whose name idemgate cannot serve.
type testUpstream struct {
	srv      *sdk.Server
	http     *httptest.Server
	requests atomic.Int64 // HTTP requests that reached the server
	mu       sync.Mutex
	keys     []string // the io.idemgate/key of each charge
	firing   []string // its io.idemgate/holder and attempt, "holder/attempt"
	charge   int
}

func newTestUpstream(t *testing.T) *testUpstream {
	t.Helper()
	u := &testUpstream{srv: sdk.NewServer(&sdk.Implementation{Name: "upstream", Version: "1"}, nil)}
	obj := map[string]any{"type": "object"}
	u.srv.AddTool(&sdk.Tool{Name: "charge", Description: "Charge a card.", InputSchema: obj}, func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		u.mu.Lock()
		defer u.mu.Unlock()
		u.charge++
		key, _ := req.Params.Meta[mcp.MetaKey].(string)
		u.keys = append(u.keys, key)
		u.firing = append(u.firing, fmt.Sprint(req.Params.Meta[mcp.MetaHolder], "/", req.Params.Meta[mcp.MetaAttempt]))
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "charged"}}, StructuredContent: map[string]any{"charge": u.charge}}, nil
	})
	u.srv.AddTool(&sdk.Tool{Name: "lookup", InputSchema: obj, Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true}}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "found"}}}, nil
	})
	u.srv.AddTool(&sdk.Tool{Name: "decline", InputSchema: obj, Annotations: &sdk.ToolAnnotations{IdempotentHint: true, DestructiveHint: new(false)}}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "card declined"}}}, nil
	})
	u.srv.AddTool(&sdk.Tool{Name: "Bad.Name", InputSchema: obj}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{}, nil
	})
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return u.srv }, nil)
	u.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		for ss := range u.srv.Sessions() {
			_ = ss.Close()
		}
		u.http.Close()
	})
	return u
}

// allowLoopback lets the tests' upstreams, on 127.0.0.1, be reached.
var allowLoopback = toolsfile.WithAllowPrivate(netip.MustParsePrefix("127.0.0.0/8"))

func (u *testUpstream) charges() (int, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.charge, append([]string(nil), u.keys...)
}

func TestMCPUpstreamTools(t *testing.T) {
	t.Parallel()
	u := newTestUpstream(t)
	reg, err := toolsfile.Parse([]byte(`mcp_upstreams:
  pay:
    url: `+u.http.URL+`
    tools:
      charge: {key_args: [order], approval: required}
      decline: {class: idempotent}
tools:
  lookup: {effect: noop, class: read}
`), allowLoopback)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close()) })
	require.Equal(t, []string{"charge", "decline", "lookup"}, reg.Names(), "the file's lookup wins; Bad.Name is not a tool name")

	charge, _ := reg.Lookup("charge")
	require.Equal(t, intent.EffectMCP, charge.Kind)
	require.Equal(t, intent.ClassUnsafe, charge.Policy.Class)
	require.True(t, charge.Policy.Approval, "overridden")
	require.Equal(t, []string{"order"}, charge.KeySpec.KeyArgs)
	require.Equal(t, "Charge a card.", charge.Description)
	require.True(t, charge.IsDestructive())
	require.Equal(t, u.http.URL, charge.Effect.(*mcp.Effect).Upstream().String())
	decline, _ := reg.Lookup("decline")
	require.Equal(t, intent.ClassIdempotent, decline.Policy.Class)
	require.False(t, decline.IsDestructive())
	lookup, _ := reg.Lookup("lookup")
	require.Equal(t, "noop", lookup.Kind)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := charge.Effect.Fire(ctx, effects.Call{Key: "charge.k1", Tool: "charge", Args: json.RawMessage(`{"order":"7"}`), Holder: "w1.2", Attempt: 3})
	require.NoError(t, err)
	require.JSONEq(t, `{"content":[{"type":"text","text":"charged"}],"structuredContent":{"charge":1}}`, string(out.Result))
	n, keys := u.charges()
	require.Equal(t, 1, n)
	require.Equal(t, []string{"charge.k1"}, keys, "the key goes upstream in _meta")
	u.mu.Lock()
	require.Equal(t, []string{"w1.2/3"}, u.firing, "so do the holder and the attempt")
	u.mu.Unlock()

	_, err = decline.Effect.Fire(ctx, effects.Call{Key: "decline.k", Tool: "decline", Args: json.RawMessage(`{}`)})
	pe, ok := effects.IsPermanent(err)
	require.True(t, ok, "an isError result is permanent: %v", err)
	require.Contains(t, pe.Message, "card declined")

	// A tool added upstream is listed (notifications/tools/list_changed),
	// under the rules of the file: one whose key a model could choose (an
	// open schema, no key_args in the file) is left out.
	open := map[string]any{"type": "object"}
	closed := map[string]any{"type": "object", "properties": map[string]any{"order": map[string]any{"type": "string"}}, "additionalProperties": false}
	for name, schema := range map[string]any{"refund": closed, "void": open} {
		u.srv.AddTool(&sdk.Tool{Name: name, InputSchema: schema}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{}, nil
		})
	}
	require.Eventually(t, func() bool { _, ok := reg.Lookup("refund"); return ok }, 10*time.Second, 20*time.Millisecond)
	_, ok = reg.Lookup("void")
	require.False(t, ok, "void was listed with refund, and left out")
	u.srv.RemoveTools("decline")
	require.Eventually(t, func() bool { _, ok := reg.Lookup("decline"); return !ok }, 10*time.Second, 20*time.Millisecond)

	// The upstream gone: transient, never permanent.
	u.http.CloseClientConnections()
	u.http.Close()
	short, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	_, err = charge.Effect.Fire(short, effects.Call{Key: "charge.k2", Tool: "charge", Args: json.RawMessage(`{"order":"8"}`)})
	require.Error(t, err)
	_, perm := effects.IsPermanent(err)
	require.False(t, perm, "a broken transport is transient: %v", err)
}

func TestMCPConfigErrors(t *testing.T) {
	t.Parallel()
	u := newTestUpstream(t)
	cases := []struct{ name, file, want string }{
		{"unreachable", "mcp_upstreams:\n  pay: {url: 'http://127.0.0.1:1/mcp'}\n", "tools.yaml:2: mcp_upstreams.pay: could not list its tools"},
		{"neither", "mcp_upstreams:\n  pay: {prefix: p_}\n", "tools.yaml:2: mcp_upstreams.pay: give the server's command"},
		{"both", "mcp_upstreams:\n  pay: {url: 'http://x/', command: [a]}\n", "give a command or a url, not both"},
		{"override of no tool", "mcp_upstreams:\n  pay:\n    url: " + u.http.URL + "\n    tools:\n      chrage: {class: read}\n", "tools.yaml:5: mcp_upstreams.pay.tools.chrage: the upstream lists no such tool"},
		{"override typo", "mcp_upstreams:\n  pay:\n    url: " + u.http.URL + "\n    tools:\n      charge: {clas: read}\n", "charge.clas: unknown field (did you mean class?)"},
		{"typo", "mcp_upstreams:\n  pay: {url: " + u.http.URL + ", prefx: p_}\n", "mcp_upstreams.pay.prefx: unknown field"},
		{"tool without upstream", "tools:\n  t: {effect: mcp, mcp: {upstream: nope, tool: x}}\n", `no mcp_upstreams entry is named "nope"`},
		{"tool without tool", "tools:\n  t: {effect: mcp, mcp: {url: 'http://x/'}}\n", "t.mcp.tool: is missing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := toolsfile.Parse([]byte(c.file), allowLoopback)
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestMCPToolOfItsOwn(t *testing.T) {
	t.Parallel()
	u := newTestUpstream(t)
	reg, err := toolsfile.Parse([]byte("tools:\n  pay: {effect: mcp, key_args: [order], mcp: {url: "+u.http.URL+", tool: charge}}\n"), allowLoopback)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close()) })
	pay, _ := reg.Lookup("pay")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = pay.Effect.Fire(ctx, effects.Call{Key: "pay.k", Tool: "pay", Args: json.RawMessage(`{"order":"1"}`)})
	require.NoError(t, err)
	n, _ := u.charges()
	require.Equal(t, 1, n)
}

// A url upstream dials through a netguard.Guard, as a webhook does: the test
// upstream, on loopback, is refused — nothing reaches it — unless the
// upstream's allow_private or the worker's list names it, and IPv6 forms
// that embed an IPv4 address do not get around it.
func TestMCPURLUpstreamGuard(t *testing.T) {
	t.Parallel()
	u := newTestUpstream(t)
	port := u.http.URL[strings.LastIndexByte(u.http.URL, ':')+1:]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	charge := func(t *testing.T, reg *effects.Registry, tool string) error {
		t.Helper()
		tl, ok := reg.Lookup(tool)
		require.True(t, ok)
		_, err := tl.Effect.Fire(ctx, effects.Call{Key: tool + ".k", Tool: tool, Args: json.RawMessage(`{"order":"1"}`)})
		return err
	}

	// An mcp_upstreams entry is listed when the file loads: refused, the
	// file does not load, and the error says how to allow it.
	entry := "mcp_upstreams:\n  pay:\n    url: " + u.http.URL + "\n"
	const overrides = "    tools: {charge: {key_args: [order]}, decline: {class: idempotent}, lookup: {class: read}}\n"
	_, err := toolsfile.Parse([]byte(entry))
	require.ErrorIs(t, err, toolsfile.ErrConfig)
	require.EqualError(t, err, "tools.yaml:2: mcp_upstreams.pay: could not list its tools: "+u.http.URL+
		": address 127.0.0.1 is loopback and not allowed (add allow_private: [127.0.0.1/32] to this upstream, or start the worker with --webhook-allow 127.0.0.1/32)")
	require.Zero(t, u.requests.Load(), "the refused upstream got no request")

	for name, reg := range map[string]func() (*effects.Registry, error){
		"allow_private": func() (*effects.Registry, error) {
			return toolsfile.Parse([]byte(entry + "    allow_private: [127.0.0.1/32]\n" + overrides))
		},
		"worker-wide": func() (*effects.Registry, error) { return toolsfile.Parse([]byte(entry+overrides), allowLoopback) },
	} {
		r, err := reg()
		require.NoError(t, err, name)
		require.NoError(t, charge(t, r, "charge"), name)
		require.NoError(t, r.Close())
	}
	n, _ := u.charges()
	require.Equal(t, 2, n)

	// A tool's own url connects when it fires: refused there, permanently
	// (nothing was sent; a retry would be refused again), with a warning at
	// load for an IP literal.
	own := func(url, extra string) string {
		return "tools:\n  pay:\n    effect: mcp\n    key_args: [order]\n    mcp: {url: '" + url + "', tool: charge" + extra + "}\n"
	}
	reg, err := toolsfile.Parse([]byte(own(u.http.URL, "")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	require.Len(t, reg.Warnings(), 1)
	require.Contains(t, reg.Warnings()[0].String(), "tools.yaml:5: pay.mcp.url: "+u.http.URL+" names 127.0.0.1, a loopback address")
	require.Contains(t, reg.Warnings()[0].String(), "add allow_private: [127.0.0.1/32] to this mcp upstream")
	before := u.requests.Load()
	err = charge(t, reg, "pay")
	require.ErrorIs(t, err, netguard.ErrForbidden)
	pe, ok := effects.IsPermanent(err)
	require.True(t, ok, "a refused destination is permanent: %v", err)
	require.Contains(t, pe.Message, "address 127.0.0.1 is loopback and not allowed (nothing was sent")
	require.Equal(t, before, u.requests.Load(), "nothing reached the upstream")

	reg, err = toolsfile.Parse([]byte(own(u.http.URL, ", allow_private: [127.0.0.1/32]")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	require.Empty(t, reg.Warnings())
	require.NoError(t, charge(t, reg, "pay"))

	// A name is judged by the address it resolves to, and IPv6 forms that
	// carry an IPv4 address are refused, even where 127.0.0.0/8 is allowed
	// (an IPv4-mapped address is the IPv4 address it carries).
	before = u.requests.Load()
	ipv6 := false // the guard runs once the socket exists: one of AF_INET6 must be possible
	if l, err := net.Listen("tcp6", "[::1]:0"); err == nil {
		ipv6 = true
		_ = l.Close()
	}
	for _, c := range []struct {
		url, what string
		allow     toolsfile.Option
	}{
		{"http://localhost:" + port, "loopback", toolsfile.WithFilename("tools.yaml")},
		{"http://[::ffff:127.0.0.1]:" + port, "loopback", toolsfile.WithFilename("tools.yaml")},
		{"http://[64:ff9b::7f00:1]:" + port, "NAT64", allowLoopback},
		{"http://[::127.0.0.1]:" + port, "IPv4-compatible", allowLoopback},
		{"http://[2002:7f00:1::1]:" + port, "6to4", allowLoopback},
	} {
		if strings.Contains(c.url, "[") && !strings.Contains(c.url, "ffff") && !ipv6 {
			t.Logf("%s: no IPv6 sockets here, not dialled", c.url)
			continue
		}
		reg, err := toolsfile.Parse([]byte(own(c.url, "")), c.allow)
		require.NoError(t, err, c.url)
		t.Cleanup(func() { _ = reg.Close() })
		err = charge(t, reg, "pay")
		var de *netguard.DestinationError
		require.ErrorAs(t, err, &de, c.url)
		require.Contains(t, de.What, c.what, c.url)
		_, perm := effects.IsPermanent(err)
		require.True(t, perm, c.url)
	}
	require.Equal(t, before, u.requests.Load(), "nothing reached the upstream")

	// allow_private belongs to a url.
	_, err = toolsfile.Parse([]byte("mcp_upstreams:\n  pay:\n    command: [srv]\n    allow_private: [127.0.0.1/32]\n"))
	require.ErrorContains(t, err, "tools.yaml:4: mcp_upstreams.pay.allow_private: applies only to a url upstream")
	_, err = toolsfile.Parse([]byte(entry + "    allow_private: [intranet]\n"))
	require.ErrorContains(t, err, `tools.yaml:4: mcp_upstreams.pay.allow_private[0]: "intranet" is not an IP address or CIDR prefix`)
	_, err = toolsfile.Parse([]byte("tools:\n  t: {effect: mcp, mcp: {upstream: pay, tool: x, allow_private: [10.0.0.0/8]}}\n"))
	require.ErrorContains(t, err, "t.mcp.allow_private: is given with upstream")
}

// The tools file decides a tool's class: an upstream's readOnlyHint (or
// idempotentHint) is its own claim, which a listing may change at any
// time, so its tool is unsafe, through the ledger, unless the file says
// otherwise — and the file is warned about the hint it ignores.
func TestMCPUpstreamHintsDoNotSetTheClass(t *testing.T) {
	t.Parallel()
	srv := sdk.NewServer(&sdk.Implementation{Name: "up", Version: "1"}, nil)
	closed := map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string"}}, "additionalProperties": false}
	for _, name := range []string{"peek", "peek_pinned", "touch"} {
		a := &sdk.ToolAnnotations{ReadOnlyHint: name != "touch", IdempotentHint: name == "touch"}
		srv.AddTool(&sdk.Tool{Name: name, InputSchema: closed, Annotations: a}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			return &sdk.CallToolResult{}, nil
		})
	}
	hs := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	reg, err := toolsfile.Parse([]byte("mcp_upstreams:\n  up:\n    url: "+hs.URL+"\n    tools:\n      peek_pinned: {class: read}\n"), allowLoopback)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	for name, want := range map[string]intent.Class{"peek": intent.ClassUnsafe, "touch": intent.ClassUnsafe, "peek_pinned": intent.ClassRead} {
		tool, ok := reg.Lookup(name)
		require.True(t, ok, name)
		require.Equal(t, want, tool.Policy.Class, name)
		require.Equal(t, want != intent.ClassRead, tool.Policy.Ledger, name)
	}
	var warns []string
	for _, w := range reg.Warnings() {
		warns = append(warns, w.String())
	}
	require.Len(t, warns, 2, strings.Join(warns, "\n"))
	require.Contains(t, strings.Join(warns, "\n"), "tools.yaml:2: mcp_upstreams.up.tools.peek: the upstream marks it readOnlyHint, and the tools file gives no class: it is served unsafe, through the ledger (if a repeat is harmless, write class: read in mcp_upstreams.up.tools.peek")
	require.Contains(t, strings.Join(warns, "\n"), "mcp_upstreams.up.tools.touch: the upstream marks it idempotentHint")
}

// What may be a secret of an upstream — a URL's user, password, query and
// fragment — is in no name the catalogue shows and in no message a failure
// records.
func TestMCPUpstreamSecretsAreNotShown(t *testing.T) {
	t.Parallel()
	u := newTestUpstream(t)
	secretURL := strings.Replace(u.http.URL, "http://", "http://agent-user:pw-s3cret@", 1) + "/mcp?token=tok-s3cret&x=1"
	reg, err := toolsfile.Parse([]byte("tools:\n  pay: {effect: mcp, key_args: [order], mcp: {url: '"+secretURL+"', tool: decline, retry: {max_attempts: 2, initial_interval: 1ms, max_interval: 1ms}}}\n"), allowLoopback)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	pay, _ := reg.Lookup("pay")
	require.Equal(t, u.http.URL+"/mcp", pay.Effect.(*mcp.Effect).Upstream().String())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hidden := func(t *testing.T, msg string) {
		t.Helper()
		for _, s := range []string{"pw-s3cret", "tok-s3cret", "agent-user", "token="} {
			require.NotContains(t, msg, s)
		}
	}
	_, err = pay.Effect.Fire(ctx, effects.Call{Key: "pay.k", Tool: "pay", Args: json.RawMessage(`{"order":"1"}`)})
	require.Error(t, err)
	hidden(t, err.Error())

	// A broken transport: the HTTP client's error names the URL it asked.
	u.http.CloseClientConnections()
	u.http.Close()
	_, err = pay.Effect.Fire(ctx, effects.Call{Key: "pay.k2", Tool: "pay", Args: json.RawMessage(`{"order":"2"}`)})
	require.ErrorIs(t, err, effects.ErrExhausted)
	require.Contains(t, err.Error(), u.http.URL+"/mcp")
	hidden(t, err.Error())

	// An upstream that cannot be listed when the file loads.
	_, err = toolsfile.Parse([]byte("mcp_upstreams:\n  pay: {url: '"+secretURL+"'}\n"), allowLoopback)
	require.ErrorContains(t, err, "mcp_upstreams.pay: could not list its tools")
	hidden(t, err.Error())
	_, err = toolsfile.Parse([]byte("mcp_upstreams:\n  pay: {url: 'ftp://agent-user:pw-s3cret@host/?token=tok-s3cret'}\n"))
	require.ErrorContains(t, err, "is not an http or https URL")
	hidden(t, err.Error())
}

// A redirect from a URL upstream is never followed: a tools/call answered
// 307 fails for good, and the host the redirect names gets nothing.
func TestMCPUpstreamRedirectIsNotFollowed(t *testing.T) {
	t.Parallel()
	elsewhere := newTestUpstream(t) // a real MCP server: it would answer a followed call
	u := newTestUpstream(t)
	var redirected atomic.Int64
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"tools/call"`) {
			redirected.Add(1)
			http.Redirect(w, r, elsewhere.http.URL+"/mcp?moved=1", http.StatusTemporaryRedirect)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		u.http.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	reg, err := toolsfile.Parse([]byte("tools:\n  pay: {effect: mcp, key_args: [order], mcp: {url: '"+front.URL+"/mcp', tool: charge}}\n"), allowLoopback)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	pay, _ := reg.Lookup("pay")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := pay.Effect.Fire(ctx, effects.Call{Key: "pay.k", Tool: "pay", Args: json.RawMessage(`{"order":"1"}`)})
	pe, ok := effects.IsPermanent(err)
	require.True(t, ok, "a redirect is permanent: %v", err)
	require.Contains(t, pe.Message, "answered with a redirect, which is not followed: configure the final URL")
	require.Equal(t, 1, out.Invocations, "not retried")
	require.EqualValues(t, 1, redirected.Load())
	require.Zero(t, elsewhere.requests.Load(), "the host the redirect names got nothing")
	n, _ := elsewhere.charges()
	require.Zero(t, n)

	// An mcp_upstreams entry that redirects cannot be listed.
	all := httptest.NewServer(http.RedirectHandler(elsewhere.http.URL+"/mcp", http.StatusTemporaryRedirect))
	t.Cleanup(all.Close)
	_, err = toolsfile.Parse([]byte("mcp_upstreams:\n  pay: {url: '"+all.URL+"'}\n"), allowLoopback)
	require.ErrorContains(t, err, "give the upstream's final URL: redirects are not followed")
	require.Zero(t, elsewhere.requests.Load())
}

var (
	_ effects.Effect  = (*mcp.Effect)(nil)
	_ effects.Bounded = (*mcp.Effect)(nil)
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
