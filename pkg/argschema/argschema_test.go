package argschema_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/argschema"
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
