package effects

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// testUpstream is an MCP server over streamable HTTP with a counting
// side-effect tool (charge), a read (lookup), a tool that fails (decline)
// and one whose name idemgate cannot serve.
type testUpstream struct {
	srv    *mcp.Server
	http   *httptest.Server
	mu     sync.Mutex
	keys   []string // the io.idemgate/key of each charge
	firing []string // its io.idemgate/holder and attempt, "holder/attempt"
	charge int
}

func newTestUpstream(t *testing.T) *testUpstream {
	t.Helper()
	u := &testUpstream{srv: mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "1"}, nil)}
	obj := map[string]any{"type": "object"}
	u.srv.AddTool(&mcp.Tool{Name: "charge", Description: "Charge a card.", InputSchema: obj}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u.mu.Lock()
		defer u.mu.Unlock()
		u.charge++
		key, _ := req.Params.Meta[MetaKey].(string)
		u.keys = append(u.keys, key)
		u.firing = append(u.firing, fmt.Sprint(req.Params.Meta[MetaHolder], "/", req.Params.Meta[MetaAttempt]))
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "charged"}}, StructuredContent: map[string]any{"charge": u.charge}}, nil
	})
	u.srv.AddTool(&mcp.Tool{Name: "lookup", InputSchema: obj, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "found"}}}, nil
	})
	u.srv.AddTool(&mcp.Tool{Name: "decline", InputSchema: obj, Annotations: &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: new(false)}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "card declined"}}}, nil
	})
	u.srv.AddTool(&mcp.Tool{Name: "Bad.Name", InputSchema: obj}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	})
	u.http = httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return u.srv }, nil))
	t.Cleanup(func() {
		for ss := range u.srv.Sessions() {
			_ = ss.Close()
		}
		u.http.Close()
	})
	return u
}

func (u *testUpstream) charges() (int, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.charge, append([]string(nil), u.keys...)
}

func TestMCPUpstreamTools(t *testing.T) {
	t.Parallel()
	u := newTestUpstream(t)
	reg, err := Parse([]byte(`mcp_upstreams:
  pay:
    url: ` + u.http.URL + `
    tools:
      charge: {key_args: [order], approval: required}
tools:
  lookup: {effect: noop}
`))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close()) })
	require.Equal(t, []string{"charge", "decline", "lookup"}, reg.Names(), "the file's lookup wins; Bad.Name is not a tool name")

	charge, _ := reg.Lookup("charge")
	require.Equal(t, KindMCP, charge.Kind)
	require.Equal(t, ClassUnsafe, charge.Policy.Class)
	require.True(t, charge.Policy.Approval, "overridden")
	require.Equal(t, []string{"order"}, charge.KeySpec.KeyArgs)
	require.Equal(t, "Charge a card.", charge.Description)
	require.True(t, charge.IsDestructive())
	require.Equal(t, u.http.URL, charge.Effect.(*MCP).Upstream().String())
	decline, _ := reg.Lookup("decline")
	require.Equal(t, ClassIdempotent, decline.Policy.Class)
	require.False(t, decline.IsDestructive())
	lookup, _ := reg.Lookup("lookup")
	require.Equal(t, "noop", lookup.Kind)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := charge.Effect.Fire(ctx, Call{Key: "charge.k1", Tool: "charge", Args: json.RawMessage(`{"order":"7"}`), Holder: "w1.2", Attempt: 3})
	require.NoError(t, err)
	require.JSONEq(t, `{"content":[{"type":"text","text":"charged"}],"structuredContent":{"charge":1}}`, string(out.Result))
	n, keys := u.charges()
	require.Equal(t, 1, n)
	require.Equal(t, []string{"charge.k1"}, keys, "the key goes upstream in _meta")
	u.mu.Lock()
	require.Equal(t, []string{"w1.2/3"}, u.firing, "so do the holder and the attempt")
	u.mu.Unlock()

	_, err = decline.Effect.Fire(ctx, Call{Key: "decline.k", Tool: "decline", Args: json.RawMessage(`{}`)})
	pe, ok := IsPermanent(err)
	require.True(t, ok, "an isError result is permanent: %v", err)
	require.Contains(t, pe.Message, "card declined")

	// A tool added upstream is listed (notifications/tools/list_changed).
	u.srv.AddTool(&mcp.Tool{Name: "refund", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	})
	require.Eventually(t, func() bool { _, ok := reg.Lookup("refund"); return ok }, 10*time.Second, 20*time.Millisecond)
	u.srv.RemoveTools("decline")
	require.Eventually(t, func() bool { _, ok := reg.Lookup("decline"); return !ok }, 10*time.Second, 20*time.Millisecond)

	// The upstream gone: transient, never permanent.
	u.http.CloseClientConnections()
	u.http.Close()
	short, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	_, err = charge.Effect.Fire(short, Call{Key: "charge.k2", Tool: "charge", Args: json.RawMessage(`{"order":"8"}`)})
	require.Error(t, err)
	_, perm := IsPermanent(err)
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
			_, err := Parse([]byte(c.file))
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestMCPToolOfItsOwn(t *testing.T) {
	t.Parallel()
	u := newTestUpstream(t)
	reg, err := Parse([]byte("tools:\n  pay: {effect: mcp, key_args: [order], mcp: {url: " + u.http.URL + ", tool: charge}}\n"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close()) })
	pay, _ := reg.Lookup("pay")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = pay.Effect.Fire(ctx, Call{Key: "pay.k", Tool: "pay", Args: json.RawMessage(`{"order":"1"}`)})
	require.NoError(t, err)
	n, _ := u.charges()
	require.Equal(t, 1, n)
}
