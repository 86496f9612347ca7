package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

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
