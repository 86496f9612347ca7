package toolsfile

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/argschema"
)

func TestDescriptionParse(t *testing.T) {
	t.Parallel()
	reg, err := Parse([]byte(`tools:
  refund:
    effect: noop
    key_args: [order_id]
    approval: required
    approver: user
    description: Refund an order.
    destructive: false
    schema:
      type: object
      properties:
        order_id: {type: string}
        amount: {type: number, minimum: 0}
      required: [order_id, amount]
      additionalProperties: false
  lookup: {effect: noop, class: read}
  plain: {effect: noop, key_args: [id]}
`))
	require.NoError(t, err)
	refund, _ := reg.Lookup("refund")
	require.Equal(t, "Refund an order.", refund.Description)
	require.JSONEq(t, `{"type":"object","properties":{"order_id":{"type":"string"},"amount":{"type":"number","minimum":0}},"required":["order_id","amount"],"additionalProperties":false}`, string(refund.Schema))
	require.True(t, refund.Policy.UserApproves)
	require.False(t, refund.IsDestructive())
	lookup, _ := reg.Lookup("lookup")
	require.False(t, lookup.IsDestructive())
	require.Nil(t, lookup.Schema)
	plain, _ := reg.Lookup("plain")
	require.True(t, plain.IsDestructive(), "a write is destructive unless the file says otherwise")
	require.False(t, plain.Policy.UserApproves)

	res, err := argschema.Resolve(refund.Schema)
	require.NoError(t, err)
	require.NoError(t, res.Validate(map[string]any{"order_id": "98765", "amount": 50.0}))
	require.Error(t, res.Validate(map[string]any{"order_id": "98765"}))
}

func TestDescriptionErrors(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, tool, want string }{
		{"not an object", "{effect: noop, schema: {type: string}}", `tools.yaml:2: t.schema: has type "string", want "object"`},
		{"no type", "{effect: noop, schema: {properties: {a: {type: string}}}}", `tools.yaml:2: t.schema: has type "", want "object"`},
		{"bad keyword value", "{effect: noop, schema: {type: object, properties: 5}}", `tools.yaml:2: t.schema: is not a JSON Schema`},
		{"bad pattern", "{effect: noop, schema: {type: object, properties: {a: {type: string, pattern: '(?<=x)'}}}}", `tools.yaml:2: t.schema: does not resolve`},
		{"outside ref", "{effect: noop, schema: {type: object, properties: {a: {$ref: 'https://example.com/s.json'}}}}", `tools.yaml:2: t.schema: does not resolve`},
		{"scalar", "{effect: noop, schema: yes}", `tools.yaml:2: t.schema: is not a JSON Schema`},
		{"closed schema without the key arg", "{effect: noop, key_args: [id], schema: {type: object, properties: {n: {}}, additionalProperties: false}}", `tools.yaml:2: t.schema: does not declare "id"`},
		{"destructive read", "{effect: noop, class: read, destructive: true}", `tools.yaml:2: t.destructive: a read never changes anything`},
		{"approver value", "{effect: noop, key_args: [id], approval: required, approver: boss}", `tools.yaml:2: t.approver: unknown approver "boss" (use operator or user)`},
		{"approver alone", "{effect: noop, approver: user}", `tools.yaml:2: t.approver: is set but approval is not required`},
		{"description type", "{effect: noop, description: [a]}", `tools.yaml:2: t.description: is a list, want a string`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte("tools:\n  t: " + c.tool + "\n"))
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestSchemaErrorHasItsLine(t *testing.T) {
	t.Parallel()
	_, err := Parse([]byte("tools:\n  a: {effect: noop, key_args: [id]}\n  b:\n    effect: noop\n    schema:\n      type: array\n"))
	require.ErrorContains(t, err, "tools.yaml:5: b.schema: has type \"array\"")
}
