package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The HTTP and the MCP front doors check an intent by the same rules
// (client.Prepare: intent.Build, the tool's schema; CheckKeyArgs): the
// same bad arguments are refused at either door, naming the same fault,
// and neither publishes them.
func TestDoorsRefuseTheSameInput(t *testing.T) {
	t.Parallel()
	skipShort(t, "the MCP server and the gateway")
	e := newHTTPEnv(t)
	cs := stdioSession(t, e.nats, []string{"--session", "doors"})

	deep := strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 40)
	for _, c := range []struct {
		name, args string
		fault      string // what both answers name
	}{
		{"a key arg of an unsafe tool missing", `{"to":"ada@example.com"}`, `"subject"`}, // both, by the tool's schema: missing properties: ["subject"]
		{"a repeated member", `{"to":"ada@example.com","subject":"hi","to":"bob@example.com"}`, `member name "to" repeated`},
		{"a number beyond 2^53", `{"to":"ada@example.com","subject":"hi","n":9007199254740993}`, `is beyond ±2^53`},
		{"a lone surrogate", `{"to":"ada@example.com","subject":"\ud800"}`, `lone surrogate escape`},
		{"nested too deep", `{"to":"ada@example.com","subject":"hi","x":` + deep + `}`, `nesting deeper than 32`},
		{"not an object", `["ada@example.com"]`, `JSON object`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.gw.call(t, agentA, "send_email", c.args)
			requireProblem(t, r, http.StatusBadRequest, intent.CodeInvalidIntent)
			require.Contains(t, r.str("detail"), c.fault, r.raw)

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "send_email", Arguments: json.RawMessage(c.args)})
			require.NoError(t, err)
			require.True(t, res.IsError, mcpText(res))
			require.Contains(t, mcpText(res), "Invalid arguments for send_email", "refused at the door")
			require.Contains(t, mcpText(res), c.fault)
		})
	}

	// Neither door published any of them.
	nc, err := nats.Connect(e.nats)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstreamFor(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	names, err := intent.NewNames("")
	require.NoError(t, err)
	st, err := js.Stream(ctx, names.Stream)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.Zero(t, info.State.LastSeq, "no intent reached the stream")
	require.Zero(t, e.sink.count())
}
