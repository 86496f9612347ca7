package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// catalogTool is one tool of the catalogue `submit tools` prints.
func catalogTool(t *testing.T, url, name string) intent.ToolInfo {
	t.Helper()
	out := submit(t, url, "tools")
	require.Equal(t, 0, out.code, out.stderr)
	var cat intent.Catalog
	require.NoError(t, json.Unmarshal([]byte(out.stdout), &cat), out.stdout)
	for _, info := range cat.Tools {
		if info.Name == name {
			return info
		}
	}
	t.Fatalf("no tool %s in the catalogue: %s", name, out.stdout)
	return intent.ToolInfo{}
}

// retention on a tool expires its final records after that long, while the
// ledger keeps other tools' for its own TTL, and never expires an
// unresolved record; the catalogue reports each tool's retention, over NATS
// and HTTP.
func TestToolRetention(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	sink := startRealSink(t)
	tools := writeTools(t, fmt.Sprintf(`tools:
  brief: {effect: webhook, key_args: [n], retention: 2s, webhook: {url: %[1]s/brief}}
  kept: {effect: webhook, key_args: [n], webhook: {url: %[1]s/kept}}
  gated: {effect: webhook, key_args: [n], retention: 2s, approval: required, webhook: {url: %[1]s/gated}}
`, sink.url))
	// The answer cache keeps an answer for a minute: the tool's retention
	// must bound it too.
	startWorker(t, "w1", url, tools, "--dup-window", "1s", "--answer-cache", "1m")
	g := startGateway(t, url)

	require.EqualValues(t, 2, catalogTool(t, url, "brief").RetentionSeconds)
	require.EqualValues(t, 24*3600, catalogTool(t, url, "kept").RetentionSeconds, "the ledger's")
	r := g.do(t, http.MethodGet, "/v1/tools", agentA, "")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	var cat intent.Catalog
	require.NoError(t, json.Unmarshal([]byte(r.raw), &cat))
	got := map[string]int64{}
	for _, info := range cat.Tools {
		got[info.Name] = info.RetentionSeconds
	}
	require.Equal(t, map[string]int64{"brief": 2, "kept": 24 * 3600, "gated": 2}, got)

	brief := submit(t, url, "--tool", "brief", "--args", `{"n":1}`, "--wait", "30s")
	require.Equal(t, intent.StatusCompleted, brief.res.Status, brief.stdout+brief.stderr)
	kept := submit(t, url, "--tool", "kept", "--args", `{"n":1}`, "--wait", "30s")
	require.Equal(t, intent.StatusCompleted, kept.res.Status, kept.stdout+kept.stderr)
	parked := submit(t, url, "--tool", "gated", "--args", `{"n":1}`, "--wait", "30s")
	require.Equal(t, intent.StatusAwaitingApproval, parked.res.Status, parked.stdout+parked.stderr)
	again := submit(t, url, "--tool", "brief", "--args", `{"n":1}`, "--wait", "30s")
	require.True(t, again.res.Replayed, "within its retention a repeat is a replay: %s", again.stdout)

	until(t, "the brief tool's completed record expires", func() bool {
		return submit(t, url, "get", brief.res.Key).code == 1
	})
	for key, st := range map[string]string{kept.res.Key: "completed", parked.res.Key: "awaiting_approval"} {
		g := submit(t, url, "get", key)
		require.Equal(t, 0, g.code, "kept: %s %s", key, g.stderr)
		require.Contains(t, g.stdout, `"status": "`+st+`"`)
	}
	// Past its retention the operation is forgotten, by the ledger and by
	// the worker's answer cache: the same call runs again.
	after := submit(t, url, "--tool", "brief", "--args", `{"n":1}`, "--wait", "30s")
	require.Equal(t, intent.StatusCompleted, after.res.Status, after.stdout+after.stderr)
	require.False(t, after.res.Replayed, "fired again, not answered from a cache")
	require.Equal(t, 2, sink.firings(t, brief.res.Key))
	require.Equal(t, 0, sink.firings(t, parked.res.Key), "the parked operation never fired")
}

// weekEnd is the end of the 168h budget window holding now: windows start
// at multiples of the window since the Unix epoch.
func weekEnd(now time.Time) time.Time {
	w := int64(168 * 3600)
	return time.Unix((now.Unix()/w+1)*w, 0).UTC()
}

// An effect budget of 3 per session, kept by three workers together: 20
// distinct calls at once fire exactly 3, the others are answered
// budget_exceeded and never fired; replays never count; a restart of every
// worker keeps the count; another session has its own. Over HTTP the
// refusal is 429 with Retry-After, over MCP a tool error with the same
// fields; over_budget: approve parks the operation instead.
func TestEffectBudget(t *testing.T) {
	t.Parallel()
	url := jetStream(t)
	sink := startRealSink(t)
	tools := writeTools(t, fmt.Sprintf(`tools:
  capped:
    effect: webhook
    key_args: [n]
    budget: {per: session, max: 3, window: 168h}
    webhook: {url: %[1]s/capped}
  gated_cap:
    effect: webhook
    key_args: [n]
    budget: {per: tool, max: 1, window: 168h}
    over_budget: approve
    webhook: {url: %[1]s/gated}
`, sink.url))
	var workers []*proc
	for i := range 3 {
		workers = append(workers, startWorker(t, fmt.Sprintf("w%d", i+1), url, tools))
	}
	end := weekEnd(time.Now())
	require.Equal(t, &intent.Budget{Per: intent.BudgetPerSession, Max: 3, WindowSeconds: 168 * 3600, OverBudget: intent.OverBudgetRefuse},
		catalogTool(t, url, "capped").Budget)

	nc := connect(t, url)
	call := func(session string, n int) func(time.Duration) intent.Result {
		env := fmt.Sprintf(`{"tool":"capped","session":%q,"call_id":"n%d","args":{"n":%d}}`, session, n, n)
		return publishRaw(t, nc, "idem.intents.capped", []byte(env))
	}
	var waits []func(time.Duration) intent.Result
	for n := range 20 {
		waits = append(waits, call("run-1", n))
	}
	var fired []intent.Result
	refused := 0
	for _, wait := range waits {
		res := wait(time.Minute)
		switch res.Status {
		case intent.StatusCompleted:
			fired = append(fired, res)
		case intent.StatusRejected:
			require.Equal(t, intent.CodeBudgetExceeded, res.Error.Code, res.Error.Message)
			require.Equal(t, end, res.RetryAt.UTC(), "retry when the window ends")
			refused++
		default:
			t.Fatalf("answer %+v", res)
		}
	}
	require.Equal(t, 3, len(fired), "a budget of 3 across 3 workers")
	require.Equal(t, 17, refused)
	require.Equal(t, 3, sink.requests(t), "exactly 3 fired")

	// A replay of a counted operation is answered from its record, and a
	// refused one is refused again: neither counts.
	replay := call("run-1", mustN(t, fired[0]))(time.Minute)
	require.Equal(t, intent.StatusCompleted, replay.Status)
	require.True(t, replay.Replayed)

	// Every worker restarts: the count is in the ledger.
	for _, w := range workers {
		w.kill()
	}
	for i := range 3 {
		startWorker(t, fmt.Sprintf("w%d", i+4), url, tools)
	}
	again := call("run-1", 100)(time.Minute)
	require.Equal(t, intent.StatusRejected, again.Status, "%+v", again)
	require.Equal(t, intent.CodeBudgetExceeded, again.Error.Code)
	for _, res := range fired {
		replay := call("run-1", mustN(t, res))(time.Minute)
		require.True(t, replay.Replayed, "a counted operation replays after the restart: %+v", replay)
	}
	other := call("run-2", 100)(time.Minute)
	require.Equal(t, intent.StatusCompleted, other.Status, "another session has its own count: %+v", other)
	require.Equal(t, 4, sink.requests(t))

	// MCP: the same session's next distinct call is an outcome (not a tool
	// error, which a framework would answer with "fix your arguments")
	// carrying the code and retry_at.
	cs := stdioSession(t, url, []string{"--session", "run-1"})
	res := mcpCall(t, cs, "capped", map[string]any{"n": 200})
	require.False(t, res.IsError, mcpText(res))
	require.Contains(t, mcpText(res), "budget_exceeded")
	data, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	var sc struct {
		Error   intent.Error `json:"error"`
		RetryAt time.Time    `json:"retry_at"`
	}
	require.NoError(t, json.Unmarshal(data, &sc), string(data))
	require.Equal(t, intent.CodeBudgetExceeded, sc.Error.Code, string(data))
	require.Equal(t, end, sc.RetryAt.UTC())

	// HTTP: a namespace's session has its own count; the fourth distinct
	// call is 429 with Retry-After until the window ends.
	g := startGateway(t, url)
	for n := range 3 {
		r := g.call(t, agentA, "capped", fmt.Sprintf(`{"n":%d}`, n))
		require.Equal(t, http.StatusOK, r.status, r.raw)
	}
	r := g.call(t, agentA, "capped", `{"n":3}`)
	requireProblem(t, r, http.StatusTooManyRequests, intent.CodeBudgetExceeded)
	after, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err, r.header)
	require.InDelta(t, time.Until(end).Seconds(), after, 120, "Retry-After: until the window ends")
	answer := r.answer(t)
	require.Equal(t, end, answer.RetryAt.UTC())
	require.Equal(t, 7, sink.requests(t))

	// over_budget: approve: the operation over the budget waits for an
	// operator, and fires once approved.
	first := submit(t, url, "--tool", "gated_cap", "--args", `{"n":1}`, "--wait", "30s")
	require.Equal(t, intent.StatusCompleted, first.res.Status, first.stdout+first.stderr)
	parked := submit(t, url, "--tool", "gated_cap", "--args", `{"n":2}`, "--wait", "30s")
	require.Equal(t, intent.StatusAwaitingApproval, parked.res.Status, parked.stdout+parked.stderr)
	require.Equal(t, 8, sink.requests(t), "parked, not fired")
	approved := submit(t, url, "approve", parked.res.Key, "--fingerprint", parked.res.Fingerprint, "--by", "ops")
	require.Equal(t, intent.StatusCompleted, approved.res.Status, approved.stdout+approved.stderr)
	require.Equal(t, 9, sink.requests(t))
}

// mustN is the n argument of a capped call, which its call id names.
func mustN(t *testing.T, res intent.Result) int {
	t.Helper()
	var n int
	_, err := fmt.Sscanf(res.CallID, "n%d", &n)
	require.NoError(t, err, "call id %q", res.CallID)
	return n
}
