package mcpgate

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/hint"
	"github.com/idemgate/idemgate/internal/natstest"
	"github.com/idemgate/idemgate/pkg/intent"
)

func TestFirstCallFiresAndARetryReplays(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			args := map[string]any{"to": "ada@example.com", "subject": "Your order shipped", "body": "Hello"}
			first := call(t, b.connect(t, tr, nil, nil), "run-7", "send_email", args)
			require.False(t, first.IsError, text(first))
			o := op(t, first)
			require.Equal(t, intent.StatusCompleted, o.Status)
			require.False(t, o.Replayed)
			require.Equal(t, 1, o.Attempts)
			require.True(t, strings.HasPrefix(o.Key, "send_email."), o.Key)
			require.EqualValues(t, 1, structuredOf(t, first)["n"])
			require.Contains(t, jsonFirst(t, first), "Completed: operation "+o.Key+" ran once")
			require.Equal(t, hint.Completed, hintOf(t, first).Code)

			// The agent reconnects (a new MCP session, new request ids) and
			// re-issues the call, the body reworded: same stable session,
			// same operation.
			args["body"] = "Hello again"
			again := call(t, b.connect(t, tr, nil, nil), "run-7", "send_email", args)
			require.False(t, again.IsError, text(again))
			ao := op(t, again)
			require.True(t, ao.Replayed)
			require.Equal(t, o.Key, ao.Key)
			require.NotNil(t, ao.CompletedAt)
			note := jsonFirst(t, again)
			require.Contains(t, note, "Already done, not repeated", "the note follows the JSON")
			require.Equal(t, hint.Replayed, hintOf(t, again).Code)
			require.Contains(t, note, ao.CompletedAt.Format(time.RFC3339))
			require.EqualValues(t, 1, structuredOf(t, again)["n"], "the recorded result")
			require.Equal(t, 1, b.count("send_email"))

			// Another session is another operation.
			other := call(t, b.connect(t, tr, nil, nil), "run-8", "send_email", args)
			require.False(t, op(t, other).Replayed)
			require.Equal(t, 2, b.count("send_email"))
		})
	}
}

func TestTheScopeIsNeverTheMCPSession(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Session: "configured"})
	args := map[string]any{"title": "printer on fire"}

	// No _meta, no header: the configured session scopes every connection.
	call(t, b.connect(t, inMemory, nil, nil), "", "create_ticket", args)
	res := call(t, b.connect(t, streamable, nil, nil), "", "create_ticket", args)
	require.True(t, op(t, res).Replayed, text(res))
	require.Equal(t, 1, b.count("create_ticket"))

	// The Idem-Session header scopes an HTTP connection, and names the same
	// session as the _meta field.
	h := http.Header{HeaderSession: {"tenant-4"}}
	res = call(t, b.connect(t, streamable, nil, h), "", "create_ticket", args)
	require.False(t, op(t, res).Replayed)
	res = call(t, b.connect(t, inMemory, nil, nil), "tenant-4", "create_ticket", args)
	require.True(t, op(t, res).Replayed)
	// The _meta field wins over the header.
	res = call(t, b.connect(t, streamable, nil, h), "tenant-5", "create_ticket", args)
	require.False(t, op(t, res).Replayed)
	require.Equal(t, 3, b.count("create_ticket"))

	// A _meta session that is not a string is refused.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bad, err := b.connect(t, inMemory, nil, nil).CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: args, Meta: mcp.Meta{MetaSession: 7}})
	require.NoError(t, err)
	require.True(t, bad.IsError)
	require.Contains(t, text(bad), "must be a string")
}

func TestSameKeyOtherArgumentsIsAConflict(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	cs := b.connect(t, inMemory, nil, nil)
	call(t, cs, "s", "send_email", map[string]any{"to": "ada@example.com", "subject": "Invoice", "body": "x"})
	res := call(t, cs, "s", "send_email", map[string]any{"to": "ada@example.com", "subject": "Invoice", "body": "y"})
	require.False(t, res.IsError, "a volatile arg may differ: %s", text(res))

	// Same key args, the schema allows no other property: a conflict needs a
	// tool keyed on some args only, with others in the fingerprint.
	call(t, cs, "s", "set_status", map[string]any{"order_id": "42", "status": "shipped"})
	res = call(t, cs, "s", "set_status", map[string]any{"order_id": "42", "status": "cancelled"})
	require.False(t, res.IsError, "a conflict is an outcome, not a mistake for the model to fix")
	require.Equal(t, intent.StatusConflict, op(t, res).Status)
	require.Equal(t, hint.Conflict, hintOf(t, res).Code)
	note := jsonFirst(t, res)
	require.Contains(t, note, "Conflict: nothing was done")
	require.Contains(t, note, "Do not change the arguments to get around this")
	require.Equal(t, 1, strings.Count(note, "other arguments"), "the conflict is said once: %s", note)
	require.Equal(t, 1, b.count("set_status"))
}

func TestAReadFiresEveryTime(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for i := range 3 {
		res := call(t, b.connect(t, transports[i%2], nil, nil), "s", "get_order", map[string]any{"order_id": "42"})
		require.False(t, res.IsError, text(res))
		require.False(t, op(t, res).Replayed)
	}
	require.Equal(t, 3, b.count("get_order"))
}

func TestKeyLikeArgumentsTheModelInventsAreIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	cs := b.connect(t, inMemory, nil, nil)
	first := call(t, cs, "s", "create_ticket", map[string]any{"title": "t", "idempotency_key": "a1"})
	again := call(t, cs, "s", "create_ticket", map[string]any{"title": "t", "Idempotency-Key": "b2", "requestId": "r9"})
	require.True(t, op(t, again).Replayed, text(again))
	require.Equal(t, op(t, first).Key, op(t, again).Key)
	require.Equal(t, 1, b.count("create_ticket"))
	require.Equal(t, map[string]any{"title": "t"}, structuredOf(t, first)["args"], "not passed on either")
}

func TestSchemaViolationsAreRefusedBeforePublishing(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxArgsBytes: 1 << 10})
	cs := b.connect(t, inMemory, nil, nil)
	before := b.lastSeq(t)
	cases := map[string]any{
		"missing":       map[string]any{"to": "ada@example.com"},
		"wrong type":    map[string]any{"to": 7, "subject": "x"},
		"too long":      map[string]any{"to": "a", "subject": strings.Repeat("x", 201)},
		"undeclared":    map[string]any{"to": "a", "subject": "b", "cc": "c"},
		"not an object": []any{"to", "a"},
		"oversized":     map[string]any{"to": "a", "subject": "b", "body": strings.Repeat("x", 2<<10)},
	}
	for name, args := range cases {
		res := call(t, cs, "s", "send_email", args)
		require.True(t, res.IsError, name)
		require.Contains(t, text(res), "Invalid arguments for send_email", name)
		require.Contains(t, text(res), "Nothing was done", name)
	}
	// A number that cannot survive canonicalisation, caught by the client.
	res := call(t, cs, "s", "create_ticket", map[string]any{"id": 1 << 60})
	require.True(t, res.IsError)
	require.Contains(t, text(res), "Invalid arguments")
	require.Equal(t, before, b.lastSeq(t), "nothing was published")
	require.Equal(t, 0, b.count("send_email"))

	// The server keeps serving.
	ok := call(t, cs, "s", "send_email", map[string]any{"to": "a", "subject": "b"})
	require.False(t, ok.IsError, text(ok))
}

func TestOperatorApproval(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	cs := b.connect(t, streamable, nil, nil)
	res := call(t, cs, "s", "refund", map[string]any{"order_id": "98765", "amount": "50.00 EUR"})
	require.False(t, res.IsError, text(res))
	o := op(t, res)
	require.Equal(t, intent.StatusAwaitingApproval, o.Status)
	require.Contains(t, jsonFirst(t, res), StatusTool)
	require.Equal(t, o.Key, structuredOf(t, res)["operation"])
	require.Equal(t, 0, b.count("refund"))

	// A retry does not fire or approve anything.
	res = call(t, cs, "s", "refund", map[string]any{"order_id": "98765", "amount": "50.00 EUR"})
	require.Equal(t, intent.StatusAwaitingApproval, op(t, res).Status)

	st := call(t, cs, "", StatusTool, map[string]any{"operation": o.Key})
	require.Equal(t, intent.StatusAwaitingApproval, op(t, st).Status)

	// An operator approves; the status tool, waiting, sees the result.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		d, err := b.client.Decide(ctx, intent.ControlApprove, intent.Control{Key: o.Key, Fingerprint: o.Fingerprint, By: "ops"})
		require.NoError(t, err)
		require.Equal(t, intent.StatusCompleted, d.Status)
	})
	st = call(t, cs, "", StatusTool, map[string]any{"operation": o.Key, "wait_seconds": 30})
	wg.Wait()
	require.Equal(t, intent.StatusCompleted, op(t, st).Status, text(st))
	require.Contains(t, jsonFirst(t, st), "Completed")
	require.EqualValues(t, 1, structuredOf(t, st)["n"])

	res = call(t, cs, "s", "refund", map[string]any{"order_id": "98765", "amount": "50.00 EUR"})
	require.Equal(t, intent.StatusCompleted, op(t, res).Status, text(res))
	require.True(t, op(t, res).Replayed)
	require.Equal(t, 1, b.count("refund"))

	missing := call(t, cs, "", StatusTool, map[string]any{"operation": "refund.0000"})
	require.True(t, missing.IsError)
	require.Contains(t, text(missing), "No operation")
}

func TestUserApprovalThroughElicitation(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			var mu sync.Mutex
			var asked []string
			answer := func(action string) *mcp.ClientOptions {
				return &mcp.ClientOptions{ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					mu.Lock()
					asked = append(asked, req.Params.Message)
					mu.Unlock()
					return &mcp.ElicitResult{Action: action}, nil
				}}
			}
			args := map[string]any{"order_id": "98765", "amount": "50.00 EUR"}

			// Accepted: three calls retried at once (each its own session)
			// fire the refund once, and each gets its result.
			var wg sync.WaitGroup
			results := make([]*mcp.CallToolResult, 3)
			for i := range results {
				cs := b.connect(t, tr, answer("accept"), nil)
				wg.Go(func() { results[i] = call(t, cs, "s", "user_refund", args) })
			}
			wg.Wait()
			for _, res := range results {
				require.False(t, res.IsError, text(res))
				require.Equal(t, intent.StatusCompleted, op(t, res).Status, text(res))
			}
			require.Equal(t, 1, b.count("user_refund"))
			require.NotEmpty(t, asked)
			require.Contains(t, asked[0], `"order_id":"98765"`, "the question shows the args")

			// Declined: denied, never fired; a retry is denied without asking.
			other := map[string]any{"order_id": "11111", "amount": "9.00 EUR"}
			res := call(t, b.connect(t, tr, answer("decline"), nil), "s", "user_refund", other)
			require.False(t, res.IsError, "a denial is an outcome, not a mistake to fix")
			require.Equal(t, intent.StatusDenied, op(t, res).Status)
			require.Contains(t, jsonFirst(t, res), "Do not call again")
			n := len(asked)
			res = call(t, b.connect(t, tr, answer("accept"), nil), "s", "user_refund", other)
			require.Equal(t, intent.StatusDenied, op(t, res).Status)
			require.Len(t, asked, n)
			require.Equal(t, 1, b.count("user_refund"))

			// A client that cannot elicit: the operator path.
			third := map[string]any{"order_id": "22222", "amount": "1.00 EUR"}
			res = call(t, b.connect(t, tr, nil, nil), "s", "user_refund", third)
			require.Equal(t, intent.StatusAwaitingApproval, op(t, res).Status, text(res))
		})
	}
}

// A call approved through an input request publishes its intent once: the
// answered round reads the record it left and decides, without publishing
// it again.
func TestUserApprovalPublishesOnce(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			nc := natstest.Connect(t, b.gate.nc.ConnectedUrl())
			published := make(chan *nats.Msg, 16)
			sub, err := nc.ChanSubscribe(b.client.Names().IntentSubject("user_refund"), published)
			require.NoError(t, err)
			require.NoError(t, nc.Flush())
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			cs := b.connect(t, tr, &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				return &mcp.ElicitResult{Action: "accept"}, nil
			}}, nil)
			res := call(t, cs, "s", "user_refund", map[string]any{"order_id": "31337", "amount": "5.00 EUR"})
			require.Equal(t, intent.StatusCompleted, op(t, res).Status, text(res))
			require.Equal(t, 1, b.count("user_refund"))
			require.NoError(t, nc.Flush())
			require.Len(t, published, 1, "the intent is published once")
		})
	}
}
