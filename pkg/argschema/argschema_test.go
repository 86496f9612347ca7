package argschema_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/argschema"
	"github.com/idemgate/idemgate/pkg/intent"
)

func TestResolve(t *testing.T) {
	t.Parallel()
	res, err := argschema.Resolve(json.RawMessage(`{"type":"object","properties":{"to":{"type":"string"}},"required":["to"]}`))
	require.NoError(t, err)
	require.NoError(t, res.Validate(map[string]any{"to": "ann"}))
	require.Error(t, res.Validate(map[string]any{}))

	for _, tc := range []struct{ name, schema, want string }{
		{"NotJSON", `{`, "is not a JSON Schema"},
		{"NotAnObject", `{"type":"string"}`, `has type "string", want "object"`},
		{"Unresolved", `{"type":"object","properties":{"a":{"$ref":"#/$defs/missing"}}}`, "does not resolve"},
	} {
		_, err := argschema.Resolve(json.RawMessage(tc.schema))
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

// Check validates the args as intent parsed them, whether Build or the
// decoding of an envelope did; its refusals wrap intent.ErrInvalid and name
// the tool and the violation.
func TestCheck(t *testing.T) {
	t.Parallel()
	schema := json.RawMessage(`{"type":"object","properties":{"to":{"type":"string"},"n":{"type":"integer","maximum":3}},"required":["to"],"additionalProperties":false}`)
	var s argschema.Schemas
	for _, tc := range []struct{ name, args, want string }{
		{"Valid", `{"to":"a","n":3}`, ""},
		{"ValidFloatInteger", `{"to":"a","n":2.0}`, ""},
		{"Missing", `{}`, `missing properties: ["to"]`},
		{"WrongType", `{"to":5}`, `want "string"`},
		{"OverMaximum", `{"to":"a","n":4}`, "maximum"},
		{"Undeclared", `{"to":"a","cc":"b"}`, "cc"},
	} {
		built, err := intent.Build(intent.Envelope{Tool: "send_email", Args: json.RawMessage(tc.args)}, intent.Limits{})
		require.NoError(t, err, tc.name)
		decoded, err := intent.DecodeEnvelope(built.Data(), intent.Limits{})
		require.NoError(t, err, tc.name)
		for _, d := range []intent.Decoded{built, decoded} {
			err := s.Check(schema, d)
			if tc.want == "" {
				require.NoError(t, err, tc.name)
				continue
			}
			require.ErrorIs(t, err, intent.ErrInvalid, tc.name)
			require.ErrorContains(t, err, "args do not match tool send_email's schema", tc.name)
			require.ErrorContains(t, err, tc.want, tc.name)
		}
	}

	free, err := intent.Build(intent.Envelope{Tool: "free", Args: json.RawMessage(`{"x":[1]}`)}, intent.Limits{})
	require.NoError(t, err)
	require.NoError(t, s.Check(nil, free), "no schema: any args")
	err = s.Check(json.RawMessage(`{"type":"string"}`), free)
	require.ErrorIs(t, err, intent.ErrInvalid)
	require.ErrorContains(t, err, `tool free: its schema has type "string"`)
}

// Schemas that keep changing (an upstream's, say) cost resolutions, never
// unbounded memory: past its bound a Schemas forgets what it kept, and
// still checks.
func TestSchemasAreBounded(t *testing.T) {
	t.Parallel()
	var s argschema.Schemas
	d, err := intent.Build(intent.Envelope{Tool: "t", Args: json.RawMessage(`{"n":1}`)}, intent.Limits{})
	require.NoError(t, err)
	for i := range argschema.MaxSchemas + 10 {
		schema := json.RawMessage(fmt.Sprintf(`{"type":"object","properties":{"n":{"type":"integer","maximum":%d}}}`, i+1))
		require.NoError(t, s.Check(schema, d))
		require.LessOrEqual(t, s.Kept(), argschema.MaxSchemas)
	}
	require.ErrorContains(t, s.Check(json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer","maximum":0}}}`), d), "maximum")
}
