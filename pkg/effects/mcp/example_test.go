package mcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/effects/mcp"
	"github.com/idemgate/idemgate/pkg/effects/toolsfile"
)

// An MCP server's tools served as tools of the file (mcp_upstreams), and a
// tool of the file's own that names one of them by hand. The file decides
// each tool's class: balance's readOnlyHint is the upstream's claim, and it
// is a read only because the file says so. The upstream here
// is an in-process server over streamable HTTP; it is on 127.0.0.1, which a
// url upstream reaches only when allow_private (or the worker's
// --webhook-allow) lists it.
func Example() {
	server := sdk.NewServer(&sdk.Implementation{Name: "payments", Version: "1"}, nil)
	type chargeArgs struct {
		Order string `json:"order"`
		Cents int    `json:"cents"`
	}
	sdk.AddTool(server, &sdk.Tool{Name: "charge", Description: "Charge an order."},
		func(_ context.Context, req *sdk.CallToolRequest, args chargeArgs) (*sdk.CallToolResult, any, error) {
			// A keyed upstream stores what it did under the key and answers
			// a repeat with it.
			key := req.Params.Meta[mcp.MetaKey]
			return nil, map[string]any{"charged": args.Cents, "ref": key}, nil
		})
	sdk.AddTool(server, &sdk.Tool{Name: "balance", Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *sdk.CallToolRequest, struct{}) (*sdk.CallToolResult, any, error) {
			return nil, map[string]any{"cents": 1250}, nil
		})
	hs := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return server }, nil))
	defer func() {
		for ss := range server.Sessions() {
			_ = ss.Close()
		}
		hs.Close()
	}()

	registry, err := toolsfile.Parse([]byte(`
mcp_upstreams:
  payments:
    url: ` + hs.URL + `
    allow_private: [127.0.0.1/32]
    prefix: pay_
    tools:
      charge: {key_args: [order], approval: required}
      balance: {class: read}
tools:
  charge_card:
    effect: mcp
    key_args: [order]
    mcp: {upstream: payments, tool: charge, timeout: 10s}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer registry.Close()
	fmt.Println(registry.Names())

	charge, _ := registry.Lookup("pay_charge")
	fmt.Println(charge.Kind, charge.Policy.Class, charge.KeySpec.KeyArgs, "approval:", charge.Policy.Approval)
	balance, _ := registry.Lookup("pay_balance")
	fmt.Println(balance.Policy.Class)

	own, _ := registry.Lookup("charge_card")
	out, err := own.Effect.Fire(context.Background(), effects.Call{
		Key: "charge_card.4f1c", Tool: "charge_card", Args: json.RawMessage(`{"order":"A-1","cents":1250}`),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	var result struct {
		StructuredContent map[string]any `json:"structuredContent"`
	}
	_ = json.Unmarshal(out.Result, &result)
	fmt.Println(result.StructuredContent, out.Invocations)
	// Output:
	// [charge_card pay_balance pay_charge]
	// mcp unsafe [order] approval: true
	// read
	// map[charged:1250 ref:charge_card.4f1c] 1
}
