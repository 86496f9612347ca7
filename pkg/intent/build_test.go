package intent

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Build accepts what Decode accepts and refuses what it refuses: an
// envelope assembled from its parts is the one Decode makes of its
// encoding, with the same identity under every spec, and one Decode would
// refuse is refused with the same error class.
func TestBuildIsDecode(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat(`{"a":`, 31) + `1` + strings.Repeat(`}`, 31)
	tooDeep := strings.Repeat(`{"a":`, 32) + `1` + strings.Repeat(`}`, 32)
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	specs := []KeySpec{{}, {KeyArgs: []string{"to"}}, {VolatileArgs: []string{"nonce"}}, {Window: time.Hour}}
	for _, c := range []struct {
		name string
		env  Envelope
		err  error // nil: accepted
	}{
		{"no args", Envelope{Tool: "t"}, nil},
		{"blank args", Envelope{Tool: "t", Args: json.RawMessage(" \n")}, nil},
		{"spaced, unordered args", Envelope{Tool: "t", Args: json.RawMessage(` { "to" : "a@b", "n": 1.0, "nonce": "z" } `), Session: "s", CallID: "c"}, nil},
		{"key and created_at", Envelope{Tool: "t", Args: json.RawMessage(`{"x":[1,2]}`), Key: "k", CreatedAt: at}, nil},
		{"nested 32 deep", Envelope{Tool: "t", Args: json.RawMessage(deep)}, nil},
		{"nested 33 deep", Envelope{Tool: "t", Args: json.RawMessage(tooDeep)}, ErrInvalid},
		{"bad tool", Envelope{Tool: "T", Args: json.RawMessage(`{}`)}, ErrInvalid},
		{"array args", Envelope{Tool: "t", Args: json.RawMessage(`[]`)}, ErrInvalid},
		{"null args", Envelope{Tool: "t", Args: json.RawMessage(`null`)}, ErrInvalid},
		{"repeated member", Envelope{Tool: "t", Args: json.RawMessage(`{"a":1,"a":1}`)}, ErrInvalid},
		{"beyond 2^53", Envelope{Tool: "t", Args: json.RawMessage(`{"a":9007199254740993}`)}, ErrInvalid},
		{"lone surrogate", Envelope{Tool: "t", Args: json.RawMessage(`{"a":"\ud800"}`)}, ErrInvalid},
		{"trailing data", Envelope{Tool: "t", Args: json.RawMessage(`{}{}`)}, ErrInvalid},
		{"control in session", Envelope{Tool: "t", Session: "a\nb"}, ErrInvalid},
		{"invalid UTF-8 in call_id", Envelope{Tool: "t", CallID: "a\xffb"}, ErrInvalid},
		{"key over the limit", Envelope{Tool: "t", Key: strings.Repeat("k", MaxKeyBytes+1)}, ErrInvalid},
		{"year 10000", Envelope{Tool: "t", CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, ErrInvalid},
		{"too large", Envelope{Tool: "t", Args: json.RawMessage(`{"a":"` + strings.Repeat("x", DefaultMaxBytes) + `"}`)}, ErrTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			built, err := Build(c.env, Limits{})
			if c.err != nil {
				require.ErrorIs(t, err, c.err)
				// Decode refuses its encoding (when it has one) the same way.
				if env := c.env; ValidTool(env.Tool) && json.Valid(env.Args) {
					if data, merr := env.MarshalJSON(); merr == nil {
						_, derr := Decode(data, Limits{})
						require.ErrorIs(t, derr, c.err, "Decode of %s", data)
					}
				}
				return
			}
			require.NoError(t, err)
			decoded, err := DecodeEnvelope(built.Data(), Limits{})
			require.NoError(t, err)
			require.Equal(t, decoded.Envelope, built.Envelope)
			require.Equal(t, string(decoded.Args), string(built.Args), "canonical args")
			for _, spec := range specs {
				want, err := decoded.Derive(spec, at)
				require.NoError(t, err)
				got, err := built.Derive(spec, at)
				require.NoError(t, err)
				require.Equal(t, want, got, "%+v", spec)
			}
		})
	}
}

// The one rule every door and the workers apply: an unsafe tool's intent
// needs its key args unless it carries a key override.
func TestCheckKeyArgs(t *testing.T) {
	t.Parallel()
	order := KeySpec{KeyArgs: []string{"order_id", "amount"}}
	for _, c := range []struct {
		name    string
		env     string
		class   Class
		spec    KeySpec
		missing string // the key arg reported missing; "" when accepted
	}{
		{"all key args", `{"tool":"t","args":{"order_id":"o1","amount":5}}`, ClassUnsafe, order, ""},
		{"null is given", `{"tool":"t","args":{"order_id":null,"amount":5}}`, ClassUnsafe, order, ""},
		{"one missing", `{"tool":"t","args":{"order_id":"o1"}}`, ClassUnsafe, order, "amount"},
		{"nested is not top-level", `{"tool":"t","args":{"x":{"order_id":"o1","amount":5}}}`, ClassUnsafe, order, "order_id"},
		{"a key override names it", `{"tool":"t","args":{},"key":"refund-o1"}`, ClassUnsafe, order, ""},
		{"idempotent", `{"tool":"t","args":{}}`, ClassIdempotent, order, ""},
		{"read", `{"tool":"t","args":{}}`, ClassRead, order, ""},
		{"no key args", `{"tool":"t","args":{}}`, ClassUnsafe, KeySpec{}, ""},
	} {
		d, err := DecodeEnvelope([]byte(c.env), Limits{})
		require.NoError(t, err)
		b, err := Build(*d.Envelope, Limits{})
		require.NoError(t, err)
		hand := Decoded{Envelope: d.Envelope} // not parsed: parsed now
		for _, in := range []Decoded{d, b, hand} {
			err := in.CheckKeyArgs(c.class, c.spec)
			if c.missing == "" {
				require.NoError(t, err, c.name)
				continue
			}
			require.ErrorIs(t, err, ErrInvalid, c.name)
			require.Contains(t, err.Error(), `key arg "`+c.missing+`" is missing`, c.name)
		}
	}
}
