package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// rerunTools are two webhook tools with a re-run policy each: retry_send
// runs a failed operation again (its sink fails each key's first request
// with a 422, a permanent failure), once_send refuses a repeat of a
// completed one.
func rerunTools(t *testing.T, failing, plain string) string {
	t.Helper()
	return writeTools(t, fmt.Sprintf(`tools:
  retry_send:
    effect: webhook
    key_args: [to]
    on_failure: retry
    webhook: {url: %s/retry}
  once_send:
    effect: webhook
    key_args: [to]
    on_complete: reject
    webhook: {url: %s/once}
`, failing, plain))
}

// requestsOf counts the requests of key the sink received, whatever it
// answered.
func (s *realSink) requestsOf(t *testing.T, key string) int {
	t.Helper()
	data, err := os.ReadFile(s.log)
	require.NoError(t, err)
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e struct{ Key string }
		require.NoError(t, json.Unmarshal(sc.Bytes(), &e), sc.Text())
		if e.Key == key {
			n++
		}
	}
	return n
}

// rerunDoor is one front door's way to call a tool: it returns the answer
// (for HTTP the problem's, for MCP the one its structured content and
// _meta report) and checks the door's own form of it.
type rerunDoor struct {
	name string
	call func(t *testing.T, tool, to string) intent.Result
}

// The re-run policies over the three doors, each against cmd/sink: a
// failure of an on_failure: retry tool is never replayed — the next call
// fires again, once, and its success is then replayed; a repeat of an
// on_complete: reject tool is answered already_done with what ran, in each
// door's form (the submit CLI's answer, HTTP 409 with a problem, an MCP tool
// error with structured content), and never fired. The catalogue, the HTTP
// tool list and the MCP tool descriptions report the policies.
func TestRerunPolicies(t *testing.T) {
	t.Parallel()
	skipShort(t, "the re-run policies over three doors")
	url := jetStream(t)
	failing := startRealSink(t, "--fail-first", "422")
	plain := startRealSink(t)
	startWorker(t, "w1", url, rerunTools(t, failing.url, plain.url))
	gw := startGateway(t, url)
	cs := stdioSession(t, url, []string{"--session", "rerun"})

	cat := submit(t, url, "tools")
	require.Equal(t, 0, cat.code, cat.stderr)
	require.Contains(t, cat.stdout, `"on_failure": "retry"`)
	require.Contains(t, cat.stdout, `"on_complete": "reject"`)
	listed := gw.do(t, http.MethodGet, "/v1/tools", agentA, "")
	require.Equal(t, http.StatusOK, listed.status, listed.raw)
	require.Contains(t, listed.raw, `"on_failure":"retry"`)
	require.Contains(t, listed.raw, `"on_complete":"reject"`)
	tools, err := cs.ListTools(t.Context(), nil)
	require.NoError(t, err)
	described := map[string]string{}
	for _, tl := range tools.Tools {
		described[tl.Name] = tl.Description
	}
	require.Contains(t, described["once_send"], "already_done")
	require.Contains(t, described["retry_send"], "runs again")

	doors := []rerunDoor{
		{"nats", func(t *testing.T, tool, to string) intent.Result {
			s := submit(t, url, "--tool", tool, "--args", fmt.Sprintf(`{"to":%q}`, to), "--wait", "60s")
			require.NotEmpty(t, s.res.Key, "%s\n%s", s.stdout, s.stderr)
			return s.res
		}},
		{"http", func(t *testing.T, tool, to string) intent.Result {
			r := gw.call(t, agentA, tool, fmt.Sprintf(`{"to":%q}`, to))
			res := r.answer(t)
			switch res.Status {
			case intent.StatusCompleted:
				require.Equal(t, http.StatusOK, r.status, r.raw)
			case intent.StatusFailed:
				requireProblem(t, r, http.StatusBadGateway, intent.CodeEffectFailed)
			case intent.StatusAlreadyDone:
				requireProblem(t, r, http.StatusConflict, intent.CodeAlreadyDone)
				require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
				require.Equal(t, "/v1/operations/"+res.Key, r.header.Get("Location"))
			}
			return res
		}},
		{"mcp", func(t *testing.T, tool, to string) intent.Result {
			out := mcpCall(t, cs, tool, map[string]any{"to": to})
			op := opOf(t, out.Meta)
			res := intent.Result{Key: op.Key, Status: intent.Status(op.Status), Replayed: op.Replayed}
			require.Equal(t, res.Status == intent.StatusFailed, out.IsError, "only a failure is a tool error (docs/mcp.md, Answers): %s", mcpText(out))
			if res.Status == intent.StatusAlreadyDone {
				var sc struct {
					Status string          `json:"status"`
					Result json.RawMessage `json:"result"`
					Error  intent.Error    `json:"error"`
				}
				data, err := json.Marshal(out.StructuredContent)
				require.NoError(t, err)
				require.NoError(t, json.Unmarshal(data, &sc), string(data))
				require.Equal(t, intent.CodeAlreadyDone, sc.Error.Code)
				res.Result, res.Error = sc.Result, &sc.Error
				require.Contains(t, mcpText(out), "Already done")
			}
			return res
		}},
	}
	for _, d := range doors {
		t.Run(d.name, func(t *testing.T) {
			t.Run("on_failure retry", func(t *testing.T) {
				to := "retry-" + d.name
				failed := d.call(t, "retry_send", to)
				require.Equal(t, intent.StatusFailed, failed.Status)
				key := failed.Key
				require.Equal(t, 1, failing.requestsOf(t, key))
				require.Equal(t, 0, failing.firings(t, key))

				retried := d.call(t, "retry_send", to)
				require.Equal(t, intent.StatusCompleted, retried.Status, "the next call runs the failed operation again")
				require.False(t, retried.Replayed)
				require.Equal(t, key, retried.Key)
				require.Equal(t, 1, failing.firings(t, key))

				replayed := d.call(t, "retry_send", to)
				require.Equal(t, intent.StatusCompleted, replayed.Status)
				require.True(t, replayed.Replayed, "a success is replayed")
				require.Equal(t, 2, failing.requestsOf(t, key), "fired exactly once more")
			})
			t.Run("on_complete reject", func(t *testing.T) {
				to := "once-" + d.name
				ran := d.call(t, "once_send", to)
				require.Equal(t, intent.StatusCompleted, ran.Status)
				require.False(t, ran.Replayed)
				key := ran.Key
				require.Equal(t, 1, plain.firings(t, key))

				for range 2 {
					repeat := d.call(t, "once_send", to)
					require.Equal(t, intent.StatusAlreadyDone, repeat.Status)
					require.Equal(t, key, repeat.Key)
					require.True(t, repeat.Replayed)
					require.NotNil(t, repeat.Error)
					require.Equal(t, intent.CodeAlreadyDone, repeat.Error.Code)
					var ranResult struct{ Accepted bool }
					require.NoError(t, json.Unmarshal(repeat.Result, &ranResult), "it carries what ran: %s", repeat.Result)
					require.True(t, ranResult.Accepted, "it carries what ran: %s", repeat.Result)
				}
				require.Equal(t, 1, plain.requestsOf(t, key), "a rejected repeat never fires")
			})
		})
	}
}
