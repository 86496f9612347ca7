package mcp_test

import (
	"context"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/mcp"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

func TestMCPProbe(t *testing.T) {
	t.Parallel()
	u := newTestUpstream(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	u.srv.AddTool(&sdk.Tool{Name: "find_charge", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		key, _ := req.Params.Meta[mcp.MetaKey].(string)
		switch key {
		case "charged":
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "found"}}, StructuredContent: map[string]any{"verdict": "done", "result": map[string]any{"charge": 7}}}, nil
		case "new":
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: `{"verdict": "not_done"}`}}}, nil
		case "hang":
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "cannot tell"}}}, nil
	})
	reg, err := toolsfile.Parse([]byte(`tools:
  charge:
    effect: mcp
    key_args: [order]
    mcp: {url: `+u.http.URL+`, tool: charge}
    probe: {tool: find_charge, timeout: 1m}
  charge_slow:
    effect: mcp
    key_args: [order]
    mcp: {url: `+u.http.URL+`, tool: charge}
    probe: {tool: find_charge, timeout: 500ms}
`), allowLoopback)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	tool, _ := reg.Lookup("charge")
	require.NotNil(t, tool.Prober)
	for key, want := range map[string]effects.Verdict{"charged": effects.VerdictDone, "new": effects.VerdictNotDone, "other": effects.VerdictUnknown} {
		ans, err := tool.Prober.Probe(context.Background(), effects.Call{Key: key, Tool: "charge"})
		require.NoError(t, err, key)
		require.Equal(t, want, ans.Verdict, key)
		require.Contains(t, ans.Evidence.Request, "tool find_charge")
		if want == effects.VerdictDone {
			require.JSONEq(t, `{"charge":7}`, string(ans.Result))
		}
	}
	n, _ := u.charges()
	require.Zero(t, n, "a probe fires nothing")
	slow, _ := reg.Lookup("charge_slow")
	ans, err := slow.Prober.Probe(context.Background(), effects.Call{Key: "hang"})
	require.ErrorIs(t, err, effects.ErrProbe)
	require.Equal(t, "no answer within 500ms", ans.Evidence.Status)
}
