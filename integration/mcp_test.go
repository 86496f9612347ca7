package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// The MCP server (bin/mcp) as MCP clients meet it: a stdio subprocess driven
// by the Go SDK's client, and streamable HTTP driven by the official
// TypeScript SDK's client.

func mcpTools(sink string) string {
	return fmt.Sprintf(`tools:
  create_ticket:
    effect: webhook
    description: Open a support ticket.
    schema:
      type: object
      properties: {title: {type: string}}
      required: [title]
      additionalProperties: false
    webhook: {url: %[1]s/tickets}
  get_order:
    effect: webhook
    class: read
    webhook: {url: %[1]s/orders}
`, sink)
}

// startMCP runs bin/mcp with args (and env added); it is killed when the
// test ends.
func startMCP(t *testing.T, name string, args, env []string) *proc {
	t.Helper()
	return launchProc(t, "mcp", name, args, env)
}

// stdioSession runs bin/mcp as the Go SDK client's stdio subprocess.
func stdioSession(t *testing.T, url string, args []string, env ...string) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(bin("mcp"), append([]string{"--nats-url", url}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "integration", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err, "bin/mcp log:\n%s", logs.String())
	t.Cleanup(func() {
		_ = cs.Close()
		if t.Failed() {
			t.Logf("bin/mcp log:\n%s", logs.String())
		}
	})
	return cs
}

func mcpCall(t *testing.T, cs *mcp.ClientSession, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	require.NoError(t, err)
	return res
}

func mcpText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// mcpOp is the io.idemgate/operation _meta of a result.
type mcpOp struct {
	Key      string `json:"key"`
	Status   string `json:"status"`
	Replayed bool   `json:"replayed"`
}

func opOf(t *testing.T, meta map[string]any) mcpOp {
	t.Helper()
	data, err := json.Marshal(meta["io.idemgate/operation"])
	require.NoError(t, err)
	var o mcpOp
	require.NoError(t, json.Unmarshal(data, &o))
	require.NotEmpty(t, o.Key, "no operation in %v", meta)
	return o
}

// A stdio client runs bin/mcp; its session comes from --session, then from
// IDEMGATE_SESSION in a second process (a restarted agent): the second call
// is a replay, and the webhook fired once.
func TestMCPStdio(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, mcpTools(hook.URL)))

	first := mcpCall(t, stdioSession(t, url, []string{"--session", "run-1"}), "create_ticket", map[string]any{"title": "printer on fire"})
	require.False(t, first.IsError, mcpText(first))
	require.False(t, opOf(t, first.Meta).Replayed)

	again := mcpCall(t, stdioSession(t, url, nil, "IDEMGATE_SESSION=run-1"), "create_ticket", map[string]any{"title": "printer on fire"})
	require.False(t, again.IsError, mcpText(again))
	require.True(t, opOf(t, again.Meta).Replayed)
	require.Contains(t, mcpText(again), "not repeated")
	require.Equal(t, 1, hook.count())
	require.Equal(t, opOf(t, first.Meta).Key, hook.all()[0].Key, "the webhook got the gate's key")

	bad := mcpCall(t, stdioSession(t, url, nil, "IDEMGATE_SESSION=run-1"), "create_ticket", map[string]any{"title": 7})
	require.True(t, bad.IsError)
	require.Equal(t, 1, hook.count())
}

// Malformed JSON-RPC on stdin is answered with a parse error and the server
// goes on serving.
func TestMCPStdioMalformedInput(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, mcpTools(hook.URL)))

	cmd := exec.Command(bin("mcp"), "--nats-url", url)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	logs := &syncBuffer{}
	cmd.Stderr = logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		t.Helper()
		select {
		case l, ok := <-lines:
			require.True(t, ok, "bin/mcp closed stdout; log:\n%s", logs.String())
			return l
		case <-time.After(20 * time.Second):
			t.Fatalf("no answer from bin/mcp; log:\n%s", logs.String())
			return ""
		}
	}
	write := func(s string) { _, err := io.WriteString(stdin, s+"\n"); require.NoError(t, err) }

	write(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	require.Contains(t, next(), `"protocolVersion":"2025-11-25"`)
	write(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	write(`{"jsonrpc": "2.0", "id": 2, "method": "tools/list"`)
	write(`[1, 2]`)
	write(`7`)
	write(`{}`)
	write(`{"jsonrpc":"2.0","id":4,"method":7}`)
	write(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"create_ticket","arguments":"nope"}}`)
	write(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"create_ticket","arguments":{"title":"after the garbage"}}}`)
	var answers []string
	for !strings.Contains(strings.Join(answers, "\n"), `"id":3`) {
		answers = append(answers, next())
	}
	joined := strings.Join(answers, "\n")
	require.Contains(t, joined, `"code":-32700`, "a parse error answers the garbage")
	require.Contains(t, joined, `"id":3`)
	require.Contains(t, joined, `io.idemgate/operation`, "the next call is served")
	require.Equal(t, 1, hook.count())
}

// mcpE2EDir returns the directory of clients/mcp-e2e (the official
// TypeScript SDK), installed on first use.
func mcpE2EDir(t *testing.T) string { return mcpE2E.setup(t) }

// The official TypeScript SDK client over streamable HTTP, with a bearer
// token as make run's: the call fires, the same call from a new MCP session
// is a replay whose first text item is still the JSON of its structured
// content, the tools carry their annotations, an unknown tool is an error.
func TestMCPTypeScriptSDKOverHTTP(t *testing.T) {
	t.Parallel()
	dir := mcpE2EDir(t)
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, mcpTools(hook.URL)))
	tokens := filepath.Join(t.TempDir(), "tokens")
	token := newToken(t, tokens, "agent", "demo", "ts")
	endpoint := startMCPHTTP(t, url, "--tokens", tokens)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "driver.mjs", endpoint, "run-9", "create_ticket", `{"title":"from TypeScript"}`)
	cmd.Env = append(os.Environ(), "IDEMGATE_TOKEN="+token)
	cmd.Dir = dir
	out, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	require.NoError(t, err, "driver: %s %s", out, stderr)
	var seen struct {
		Sessions []string `json:"sessions"`
		Tools    map[string]struct {
			Annotations map[string]any `json:"annotations"`
			Description string         `json:"description"`
		} `json:"tools"`
		First, Again struct {
			IsError           bool             `json:"isError"`
			Meta              map[string]any   `json:"_meta"`
			Content           []map[string]any `json:"content"`
			StructuredContent json.RawMessage  `json:"structuredContent"`
		}
		Unknown string `json:"unknown"`
	}
	require.NoError(t, json.Unmarshal(out, &seen), "driver output: %s", out)

	require.Len(t, seen.Sessions, 2)
	require.NotEqual(t, seen.Sessions[0], seen.Sessions[1], "two MCP sessions")
	require.False(t, seen.First.IsError)
	require.False(t, opOf(t, seen.First.Meta).Replayed)
	require.False(t, seen.Again.IsError)
	require.True(t, opOf(t, seen.Again.Meta).Replayed, "the new MCP session's call is a replay")
	require.Contains(t, fmt.Sprint(seen.Again.Content), "not repeated")
	require.JSONEq(t, string(seen.Again.StructuredContent), seen.Again.Content[0]["text"].(string), "a replay's first text item is the JSON of its structured content")
	require.Equal(t, 1, hook.count())

	require.Equal(t, true, seen.Tools["get_order"].Annotations["readOnlyHint"])
	require.Equal(t, true, seen.Tools["create_ticket"].Annotations["idempotentHint"])
	require.Equal(t, true, seen.Tools["create_ticket"].Annotations["openWorldHint"])
	require.Contains(t, seen.Tools["create_ticket"].Description, "Safe to retry")
	require.Contains(t, seen.Tools, "idemgate_status")
	require.Contains(t, seen.Unknown, "no_such_tool")
}

// Every answer with structured content has that content's JSON as its first
// text item, on a replay and a conflict as on a first run (a client parsing
// content[0].text must not fail only on replays); notes for the model come
// after it, and a conflict says what happened once.
func TestMCPAnswersLeadWithTheirJSON(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	hook := newSink(t, nil)
	startWorker(t, "w1", url, writeTools(t, fmt.Sprintf(`tools:
  set_status:
    effect: webhook
    key_args: [order_id]
    webhook: {url: %s/status}
`, hook.URL)))
	cs := stdioSession(t, url, []string{"--session", "run-1"})
	jsonFirst := func(res *mcp.CallToolResult) string {
		t.Helper()
		require.NotEmpty(t, res.Content)
		first, ok := res.Content[0].(*mcp.TextContent)
		require.True(t, ok, "content[0] is text")
		want, err := json.Marshal(res.StructuredContent)
		require.NoError(t, err)
		require.JSONEq(t, string(want), first.Text, "content[0].text is the JSON of structuredContent")
		return mcpText(&mcp.CallToolResult{Content: res.Content[1:]})
	}

	first := mcpCall(t, cs, "set_status", map[string]any{"order_id": "42", "status": "shipped"})
	require.False(t, first.IsError, mcpText(first))
	require.Contains(t, jsonFirst(first), "Completed: operation", "a first run's note")

	again := mcpCall(t, cs, "set_status", map[string]any{"order_id": "42", "status": "shipped"})
	require.True(t, opOf(t, again.Meta).Replayed)
	require.Contains(t, jsonFirst(again), "not repeated")

	conflict := mcpCall(t, cs, "set_status", map[string]any{"order_id": "42", "status": "cancelled"})
	require.False(t, conflict.IsError, "a conflict is an outcome, not a mistake to fix")
	note := jsonFirst(conflict)
	require.Contains(t, note, "Conflict: nothing was done")
	require.Equal(t, 1, strings.Count(note, "other arguments"), "the conflict is said once: %s", note)

	status := mcpCall(t, cs, "idemgate_status", map[string]any{"operation": opOf(t, first.Meta).Key})
	require.Contains(t, jsonFirst(status), "Completed")
	require.Equal(t, 1, hook.count())
}

// The MCP Inspector's strict schema check finds nothing to report on the
// demo tools, nor on a tool without a schema: every tool has a complete
// input schema (typed key args, the other args allowed).
func TestMCPInspectorStrictOnTheDemoTools(t *testing.T) {
	t.Parallel()
	dir := mcpE2EDir(t)
	url := jetStream(t)
	demo, err := os.ReadFile("../deployments/demo/tools.yaml")
	require.NoError(t, err)
	startWorker(t, "w1", url, writeTools(t, string(demo)+`
  notify:
    effect: noop
    key_args: [to]
    volatile_args: [note]
`))
	endpoint := startMCPHTTP(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "node_modules", ".bin", "mcp-inspector"), "--cli", endpoint,
		"--transport", "http", "--method", "tools/list", "--strict")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "HOME="+cmd.Dir)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("the Inspector --strict says: %s", stderr.String())
	require.NoError(t, err, "the Inspector --strict: %s", stderr.String())
	require.Contains(t, stdout.String(), "send_email", "the tools were listed")
	require.Contains(t, stdout.String(), "notify", "the tools were listed")
	require.NotRegexp(t, `(?i)warning|error`, stderr.String(), "nothing to report")
}
