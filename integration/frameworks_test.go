package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The framework recipes (clients/frameworks, docs/frameworks.md) as a new
// user runs them after make run: the demo tools on a real worker, cmd/sink
// counting firings, the MCP server and the HTTP front door behind tokens.
// The Vercel AI SDK, OpenAI Agents JS and LangGraph JS, installed from npm,
// each drive idemgate's tools with their own mock model; the Python wrapper
// runs with plain Python. Each asserts that the same call twice fires once
// and says it was replayed, that a conflict reaches the model as idemgate
// wrote it and leads to no second firing, that an approval is waited for,
// and that a run (a thread) is one session.

var frameworks = &nodePackage{path: "clients/frameworks", what: "framework recipes", steps: [][]string{
	// The recipes install @idemgate/client from ../ts as a copy (install-links), as a user gets it.
	{"npm", "ci", "--no-audit", "--no-fund"},
}}

// frameworkEnv starts the stack of make run and returns the environment the
// recipes' tests read.
func frameworkEnv(t *testing.T) []string {
	t.Helper()
	url := jetStream(t)
	sink := startRealSink(t)
	demo, err := os.ReadFile("../deployments/demo/tools.yaml")
	require.NoError(t, err)
	tools := strings.ReplaceAll(string(demo), "127.0.0.1:8787", strings.TrimPrefix(sink.url, "http://"))
	startWorker(t, "w1", url, writeTools(t, tools))
	gw := startGateway(t, url)
	endpoint := startMCPHTTP(t, url, "--tokens", gw.file)
	return []string{
		"IDEMGATE_MCP_URL=" + endpoint,
		"IDEMGATE_URL=" + gw.url, // through the proxy that checks every answer against the OpenAPI document
		"IDEMGATE_TOKEN=" + gw.tokens[agentA],
		"IDEMGATE_OPERATOR_TOKEN=" + gw.tokens[operator],
		"IDEMGATE_SINK_LOG=" + sink.log,
		"OPENAI_AGENTS_DISABLE_TRACING=1",
	}
}

func TestFrameworkRecipes(t *testing.T) {
	t.Parallel()
	tsClient(t) // built first: the recipes install its dist
	dir := frameworks.setup(t)
	env := frameworkEnv(t)

	t.Run("typescript", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1", "test/connection.test.mjs", "test/ai-sdk.test.mjs", "test/openai-agents.test.mjs", "test/langgraph.test.mjs")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "node --test in clients/frameworks:\n%s", out)
		require.Contains(t, string(out), "# fail 0", string(out))
		require.Contains(t, string(out), "# pass 14", "every recipe test ran:\n%s", out)
	})

	t.Run("python", func(t *testing.T) {
		python := python3(t)
		pyClient, err := filepath.Abs(filepath.Join("..", "clients", "python"))
		require.NoError(t, err)
		out, err := runPython(t, filepath.Join(dir, "python"), append(env, "PYTHONPATH="+pyClient+string(os.PathListSeparator)+"."),
			python, "-m", "unittest", "-v", "test_wrapper")
		require.NoError(t, err, "python3 -m unittest test_wrapper:\n%s", out)
		require.Contains(t, out, "Ran 5 tests", out)
		require.Contains(t, out, "\nOK", out)
	})
}
