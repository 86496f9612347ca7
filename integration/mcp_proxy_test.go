package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// Proxy mode: idemgate in front of a third-party MCP server. The upstream
// is this test binary started again as a stdio MCP server (by the worker's
// mcp effect), with a counting side-effect tool: charge appends one line to
// a file per firing, and blocks while a hold file exists.

// upstreamEnv names the directory of the upstream's files; set, the test
// binary is the upstream.
const upstreamEnv = "IDEMGATE_TEST_UPSTREAM"

func init() {
	if dir := os.Getenv(upstreamEnv); dir != "" {
		os.Exit(runUpstream(dir))
	}
}

func runUpstream(dir string) int {
	appendLine := func(name, line string) {
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, line)
			_ = f.Close()
		}
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "1"}, nil)
	obj := map[string]any{"type": "object", "properties": map[string]any{"order": map[string]any{"type": "string"}}, "required": []string{"order"}}
	srv.AddTool(&mcp.Tool{Name: "charge", Description: "Charge the card of an order.", InputSchema: obj}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		key, _ := req.Params.Meta["io.idemgate/key"].(string)
		appendLine("started", fmt.Sprintf("%d %s", os.Getpid(), key))
		for {
			if _, err := os.Stat(filepath.Join(dir, "hold")); errors.Is(err, os.ErrNotExist) {
				break
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		appendLine("charges", key)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "charged " + string(req.Params.Arguments)}}}, nil
	})
	srv.AddTool(&mcp.Tool{Name: "balance", InputSchema: map[string]any{"type": "object"}, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		appendLine("balances", "read")
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "42.00"}}}, nil
	})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := srv.Run(ctx, &mcp.StdioTransport{}); err != nil && ctx.Err() == nil {
		return 1
	}
	return 0
}

// fileLines is the non-empty lines of one of the upstream's files.
func fileLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	return lines(string(data))
}

type proxyBundle struct {
	dir, url, endpoint string
}

// startProxy runs a worker whose tools file lists the upstream under
// mcp_upstreams (the worker starts it), and bin/mcp in proxy mode over HTTP.
func startProxy(t *testing.T) proxyBundle {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	b := proxyBundle{dir: t.TempDir(), url: jetStream(t)}
	tools := writeTools(t, fmt.Sprintf(`mcp_upstreams:
  payments:
    command: [%q]
    tools:
      charge: {key_args: [order], lease: 5s}
      balance: {class: read}
`, self))
	p := launchWorker(t, "w1", []string{"--tools", tools, "--holder", "w1", "--log-level", "debug", "--nats-url", b.url}, []string{upstreamEnv + "=" + b.dir})
	p.waitLog(t, "worker consuming", 30*time.Second)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	m := startMCP(t, "proxy", []string{"--nats-url", b.url, "--http", addr, "--upstream", self}, nil)
	m.waitLog(t, "mcp serving", 30*time.Second)
	require.Contains(t, m.log.String(), `"served":["balance","charge"]`)
	b.endpoint = "http://" + addr + "/mcp"
	return b
}

func (b proxyBundle) session(t *testing.T) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.endpoint, HTTPClient: &http.Client{}, MaxRetries: -1}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func charge(ctx context.Context, cs *mcp.ClientSession, order string) (*mcp.CallToolResult, error) {
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: "charge", Arguments: map[string]any{"order": order}, Meta: mcp.Meta{"io.idemgate/session": "run-1"}})
}

// 50 identical calls at once, from 3 MCP sessions: the upstream tool runs
// once, and every call gets its result; a read passes through each time.
func TestMCPProxyConcurrentCallsFireOnce(t *testing.T) {
	t.Parallel()
	b := startProxy(t)
	sessions := []*mcp.ClientSession{b.session(t), b.session(t), b.session(t)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	results := make([]*mcp.CallToolResult, 50)
	errs := make([]error, 50)
	for i := range results {
		wg.Go(func() { results[i], errs[i] = charge(ctx, sessions[i%3], "A-1") })
	}
	wg.Wait()
	replayed := 0
	for i, res := range results {
		require.NoError(t, errs[i])
		require.False(t, res.IsError, mcpText(res))
		require.Contains(t, mcpText(res), `charged {"order":"A-1"}`)
		if opOf(t, res.Meta).Replayed {
			replayed++
		}
	}
	require.Equal(t, 49, replayed)
	charges := fileLines(t, filepath.Join(b.dir, "charges"))
	require.Len(t, charges, 1, "the upstream tool ran once")
	require.Equal(t, opOf(t, results[0].Meta).Key, charges[0], "with the key in _meta")

	for range 3 {
		res, err := sessions[0].CallTool(ctx, &mcp.CallToolParams{Name: "balance", Arguments: map[string]any{}})
		require.NoError(t, err)
		require.Contains(t, mcpText(res), "42.00")
	}
	require.Len(t, fileLines(t, filepath.Join(b.dir, "balances")), 3, "a read runs every time")
}

// The upstream is killed while the tool runs: the worker starts it again
// and retries under the same key; the call completes, the tool ran once.
func TestMCPProxyUpstreamKilledMidCall(t *testing.T) {
	t.Parallel()
	b := startProxy(t)
	hold := filepath.Join(b.dir, "hold")
	require.NoError(t, os.WriteFile(hold, nil, 0o644))
	cs := b.session(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan answer, 1)
	go func() { r, err := charge(ctx, cs, "B-2"); done <- answer{r, err} }()

	started := filepath.Join(b.dir, "started")
	require.Eventually(t, func() bool { return len(fileLines(t, started)) == 1 }, 30*time.Second, 10*time.Millisecond)
	first := strings.Fields(fileLines(t, started)[0])
	pid, err := strconv.Atoi(first[0])
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return len(fileLines(t, started)) == 2 }, 30*time.Second, 10*time.Millisecond, "the tool was not called again")
	require.NoError(t, os.Remove(hold))

	a := <-done
	require.NoError(t, a.err)
	require.False(t, a.res.IsError, mcpText(a.res))
	second := strings.Fields(fileLines(t, started)[1])
	require.NotEqual(t, first[0], second[0], "a new upstream process")
	require.Equal(t, first[1], second[1], "the retry carries the same key")
	require.Equal(t, []string{first[1]}, fileLines(t, filepath.Join(b.dir, "charges")), "completed once")

	again, err := charge(ctx, b.session(t), "B-2")
	require.NoError(t, err)
	require.True(t, opOf(t, again.Meta).Replayed)
	require.Equal(t, a.res.Content[0], again.Content[0], "a replay leads with the upstream's own content")
	note, ok := again.Content[len(again.Content)-1].(*mcp.TextContent)
	require.True(t, ok)
	require.Contains(t, note.Text, "not repeated", "the note comes last")
	require.Len(t, fileLines(t, filepath.Join(b.dir, "charges")), 1)
}

// submit key --tools reads a tools file whose mcp url upstream is private
// under the same rule as the workers: refused, naming the fix, until
// --webhook-allow (or the upstream's allow_private) lets it be listed.
func TestSubmitKeyToolsFileWithPrivateURLUpstream(t *testing.T) {
	t.Parallel()
	srv := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "charge", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	})
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(up.Close)
	tools := writeTools(t, fmt.Sprintf(`mcp_upstreams:
  payments:
    url: %s
    tools:
      charge: {key_args: [order]}
`, up.URL))
	key := func(extra ...string) submitted {
		args := append([]string{"key", "--tool", "charge", "--args", `{"order":"o-1","note":"x"}`, "--tools", tools, "-q"}, extra...)
		return runClient(t, exec.Command(bin("submit"), args...))
	}
	refused := key()
	require.NotZero(t, refused.code)
	require.Contains(t, refused.stderr, "--webhook-allow 127.0.0.1/32")
	allowed := key("--webhook-allow", "127.0.0.0/8")
	require.Zero(t, allowed.code, allowed.stderr)
	other := runClient(t, exec.Command(bin("submit"), "key", "--tool", "charge", "--args", `{"order":"o-1","note":"y"}`, "--tools", tools, "-q", "--webhook-allow", "127.0.0.0/8"))
	require.Equal(t, strings.TrimSpace(allowed.stdout), strings.TrimSpace(other.stdout), "key_args of the upstream's entry apply")
	require.Contains(t, key("--webhook-allow", "nonsense").stderr, "--webhook-allow")
}
