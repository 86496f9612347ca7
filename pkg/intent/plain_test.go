package intent_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// PlainArgs gives the args as encoding/json decodes them, whether they were
// parsed by Build, by DecodeEnvelope, or changed since and parsed again.
func TestPlainArgsAreWhatEncodingJSONDecodes(t *testing.T) {
	t.Parallel()
	for _, args := range []string{
		`{}`,
		` {"b":[1,2.5,-0,1e3,"x",null,true,false,{"c":{}}],"a":"\u00e9\ud83d\ude00","n":9007199254740992} `,
		`{"deep":{"deeper":{"deepest":[[[]]]}}}`,
	} {
		var want map[string]any
		require.NoError(t, json.Unmarshal([]byte(args), &want), args)

		built, err := intent.Build(intent.Envelope{Tool: "t", Args: json.RawMessage(args)}, intent.Limits{})
		require.NoError(t, err, args)
		got, err := built.PlainArgs()
		require.NoError(t, err, args)
		require.Equal(t, want, got, "built: %s", args)

		decoded, err := intent.DecodeEnvelope(built.Data(), intent.Limits{})
		require.NoError(t, err, args)
		got, err = decoded.PlainArgs()
		require.NoError(t, err, args)
		require.Equal(t, want, got, "decoded: %s", args)
	}

	built, err := intent.Build(intent.Envelope{Tool: "t", Args: json.RawMessage(`{"a":1}`)}, intent.Limits{})
	require.NoError(t, err)
	built.Args = json.RawMessage(`{"b":2}`)
	got, err := built.PlainArgs()
	require.NoError(t, err)
	require.Equal(t, map[string]any{"b": 2.0}, got, "args changed since: parsed again")
	built.Args = json.RawMessage(`{"b":2,"b":3}`)
	_, err = built.PlainArgs()
	require.ErrorIs(t, err, intent.ErrInvalid)
}
