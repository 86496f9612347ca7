package intent

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func mustDecode(t *testing.T, s string) *Envelope {
	t.Helper()
	env, err := Decode([]byte(s), Limits{})
	require.NoError(t, err)
	return env
}

// TestDeriveByHand checks key and fingerprint against values computed
// outside this package (the material written out by hand from the spec, its
// SHA-256 taken with sha256sum).
func TestDeriveByHand(t *testing.T) {
	t.Parallel()
	env := mustDecode(t, `{"args": {"to": "ada@example.com"}, "tool": "send_email"}`)
	m, err := Material(env, KeySpec{}, time.Time{})
	require.NoError(t, err)
	require.Equal(t, `{"args":{"to":"ada@example.com"},"session":"","tool":"send_email","v":1}`, string(m))
	id, err := Derive(env, KeySpec{}, time.Time{})
	require.NoError(t, err)
	require.Equal(t, Identity{
		Key:         "send_email.6bbe4565d73ca3a8d6049a3952642f93e223b5513e64cdf59f536f1e00fd9088",
		Fingerprint: "b5e6e7922707a1383480b2debae25c1b23f21a15badf96bd4bf362ab86ddee07",
	}, id)
}

// TestMaterialByHand spells out the material of each derivation rule.
func TestMaterialByHand(t *testing.T) {
	t.Parallel()
	week := 168 * time.Hour
	msg := time.Date(2025, 1, 7, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		name, env string
		spec      KeySpec
		msgTime   time.Time
		want      string
	}{
		{"whole args, sorted", `{"tool":"t","args":{"b":[1.0,{"y":1,"x":2}],"a":"\u00e9"},"session":"s"}`, KeySpec{}, time.Time{},
			`{"args":{"a":"é","b":[1,{"x":2,"y":1}]},"session":"s","tool":"t","v":1}`},
		{"key args only, a missing one left out", `{"tool":"t","args":{"a":1,"b":2,"c":3}}`, KeySpec{KeyArgs: []string{"c", "a", "zz"}}, time.Time{},
			`{"args":{"a":1,"c":3},"session":"","tool":"t","v":1}`},
		{"key args none present", `{"tool":"t","args":{"a":1}}`, KeySpec{KeyArgs: []string{"b"}}, time.Time{},
			`{"args":{},"session":"","tool":"t","v":1}`},
		{"volatile args leave the key", `{"tool":"t","args":{"a":1,"trace":"x"}}`, KeySpec{VolatileArgs: []string{"trace"}}, time.Time{},
			`{"args":{"a":1},"session":"","tool":"t","v":1}`},
		{"volatile args leave the key args too", `{"tool":"t","args":{"a":1,"b":2,"trace":"x"}}`, KeySpec{KeyArgs: []string{"a", "trace"}, VolatileArgs: []string{"trace"}}, time.Time{},
			`{"args":{"a":1},"session":"","tool":"t","v":1}`},
		{"override", `{"tool":"t","args":{"a":1},"key":"op-1","session":"s"}`, KeySpec{KeyArgs: []string{"a"}}, time.Time{},
			`{"key":"op-1","session":"s","tool":"t","v":1}`},
		{"override ignores the window", `{"tool":"t","args":{},"key":"op-1"}`, KeySpec{Window: week}, time.Time{},
			`{"key":"op-1","session":"","tool":"t","v":1}`},
		// 2025-01-06T10:00:00Z is 1736157600 s; / 604800 = 2870.6
		{"window from created_at", `{"tool":"t","args":{},"created_at":"2025-01-06T10:00:00Z"}`, KeySpec{Window: week}, msg,
			`{"args":{},"session":"","tool":"t","v":1,"window":2870}`},
		// 1736251200 s / 604800 = 2870.8
		{"window from the message time", `{"tool":"t","args":{}}`, KeySpec{Window: week}, msg,
			`{"args":{},"session":"","tool":"t","v":1,"window":2870}`},
		{"window of one second", `{"tool":"t","args":{},"created_at":"2025-01-06T10:00:00.999Z"}`, KeySpec{Window: time.Second}, time.Time{},
			`{"args":{},"session":"","tool":"t","v":1,"window":1736157600}`},
		{"window before 1970 floors", `{"tool":"t","args":{},"created_at":"1969-12-31T23:59:59Z"}`, KeySpec{Window: time.Hour}, time.Time{},
			`{"args":{},"session":"","tool":"t","v":1,"window":-1}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := Material(mustDecode(t, tc.env), tc.spec, tc.msgTime)
			require.NoError(t, err)
			require.Equal(t, tc.want, string(m))
		})
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	spec := KeySpec{KeyArgs: []string{"id"}, VolatileArgs: []string{"trace", "absent"}}
	id := func(s string) Identity {
		t.Helper()
		got, err := Derive(mustDecode(t, s), spec, time.Time{})
		require.NoError(t, err)
		return got
	}
	a := id(`{"tool":"t","args":{"id":1,"n":2,"trace":"x"},"call_id":"c1"}`)
	require.Equal(t, a, id(`{"tool":"t","args":{"trace":"y","n":2.0,"id":1},"call_id":"c2"}`), "volatile args and call_id change nothing")
	b := id(`{"tool":"t","args":{"id":1,"n":3}}`)
	require.Equal(t, a.Key, b.Key)
	require.NotEqual(t, a.Fingerprint, b.Fingerprint, "same key, other args: a conflict")
	c := id(`{"tool":"t","args":{"id":1,"n":2},"session":"other"}`)
	require.NotEqual(t, a.Key, c.Key)
	require.NotEqual(t, a.Fingerprint, c.Fingerprint)
	require.True(t, strings.HasPrefix(a.Key, "t."))
	require.Len(t, a.Key, len("t.")+64)
	require.Len(t, a.Fingerprint, 64)
}

func TestDeriveRejects(t *testing.T) {
	t.Parallel()
	ok := &Envelope{Tool: "t", Args: json.RawMessage(`{}`)}
	cases := []struct {
		name     string
		env      *Envelope
		spec     KeySpec
		msgTime  time.Time
		sentinel error
		msg      string
	}{
		{"nil envelope", nil, KeySpec{}, time.Time{}, ErrInvalid, "intent: invalid: no envelope"},
		{"bad tool", &Envelope{Tool: "T", Args: json.RawMessage(`{}`)}, KeySpec{}, time.Time{}, ErrInvalid, `tool "T" must match`},
		{"args not an object", &Envelope{Tool: "t", Args: json.RawMessage(`[]`)}, KeySpec{}, time.Time{}, ErrInvalid, "args must be an object, got an array"},
		{"args not JSON", &Envelope{Tool: "t", Args: json.RawMessage(`{"a":}`)}, KeySpec{}, time.Time{}, ErrInvalid, "args: intent: invalid: at byte 5"},
		{"args with a big integer", &Envelope{Tool: "t", Args: json.RawMessage(`{"id":18446744073709551615}`)}, KeySpec{}, time.Time{}, ErrInvalid, "beyond ±2^53"},
		{"long override", &Envelope{Tool: "t", Args: json.RawMessage(`{}`), Key: strings.Repeat("k", 300)}, KeySpec{}, time.Time{}, ErrInvalid, `"key" is 300 bytes`},
		{"line break in session", &Envelope{Tool: "t", Args: json.RawMessage(`{}`), Session: "a\nb"}, KeySpec{}, time.Time{}, ErrInvalid, `field "session" holds the control character U+000A at byte 1`},
		{"control character in call_id", &Envelope{Tool: "t", Args: json.RawMessage(`{}`), CallID: "\x01"}, KeySpec{}, time.Time{}, ErrInvalid, `field "call_id" holds the control character U+0001 at byte 0`},
		{"invalid UTF-8 in session", &Envelope{Tool: "t", Args: json.RawMessage(`{}`), Session: "a\xffb"}, KeySpec{}, time.Time{}, ErrInvalid, `field "session" is not valid UTF-8`},
		{"invalid UTF-8 in key", &Envelope{Tool: "t", Args: json.RawMessage(`{}`), Key: "\xed\xa0\x80"}, KeySpec{}, time.Time{}, ErrInvalid, `field "key" is not valid UTF-8`},
		{"window with no time", ok, KeySpec{Window: time.Hour}, time.Time{}, ErrInvalid, `tool "t" is keyed by a 1h0m0s window and the intent has no created_at or message time`},
		{"negative window", ok, KeySpec{Window: -time.Hour}, time.Time{}, ErrInvalidSpec, "window -1h0m0s is negative"},
		{"sub-second window", ok, KeySpec{Window: 500 * time.Millisecond}, time.Now(), ErrInvalidSpec, "window 500ms is not a whole number of seconds"},
		{"fractional window", ok, KeySpec{Window: 1500 * time.Millisecond}, time.Now(), ErrInvalidSpec, "not a whole number of seconds (at least 1s)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Derive(tc.env, tc.spec, tc.msgTime)
			require.ErrorIs(t, err, tc.sentinel)
			require.ErrorContains(t, err, tc.msg)
			_, err = Material(tc.env, tc.spec, tc.msgTime)
			require.ErrorIs(t, err, tc.sentinel)
		})
	}
}

func TestDeriveHandBuiltEnvelope(t *testing.T) {
	t.Parallel()
	decoded := mustDecode(t, `{"tool":"t","args":{"b":1,"a":[1.0]}}`)
	built := &Envelope{Tool: "t", Args: json.RawMessage(`{ "a": [1], "b": 1e0 }`)}
	want, err := Derive(decoded, KeySpec{}, time.Time{})
	require.NoError(t, err)
	got, err := Derive(built, KeySpec{}, time.Time{})
	require.NoError(t, err)
	require.Equal(t, want, got, "Derive canonicalizes args itself")
	empty, err := Derive(&Envelope{Tool: "t"}, KeySpec{}, time.Time{})
	require.NoError(t, err)
	braces, err := Derive(&Envelope{Tool: "t", Args: json.RawMessage(`{}`)}, KeySpec{}, time.Time{})
	require.NoError(t, err)
	require.Equal(t, braces, empty, "nil args are {}")
}

func TestKeySpecValidate(t *testing.T) {
	t.Parallel()
	for _, w := range []time.Duration{0, time.Second, time.Hour, 168 * time.Hour} {
		require.NoError(t, KeySpec{Window: w}.Validate(), w)
	}
	for _, w := range []time.Duration{-time.Second, time.Nanosecond, 999 * time.Millisecond, time.Second + time.Millisecond} {
		require.ErrorIs(t, KeySpec{Window: w}.Validate(), ErrInvalidSpec, w)
	}
}

// Decoded.Derive takes the args as Decode left them; the identity is the one
// Derive gives the same envelope, under every kind of spec, and args changed
// after decoding are parsed and checked again.
func TestDecodedDeriveIsDerive(t *testing.T) {
	t.Parallel()
	inputs := []string{
		`{"tool":"t","args":{}}`,
		`{"tool":"t","args":{"b":1,"a":[1.0,"x"],"n":null},"session":"s"}`,
		`{"tool":"t","args":{"to":"a@b","body":"hi","nonce":"z","é":{"k":[true,false]}},"session":"s","call_id":"c"}`,
		`{"tool":"t","args":{"to":"a@b"},"key":"explicit","created_at":"2026-01-02T03:04:05Z"}`,
		`{"tool":"t","args":{"x":1e2,"y":-0},"created_at":"2026-01-02T03:04:05.5+02:00"}`,
	}
	specs := []KeySpec{{}, {KeyArgs: []string{"to"}}, {VolatileArgs: []string{"nonce"}}, {Window: time.Hour},
		{KeyArgs: []string{"to", "body"}, VolatileArgs: []string{"nonce"}, Window: time.Minute}}
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	for _, in := range inputs {
		decoded, err := DecodeEnvelope([]byte(in), Limits{})
		require.NoError(t, err)
		require.Equal(t, mustDecode(t, in), decoded.Envelope)
		for _, spec := range specs {
			want, err := Derive(decoded.Envelope, spec, at)
			require.NoError(t, err)
			got, err := decoded.Derive(spec, at)
			require.NoError(t, err)
			require.Equalf(t, want, got, "%s under %+v", in, spec)
		}
	}
	env, err := DecodeEnvelope([]byte(`{"tool":"t","args":{"a":1}}`), Limits{})
	require.NoError(t, err)
	before, err := env.Derive(KeySpec{}, at)
	require.NoError(t, err)
	env.Args = json.RawMessage(`{ "a" : 2 }`)
	after, err := env.Derive(KeySpec{}, at)
	require.NoError(t, err)
	other, err := Derive(&Envelope{Tool: "t", Args: json.RawMessage(`{"a":2}`)}, KeySpec{}, at)
	require.NoError(t, err)
	require.NotEqual(t, before, after)
	require.Equal(t, other, after, "replaced args are parsed and canonicalized")
	env.Args = json.RawMessage(`[1]`)
	_, err = env.Derive(KeySpec{}, at)
	require.ErrorIs(t, err, ErrInvalid, "and checked")
}
