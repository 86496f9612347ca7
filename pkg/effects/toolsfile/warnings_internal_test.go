package toolsfile

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idemgate/idemgate/pkg/effects"
	"github.com/idemgate/idemgate/pkg/intent"
)

// A tool keyed by all its args is checked through its schema's property
// names (the schema field itself is parsed elsewhere: here only the node).
func TestKeyWarningsFromSchema(t *testing.T) {
	t.Parallel()
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal([]byte(`effect: noop
volatile_args: [trace_id]
schema:
  type: object
  properties:
    title: {type: string}
    requested_at: {type: string}
    trace_id: {type: string}
`), &doc))
	c := &collector{file: "tools.yaml"}
	s := newSection(c, "create_ticket", 1, doc.Content[0])
	keyWarnings(s, &effects.Tool{Name: "create_ticket", KeySpec: intent.KeySpec{VolatileArgs: []string{"trace_id"}}}, nil)
	ws := c.warnings()
	require.Len(t, ws, 1, "%v", ws)
	require.Equal(t, 7, ws[0].Line)
	require.Equal(t, "create_ticket.schema.properties.requested_at", ws[0].Path)
	require.Contains(t, ws[0].Problem, `"requested_at" looks like a timestamp`)

	// With key_args, the key args are checked and the schema is not.
	c = &collector{file: "tools.yaml"}
	s = newSection(c, "create_ticket", 1, doc.Content[0])
	keyWarnings(s, &effects.Tool{Name: "create_ticket", KeySpec: intent.KeySpec{KeyArgs: []string{"title"}}}, []int{1})
	require.Empty(t, c.warnings())
}

func TestVolatileLooking(t *testing.T) {
	t.Parallel()
	for _, name := range []string{
		"requested_at", "createdAt", "sent_at", "time", "start_time", "timestamp", "eventTimestamp", "date",
		"send_date", "ts", "now", "attempt", "attempts", "retry_count", "retries", "try", "nonce", "uuid",
		"client_uuid", "guid", "request_id", "x-request-id", "requestId", "req_id", "trace_id", "traceparent",
		"span_id", "idempotency_key", "IdempotencyKey",
	} {
		_, ok := volatileLooking(name)
		require.True(t, ok, name)
	}
	for _, name := range []string{
		"to", "subject", "order_id", "timeout", "runtime", "update", "format", "status", "at", "data", "customer",
		"amount_cents", "user", "title", "attachment", "strategy", "entry_id", "country",
	} {
		what, ok := volatileLooking(name)
		require.False(t, ok, "%s looks like %s", name, what)
	}
}

// Warnings, with their lines: key args that look volatile, and webhooks to
// addresses that will be refused; none for the same file done right.
