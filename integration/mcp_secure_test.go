package integration

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/client"
	"github.com/idemgate/idemgate/pkg/intent"
)

// The MCP server as the shipped "mcp" NATS user (TLS, password, its own
// inbox) asks the person at the client to approve a tool of approver: user
// and publishes their decision: an accepted approval fires the operation
// once and the call answers its result, a declined one denies it. The user
// may publish those two decisions and no other.
func TestSecureMCPUserApproval(t *testing.T) {
	t.Parallel()
	s := startSecure(t, "users.conf")
	hook, payouts := newSink(t, nil), newSink(t, nil)
	tools := writeTools(t, fmt.Sprintf(`tools:
  refund:
    effect: webhook
    key_args: [order_id]
    approval: required
    approver: user
    webhook: {url: %s/refunds}
  payout:
    effect: webhook
    key_args: [order_id]
    approval: required
    webhook: {url: %s/payouts}
`, hook.URL, payouts.URL))
	w := launchWorker(t, "worker", []string{
		"--tools", tools, "--holder", "worker", "--log-level", "debug", "--webhook-allow", "127.0.0.0/8",
		"--nats-url", s.url, "--nats-tls-ca", s.ca.certPEM, "--nats-user", "worker", "--nats-inbox-prefix", "_INBOX.worker",
	}, []string{"IDEMGATE_NATS_PASSWORD=" + s.password(t, "worker")})
	w.waitLog(t, "worker consuming", 20*time.Second)

	file := filepath.Join(t.TempDir(), "tokens")
	token := newToken(t, file, "agent", "team-a", "a")
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := startMCP(t, "mcp", []string{
		"--http", addr, "--tokens", file,
		"--nats-url", s.url, "--nats-tls-ca", s.ca.certPEM, "--nats-user", "mcp", "--nats-inbox-prefix", "_INBOX.mcp",
	}, []string{"IDEMGATE_NATS_PASSWORD=" + s.password(t, "mcp")})
	p.waitLog(t, "mcp serving", 30*time.Second)
	endpoint := "http://" + addr + "/mcp"

	ctx := t.Context()
	// answering connects a client of protocol version (the SDK's newest
	// when "") that answers every approval question with action.
	answering := func(version, action string) *mcp.ClientSession {
		t.Helper()
		c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, &mcp.ClientOptions{
			ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				return &mcp.ElicitResult{Action: action}, nil
			},
		})
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: bearer(token)}, MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: version})
		require.NoError(t, err)
		t.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	call := func(cs *mcp.ClientSession, tool, order string) (mcpOp, string) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"order_id": order},
			Meta: mcp.Meta{"io.idemgate/session": "run-1"}})
		require.NoError(t, err)
		require.False(t, res.IsError, mcpText(res))
		var o mcpOp
		if _, ok := res.Meta["io.idemgate/operation"]; ok {
			o = opOf(t, res.Meta)
		}
		return o, mcpText(res)
	}
	refund := func(cs *mcp.ClientSession, order string) (mcpOp, string) {
		t.Helper()
		return call(cs, "refund", order)
	}
	mc := s.connect(t, "mcp")
	cl, err := client.New(mc.Conn)
	require.NoError(t, err)
	recorded := func(key string) intent.Status {
		t.Helper()
		rec, err := cl.Get(ctx, key)
		require.NoError(t, err)
		return rec.Status
	}

	// A client of 2026-07-28 answers the input request: accepted.
	accept := answering("", "accept")
	require.Equal(t, "2026-07-28", accept.InitializeResult().ProtocolVersion)
	got, text := refund(accept, "o-1")
	require.Equal(t, "completed", got.Status, "the approval is published and the call answered with the firing's result "+
		"(NATS refused: %v): %s", s.violations(), text)
	require.Equal(t, 1, hook.count(), "the approved operation fired once")
	require.Equal(t, intent.StatusCompleted, recorded(got.Key))

	// A client of 2025-11-25 answers the elicitation: declined.
	decline := answering("2025-11-25", "decline")
	got, text = refund(decline, "o-2")
	require.Equal(t, "denied", got.Status, "the denial is published and the call answered with it "+
		"(NATS refused: %v): %s", s.violations(), text)
	require.Equal(t, intent.StatusDenied, recorded(got.Key))
	require.Equal(t, 1, hook.count(), "the declined operation never fired")
	require.Empty(t, s.violations(), "the MCP server and the worker were refused nothing")

	// Resolving or probing an operation, writing the ledger and the
	// workers' forget subject stay refused to the MCP server's user.
	js, err := jetstream.New(mc.Conn)
	require.NoError(t, err)
	for _, subject := range []string{
		"idem.control.resolve", "idem.control.probe", "idem.cache.forget",
		"$KV.IDEM_LEDGER." + storedKey(t, js, got.Key),
	} {
		refused(t, mc, subject, func(ctx context.Context) error {
			_, err := js.Publish(ctx, subject, []byte(`{"key":"`+got.Key+`"}`))
			return err
		})
	}
	require.Equal(t, intent.StatusDenied, recorded(got.Key), "nothing the refused publishes named changed")

	// An operator-approved tool's operation: the MCP server's user may not
	// decide it, neither on an operator's subjects (NATS refuses them) nor
	// on the user's (the worker refuses them).
	parked, text := call(accept, "payout", "o-3")
	require.Equal(t, "awaiting_approval", parked.Status, text)
	for _, subject := range []string{"idem.control.approve", "idem.control.deny"} {
		refused(t, mc, subject, func(ctx context.Context) error {
			_, err := js.Publish(ctx, subject, []byte(`{"key":"`+parked.Key+`","by":"mcp"}`))
			return err
		})
	}
	for _, op := range []string{intent.ControlUserApprove, intent.ControlUserDeny} {
		res, err := cl.Decide(ctx, op, intent.Control{Key: parked.Key, By: "the user at agent"})
		require.NoError(t, err, "%s is published (NATS refused: %v)", op, s.violations())
		require.Equal(t, intent.StatusRejected, res.Status, "%s of an operator-approved operation is refused", op)
		require.Equal(t, intent.CodeInvalidIntent, res.Error.Code, res.Error.Message)
		require.Contains(t, res.Error.Message, "approved by an operator")
	}
	require.Equal(t, intent.StatusAwaitingApproval, recorded(parked.Key), "no decision of the MCP server's user was recorded")
	require.Zero(t, payouts.count(), "the operator-approved operation never fired")
}
