package mcpgate

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/hint"
	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/internal/worker"
	"github.com/idemgate/idemgate/internal/worker/workertest"
	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

// testTools are the tools the tests' workers serve. Each is counted: its
// noop effect (slow's takes 3s) is wrapped to count the firings per tool
// and answer {"n": count, "args": ...} (see setup).
const testTools = `tools:
  send_email:
    effect: noop
    key_args: [to, subject]
    volatile_args: [body]
    description: Send an email.
    schema:
      type: object
      properties:
        to: {type: string}
        subject: {type: string, maxLength: 200}
        body: {type: string}
      required: [to, subject]
      additionalProperties: false
  create_ticket:
    effect: noop
    key_args: [title]
    description: Open a support ticket.
  get_order:
    effect: noop
    class: read
  set_status:
    effect: noop
    class: idempotent
    key_args: [order_id]
    destructive: false
  refund:
    effect: noop
    key_args: [order_id]
    approval: required
  user_refund:
    effect: noop
    key_args: [order_id]
    approval: required
    approver: user
  slow:
    effect: noop
    key_args: all
    noop: {delay: 3s}
`

type testBundle struct {
	gate   *Gate
	client *client.Client // an operator's
	js     jetstream.JetStream
	http   string // the gate's streamable HTTP endpoint

	mu    sync.Mutex
	fired map[string]int
}

// setup runs a worker serving testTools on an embedded JetStream and a gate
// in front of it, over in-memory transports and streamable HTTP.
func setup(t *testing.T, cfg Config) *testBundle {
	t.Helper()
	b := &testBundle{fired: map[string]int{}}
	srv := natstest.RunServer(t)
	b.runWorker(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	nc := natstest.Connect(t, srv.ClientURL())
	var err error
	cl, err := client.New(nc)
	require.NoError(t, err)
	b.gate, err = New(nc, cl, nil, cfg)
	require.NoError(t, err)
	require.NoError(t, b.gate.Refresh(ctx))
	b.client, err = client.New(natstest.Connect(t, srv.ClientURL()))
	require.NoError(t, err)
	b.js, err = jetstream.New(nc)
	require.NoError(t, err)
	hs := httptest.NewServer(b.gate.HTTPHandler())
	t.Cleanup(hs.Close)
	b.http = hs.URL + HTTPPath
	return b
}

// runWorker runs a worker serving testTools on the JetStream at url until
// the test ends, and returns once it is ready.
func (b *testBundle) runWorker(t *testing.T, url string) {
	t.Helper()
	workertest.Run(t, natstest.Connect(t, url), b.counted(t, testTools), worker.Config{})
}

// counted builds the registry of a tools file whose tools are all noops,
// each wrapped to count its firings: the tools as the file declares them
// (key spec, policy, schema), built again with NewRegistry around the
// counting effect.
func (b *testBundle) counted(t *testing.T, file string) *effects.Registry {
	t.Helper()
	parsed, err := toolsfile.Parse([]byte(file))
	require.NoError(t, err)
	t.Cleanup(func() { _ = parsed.Close() })
	var tools []*effects.Tool
	for _, name := range parsed.Names() {
		declared, _ := parsed.Lookup(name)
		tool := *declared
		inner := declared.Effect // the noop: its delay, ended early by ctx
		tool.Kind = "counted"
		tool.Effect = effects.EffectFunc(func(ctx context.Context, call effects.Call) (effects.Outcome, error) {
			if _, err := inner.Fire(ctx, call); err != nil {
				return effects.Outcome{}, err
			}
			b.mu.Lock()
			b.fired[call.Tool]++
			n := b.fired[call.Tool]
			b.mu.Unlock()
			return effects.Outcome{Result: json.RawMessage(`{"n":` + strconv.Itoa(n) + `,"args":` + string(call.Args) + `}`), Invocations: 1}, nil
		})
		tools = append(tools, &tool)
	}
	reg, err := effects.NewRegistry(tools...)
	require.NoError(t, err)
	return reg
}

func (b *testBundle) count(tool string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fired[tool]
}

// transport names how a test client reaches the gate.
type transport string

const (
	inMemory     transport = "in-memory"       // the SDK's newest protocol (multi round-trip)
	streamable   transport = "http"            // streamable HTTP, stateless (protocol 2026-07-28)
	withSessions transport = "http-2025-11-25" // streamable HTTP with sessions (protocol 2025-11-25)
)

var transports = []transport{inMemory, streamable, withSessions}

// connect opens a new MCP session to the gate; header is sent on every HTTP
// request.
func (b *testBundle) connect(t *testing.T, tr transport, opts *mcp.ClientOptions, header http.Header) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, opts)
	var ct mcp.Transport
	switch tr {
	case inMemory:
		st, cli := mcp.NewInMemoryTransports()
		ss, err := b.gate.Server().Connect(context.Background(), st, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = ss.Close() })
		ct = cli
	case streamable, withSessions:
		ct = &mcp.StreamableClientTransport{Endpoint: b.http, HTTPClient: &http.Client{Transport: headerRT{header}}, MaxRetries: -1}
	}
	var co *mcp.ClientSessionOptions
	if tr == withSessions {
		co = &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"}
	}
	cs, err := c.Connect(ctx, ct, co)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	switch tr {
	case streamable:
		require.Equal(t, "2026-07-28", cs.InitializeResult().ProtocolVersion)
		require.Empty(t, cs.ID(), "no MCP session")
	case withSessions:
		require.Equal(t, "2025-11-25", cs.InitializeResult().ProtocolVersion)
		require.NotEmpty(t, cs.ID(), "an MCP session")
	}
	return cs
}

type headerRT struct{ h http.Header }

func (h headerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, vs := range h.h {
		r.Header[k] = vs
	}
	return http.DefaultTransport.RoundTrip(r)
}

// call calls tool with args, in session (the _meta scope) when not "".
func call(t *testing.T, cs *mcp.ClientSession, session, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := &mcp.CallToolParams{Name: tool, Arguments: args}
	if session != "" {
		p.Meta = mcp.Meta{MetaSession: session}
	}
	res, err := cs.CallTool(ctx, p)
	require.NoError(t, err)
	return res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// op is the io.idemgate/operation _meta of a result.
func op(t *testing.T, res *mcp.CallToolResult) operation {
	t.Helper()
	raw, ok := res.Meta[MetaOperation]
	require.True(t, ok, "no %s in %v", MetaOperation, res.Meta)
	var o operation
	data, err := json.Marshal(raw)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &o))
	return o
}

// jsonFirst checks that res's first text item is the JSON of its
// structured content, whose hint's text is the one item after it, and
// returns that text.
func jsonFirst(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	require.Len(t, res.Content, 2, "the JSON, then the hint's text")
	first, ok := res.Content[0].(*mcp.TextContent)
	require.True(t, ok, "content[0] is text")
	data, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	require.JSONEq(t, string(data), first.Text, "content[0].text is the JSON of structuredContent")
	h := hintOf(t, res)
	note := text(&mcp.CallToolResult{Content: res.Content[1:]})
	require.Equal(t, h.Text, note, "the hint's text is the text item after the JSON")
	require.Equal(t, hint.Error(h.Code), res.IsError, "isError is the hint's (%s)", h.Code)
	return note
}

// hintOf is the hint in res's structured content.
func hintOf(t *testing.T, res *mcp.CallToolResult) hint.Hint {
	t.Helper()
	data, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	var v struct {
		Hint *hint.Hint `json:"hint"`
	}
	require.NoError(t, json.Unmarshal(data, &v))
	require.NotNil(t, v.Hint, "structuredContent has a hint: %s", data)
	return *v.Hint
}

func structuredOf(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	data, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(data, &m))
	return m
}

// lastSeq is the intent stream's last sequence: it moves on every publish.
func (b *testBundle) lastSeq(t *testing.T) uint64 {
	t.Helper()
	s, err := b.js.Stream(context.Background(), "IDEM_INTENTS")
	require.NoError(t, err)
	info, err := s.Info(context.Background())
	require.NoError(t, err)
	return info.State.LastSeq
}
