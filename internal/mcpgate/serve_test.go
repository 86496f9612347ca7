package mcpgate

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/auth"
	"github.com/idemgate/idemgate/pkg/intent"
)

func TestAnnotationsAndDescriptionsFromPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tools := map[string]*mcp.Tool{}
	for tool, err := range b.connect(t, streamable, nil, nil).Tools(ctx, nil) {
		require.NoError(t, err)
		tools[tool.Name] = tool
	}
	require.Contains(t, tools, StatusTool)
	require.True(t, tools[StatusTool].Annotations.ReadOnlyHint)

	read := tools["get_order"].Annotations
	require.True(t, read.ReadOnlyHint)
	require.False(t, read.IdempotentHint)
	require.Nil(t, read.DestructiveHint)
	require.Contains(t, tools["get_order"].Description, "safe to call again")

	email := tools["send_email"]
	require.False(t, email.Annotations.ReadOnlyHint)
	require.True(t, email.Annotations.IdempotentHint)
	require.True(t, *email.Annotations.DestructiveHint)
	require.False(t, *email.Annotations.OpenWorldHint, "the counted effect is no webhook")
	require.True(t, strings.HasPrefix(email.Description, "Send an email."), email.Description)
	require.Contains(t, email.Description, "Safe to retry")
	require.Contains(t, email.Description, "the same to, subject")
	require.Contains(t, email.Description, "within 24h0m0s")
	require.Contains(t, email.Description, "refused as a conflict")
	require.Equal(t, "object", email.InputSchema.(map[string]any)["type"])
	require.Contains(t, email.InputSchema.(map[string]any)["required"], "to")

	require.False(t, *tools["set_status"].Annotations.DestructiveHint, "the tools file says so")
	require.Contains(t, tools["refund"].Description, "An operator approves")
	require.Contains(t, tools["user_refund"].Description, "The user confirms")
	// No schema in the tools file: the key args, required for unsafe tools.
	require.Equal(t, []any{"order_id"}, tools["refund"].InputSchema.(map[string]any)["required"])
}

func TestProgressAndCancellation(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{ProgressEvery: 100 * time.Millisecond})
			progress := make(chan *mcp.ProgressNotificationParams, 100)
			cs := b.connect(t, tr, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
				progress <- r.Params
			}}, nil)
			args := map[string]any{"job": "long"}

			// A call asking for progress hears of it; the client gives up
			// after the first notification.
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: args, Meta: mcp.Meta{"progressToken": "p1", MetaSession: "s"}})
				errc <- err
			}()
			select {
			case p := <-progress:
				require.Equal(t, "p1", p.ProgressToken)
				require.Contains(t, p.Message, "still running")
			case <-time.After(10 * time.Second):
				t.Fatal("no progress notification")
			}
			cancel()
			require.ErrorIs(t, <-errc, context.Canceled)

			// The operation goes on and completes once; the retry gets it.
			res := call(t, b.connect(t, tr, nil, nil), "s", "slow", args)
			require.False(t, res.IsError, text(res))
			require.Equal(t, intent.StatusCompleted, op(t, res).Status)
			require.True(t, op(t, res).Replayed)
			require.Equal(t, 1, b.count("slow"))
		})
	}
}

func TestAWaitThatRunsOutAnswersWithAReference(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Wait: 200 * time.Millisecond})
	cs := b.connect(t, inMemory, nil, nil)
	res := call(t, cs, "s", "slow", map[string]any{"n": 1})
	require.False(t, res.IsError, text(res))
	o := op(t, res)
	require.Equal(t, intent.StatusPending, o.Status)
	require.Contains(t, text(res), "Still running")
	st := call(t, cs, "", StatusTool, map[string]any{"operation": o.Key, "wait_seconds": 20})
	require.Equal(t, intent.StatusCompleted, op(t, st).Status, text(st))
	require.Equal(t, 1, b.count("slow"))
}

func TestBadInputKeepsTheServerServing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	post := func(body string, header http.Header) (int, string) {
		req, err := http.NewRequest(http.MethodPost, b.http, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	code, body := post(`{"jsonrpc": "2.0", "id": 1, "method": `, nil)
	require.Equal(t, http.StatusBadRequest, code, body)
	code, body = post(`[1, 2`, nil)
	require.Equal(t, http.StatusBadRequest, code, body)
	code, body = post(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_ticket"}}`, http.Header{"Mcp-Session-Id": {"no-such-session"}})
	require.Equal(t, http.StatusNotFound, code, body)

	cs := b.connect(t, streamable, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "no_such_tool", Arguments: map[string]any{}})
	require.Error(t, err)
	require.Contains(t, err.Error(), "no_such_tool")
	res := call(t, cs, "s", "create_ticket", map[string]any{"big": strings.Repeat("x", DefaultMaxArgsBytes)})
	require.True(t, res.IsError)
	require.Contains(t, text(res), "over the limit")
	status := call(t, cs, "", StatusTool, map[string]any{"operation": ""})
	require.True(t, status.IsError)

	// Concurrent garbage does not disturb a call.
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { post(`{"jsonrpc":`, nil) })
	}
	ok := call(t, cs, "s", "create_ticket", map[string]any{"title": "still here"})
	wg.Wait()
	require.False(t, ok.IsError, text(ok))
	require.Equal(t, 1, b.count("create_ticket"))
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Wait: -time.Second}, "wait -1s is negative"},
		{Config{MaxArgsBytes: 1 << 30}, "max args bytes"},
		{Config{MaxSessionsPerToken: -1}, "max sessions per token -1: must be at least 1"},
		{Config{SessionIdle: -time.Second}, "session idle -1s is negative"},
		{Config{ResourceURL: "mcp.example.com/mcp"}, "give the absolute URL"},
		{Config{ResourceURL: "https://mcp.example.com/mcp?x=1"}, "no query"},
		{Config{AllowOrigins: []string{"app.example.com"}}, "give scheme://host[:port]"},
		{Config{AllowOrigins: []string{"https://app.example.com/page"}}, "give scheme://host[:port]"},
	} {
		_, err := New(nil, nil, nil, c.cfg)
		require.ErrorContains(t, err, c.want)
	}
}

func TestCheckListen(t *testing.T) {
	t.Parallel()
	tokens, err := auth.ParseTokens(strings.NewReader(strings.Repeat("a", 64) + " agent a"))
	require.NoError(t, err)
	for _, c := range []struct {
		addr   string
		tokens *auth.Tokens
		want   string // "" for served
	}{
		{"127.0.0.1:8081", nil, ""},
		{"[::1]:8081", nil, ""},
		{"localhost:8081", nil, ""},
		{"0.0.0.0:8081", nil, "give --tokens FILE"},
		{":8081", nil, "give --tokens FILE"},
		{"10.1.2.3:8081", nil, "or listen on 127.0.0.1"},
		{"0.0.0.0:8081", tokens, ""},
		{"8081", tokens, "use host:port"},
	} {
		err := CheckListen(c.addr, c.tokens)
		if c.want == "" {
			require.NoError(t, err, c.addr)
			continue
		}
		require.ErrorContains(t, err, c.want, c.addr)
		if c.tokens == nil && !strings.Contains(c.want, "host:port") {
			require.ErrorIs(t, err, ErrNoDoor)
		}
	}
}

// A tool without a schema is listed with a complete one: its key args
// typed, its volatile args named, other args allowed, the key args of an
// unsafe tool required.
func TestDefaultSchemaIsComplete(t *testing.T) {
	t.Parallel()
	var sch struct {
		Type                 string                    `json:"type"`
		AdditionalProperties bool                      `json:"additionalProperties"`
		Properties           map[string]map[string]any `json:"properties"`
		Required             []string                  `json:"required"`
	}
	info := intent.ToolInfo{Name: "send_email", Class: intent.ClassUnsafe, KeyArgs: []string{"to", "subject"}, VolatileArgs: []string{"body"}}
	require.NoError(t, json.Unmarshal(defaultSchema(info), &sch))
	require.Equal(t, "object", sch.Type)
	require.True(t, sch.AdditionalProperties, "other args allowed")
	require.ElementsMatch(t, []string{"to", "subject"}, sch.Required)
	for _, name := range []string{"to", "subject", "body"} {
		require.Contains(t, sch.Properties, name)
		require.NotEmpty(t, sch.Properties[name]["anyOf"], "%s is typed", name)
	}
}

// A browser page of another origin cannot call the endpoint (403), as the
// MCP transport spec asks against DNS rebinding: only the endpoint's own
// origin, an allowed one, or a request without Origin (not a browser's).
func TestForeignOriginsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{AllowOrigins: []string{"https://App.example.com"}})
	own := strings.TrimSuffix(b.http, HTTPPath)
	for origin, want := range map[string]int{
		"":                           http.StatusOK,
		own:                          http.StatusOK,
		"https://app.example.com":    http.StatusOK,
		"http://evil.example":        http.StatusForbidden,
		"http://attacker.test:8081":  http.StatusForbidden,
		"https://app.example.com:99": http.StatusForbidden,
		"null":                       http.StatusForbidden,
	} {
		for _, method := range []string{http.MethodPost, http.MethodGet} {
			req, err := http.NewRequest(method, b.http, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("MCP-Protocol-Version", "2025-11-25")
			if origin != "" {
				req.Header.Set("Origin", origin)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			_ = resp.Body.Close()
			if want == http.StatusForbidden || method == http.MethodPost {
				require.Equal(t, want, resp.StatusCode, "%s with Origin %q", method, origin)
			} else {
				require.NotEqual(t, http.StatusForbidden, resp.StatusCode, "%s with Origin %q", method, origin)
			}
		}
	}
}

// Sessions opened at once, far past the cap, are all served: each caller's
// least recently used idle sessions give way (run with -race).
func TestSessionsPastTheCapGiveWay(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxSessionsPerToken: 2, MaxSessions: 3})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	open := func() (int, string, error) {
		req, err := http.NewRequest(http.MethodPost, b.http, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), nil
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				code, sid, err := open()
				if err != nil || code != http.StatusOK || sid == "" {
					t.Errorf("a session past the cap answered %d (%v)", code, err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		b.gate.door.mu.Lock()
		defer b.gate.door.mu.Unlock()
		return len(b.gate.door.sessions) <= 2 && b.gate.door.total.opening == 0
	}, 30*time.Second, 10*time.Millisecond, "the sessions left are within the cap")
}
