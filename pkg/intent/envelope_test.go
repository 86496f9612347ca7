package intent

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDecode(t *testing.T) {
	t.Parallel()
	env, err := Decode([]byte(`{
		"tool": "send_email",
		"args": {"to": "a@example.com", "n": 1.0, "meta": {"b": 2, "a": 1}},
		"session": "run-7",
		"key": "welcome-42",
		"call_id": "call_abc",
		"created_at": "2025-03-04T05:06:07.5+02:00"
	}`), Limits{})
	require.NoError(t, err)
	require.Equal(t, "send_email", env.Tool)
	require.Equal(t, `{"meta":{"a":1,"b":2},"n":1,"to":"a@example.com"}`, string(env.Args))
	require.Equal(t, "run-7", env.Session)
	require.Equal(t, "welcome-42", env.Key)
	require.Equal(t, "call_abc", env.CallID)
	require.True(t, env.CreatedAt.Equal(time.Date(2025, 3, 4, 3, 6, 7, 5e8, time.UTC)))

	// Control characters are refused in session and call_id only: args and
	// a key override may hold them.
	env, err = Decode([]byte(`{"tool":"t","args":{"text":"a\nb"},"key":"k\n1","session":"caf\u00e9 \u2028 run","call_id":"call 1"}`), Limits{})
	require.NoError(t, err)
	require.Equal(t, "k\n1", env.Key)
	require.Equal(t, "café \u2028 run", env.Session)

	env, err = Decode([]byte(`{"args":{},"tool":"noop"}`), Limits{})
	require.NoError(t, err)
	require.Equal(t, &Envelope{Tool: "noop", Args: json.RawMessage(`{}`)}, env)
}

// TestDecodeRejects covers every envelope rule; each rejection says what is
// wrong.
func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	big := `{"tool":"t","args":{"s":"` + strings.Repeat("x", DefaultMaxBytes) + `"}}`
	deep := `{"tool":"t","args":` + strings.Repeat(`{"a":`, 32) + "1" + strings.Repeat("}", 33)
	cases := []struct {
		name, in string
		lim      Limits
		sentinel error
		msg      string
	}{
		{"too large", big, Limits{}, ErrTooLarge, "intent: too large: 262172 bytes, the limit is 262144"},
		{"too large for a custom limit", `{"tool":"t","args":{}}`, Limits{MaxBytes: 10}, ErrTooLarge, "22 bytes, the limit is 10"},
		{"too deep", deep, Limits{}, ErrInvalid, "nesting deeper than 32"},
		{"too deep for a custom limit", `{"tool":"t","args":{"a":[]}}`, Limits{MaxDepth: 2}, ErrInvalid, "nesting deeper than 2"},
		{"not JSON", `<intent/>`, Limits{}, ErrInvalid, "at byte 0: unexpected character '<', expected a value"},
		{"not an object", `["t",{}]`, Limits{}, ErrInvalid, "the envelope must be a JSON object, got an array"},
		{"null envelope", `null`, Limits{}, ErrInvalid, "must be a JSON object, got null"},
		{"unknown field", `{"tool":"t","args":{},"sesion":"x"}`, Limits{}, ErrInvalid, `unknown field "sesion" (the fields are tool, args, session, key, call_id, created_at)`},
		{"field name case", `{"Tool":"t","args":{}}`, Limits{}, ErrInvalid, `unknown field "Tool" (field names are case-sensitive: use "tool")`},
		{"repeated field", `{"tool":"t","args":{},"tool":"t"}`, Limits{}, ErrInvalid, `at byte 22: member name "tool" repeated`},
		{"repeated arg", `{"tool":"t","args":{"a":1,"a":1}}`, Limits{}, ErrInvalid, `member name "a" repeated`},
		{"invalid UTF-8", "{\"tool\":\"t\",\"args\":{\"a\":\"\xfe\"}}", Limits{}, ErrInvalid, "invalid UTF-8"},
		{"lone surrogate", `{"tool":"t","args":{"a":"\udead"}}`, Limits{}, ErrInvalid, "lone surrogate escape"},
		{"unsafe integer", `{"tool":"t","args":{"id":9007199254740993}}`, Limits{}, ErrInvalid, "beyond ±2^53"},
		{"non-finite number", `{"tool":"t","args":{"x":1e999}}`, Limits{}, ErrInvalid, "beyond the range of a float64"},
		{"trailing garbage", `{"tool":"t","args":{}}}`, Limits{}, ErrInvalid, "after the JSON value"},
		{"missing tool", `{"args":{}}`, Limits{}, ErrInvalid, `field "tool" is required`},
		{"empty tool", `{"tool":"","args":{}}`, Limits{}, ErrInvalid, `field "tool": "" must match [a-z0-9_-]{1,64}`},
		{"upper-case tool", `{"tool":"Send","args":{}}`, Limits{}, ErrInvalid, `"Send" must match`},
		{"dotted tool", `{"tool":"a.b","args":{}}`, Limits{}, ErrInvalid, `"a.b" must match`},
		{"long tool", `{"tool":"` + strings.Repeat("a", 65) + `","args":{}}`, Limits{}, ErrInvalid, "must match [a-z0-9_-]{1,64}"},
		{"tool not a string", `{"tool":7,"args":{}}`, Limits{}, ErrInvalid, `field "tool" must be a string, got a number`},
		{"null tool", `{"tool":null,"args":{}}`, Limits{}, ErrInvalid, `field "tool" must be a string, got null`},
		{"missing args", `{"tool":"t"}`, Limits{}, ErrInvalid, `field "args" is required (send {} for no arguments)`},
		{"null args", `{"tool":"t","args":null}`, Limits{}, ErrInvalid, `field "args" must be an object, got null`},
		{"array args", `{"tool":"t","args":[1]}`, Limits{}, ErrInvalid, `field "args" must be an object, got an array`},
		{"string args", `{"tool":"t","args":"{}"}`, Limits{}, ErrInvalid, `must be an object, got a string`},
		{"null session", `{"tool":"t","args":{},"session":null}`, Limits{}, ErrInvalid, `field "session" must be a string, got null (omit the field instead of sending null)`},
		{"number session", `{"tool":"t","args":{},"session":7}`, Limits{}, ErrInvalid, `field "session" must be a string, got a number`},
		{"null call_id", `{"tool":"t","args":{},"call_id":null}`, Limits{}, ErrInvalid, `field "call_id" must be a string, got null`},
		{"line break in session", `{"tool":"t","args":{},"session":"run-7\r\nX-Evil: 1"}`, Limits{}, ErrInvalid, `field "session" holds the control character U+000D at byte 5`},
		{"NUL in session", `{"tool":"t","args":{},"session":"a\u0000"}`, Limits{}, ErrInvalid, `field "session" holds the control character U+0000 at byte 1`},
		{"tab in call_id", `{"tool":"t","args":{},"call_id":"call\t1"}`, Limits{}, ErrInvalid, `field "call_id" holds the control character U+0009 at byte 4`},
		{"DEL in call_id", `{"tool":"t","args":{},"call_id":"c\u007f"}`, Limits{}, ErrInvalid, `field "call_id" holds the control character U+007F`},
		{"C1 control in call_id", `{"tool":"t","args":{},"call_id":"c\u0085"}`, Limits{}, ErrInvalid, `field "call_id" holds the control character U+0085`},
		{"null key", `{"tool":"t","args":{},"key":null}`, Limits{}, ErrInvalid, `field "key" must be a string, got null`},
		{"empty key", `{"tool":"t","args":{},"key":""}`, Limits{}, ErrInvalid, `field "key" is empty: omit it to derive the key from the args`},
		{"long key", `{"tool":"t","args":{},"key":"` + strings.Repeat("k", 257) + `"}`, Limits{}, ErrInvalid, `field "key" is 257 bytes, the limit is 256`},
		{"null created_at", `{"tool":"t","args":{},"created_at":null}`, Limits{}, ErrInvalid, `field "created_at" must be a string, got null`},
		{"created_at not RFC 3339", `{"tool":"t","args":{},"created_at":"2025-01-02 15:04:05"}`, Limits{}, ErrInvalid, `field "created_at": "2025-01-02 15:04:05" is not an RFC 3339 time`},
		{"created_at without zone", `{"tool":"t","args":{},"created_at":"2025-01-02T15:04:05"}`, Limits{}, ErrInvalid, "is not an RFC 3339 time"},
		{"created_at comma fraction", `{"tool":"t","args":{},"created_at":"2025-01-02T15:04:05,5Z"}`, Limits{}, ErrInvalid, "is not an RFC 3339 time"},
		{"created_at bad date", `{"tool":"t","args":{},"created_at":"2025-02-30T15:04:05Z"}`, Limits{}, ErrInvalid, "is not an RFC 3339 time"},
		{"created_at unix number", `{"tool":"t","args":{},"created_at":1735830245}`, Limits{}, ErrInvalid, `field "created_at" must be a string, got a number`},
		{"created_at zero time", `{"tool":"t","args":{},"created_at":"0001-01-01T00:00:00Z"}`, Limits{}, ErrInvalid, "is the zero time"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env, err := Decode([]byte(tc.in), tc.lim)
			require.Nil(t, env)
			require.Error(t, err)
			require.ErrorIs(t, err, tc.sentinel)
			require.Contains(t, err.Error(), tc.msg)
			require.True(t, strings.HasPrefix(err.Error(), tc.sentinel.Error()+": "), err.Error())
		})
	}
}

func TestDecodeLimitsAtTheEdge(t *testing.T) {
	t.Parallel()
	in := `{"tool":"t","args":{}}`
	_, err := Decode([]byte(in), Limits{MaxBytes: len(in)})
	require.NoError(t, err)
	_, err = Decode([]byte(in), Limits{MaxBytes: len(in) - 1})
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = Decode([]byte(`{"tool":"t","args":{"a":[]}}`), Limits{MaxDepth: 3})
	require.NoError(t, err)
	_, err = Decode([]byte(`{"tool":"t","args":{},"key":"`+strings.Repeat("k", MaxKeyBytes)+`"}`), Limits{})
	require.NoError(t, err)
	_, err = Decode([]byte(`{"tool":"`+strings.Repeat("a", 64)+`","args":{}}`), Limits{})
	require.NoError(t, err)
}

func TestCheckSubject(t *testing.T) {
	t.Parallel()
	env := &Envelope{Tool: "send_email", Args: json.RawMessage(`{}`)}
	require.NoError(t, env.CheckSubject("send_email"))
	err := env.CheckSubject("charge_card")
	require.ErrorIs(t, err, ErrToolMismatch)
	require.EqualError(t, err, `intent: tool does not match subject: the envelope names tool "send_email", the subject tool "charge_card"`)
	require.Equal(t, CodeToolMismatch, Code(err))
}

func TestCode(t *testing.T) {
	t.Parallel()
	_, tooLarge := Decode([]byte(`{"tool":"t","args":{}}`), Limits{MaxBytes: 1})
	_, invalid := Decode([]byte(`{`), Limits{})
	require.Equal(t, CodeTooLarge, Code(tooLarge))
	require.Equal(t, CodeInvalidIntent, Code(invalid))
	require.Equal(t, CodeToolMismatch, Code(ErrToolMismatch))
	require.Equal(t, CodeInvalidIntent, Code(errors.New("other")))
	require.Equal(t, CodeInvalidIntent, Code(KeySpec{Window: -1}.Validate()))
	require.Empty(t, Code(nil))
}

func TestValidTool(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"a", "send_email", "charge-card", "v2", strings.Repeat("z", 64)} {
		require.True(t, ValidTool(name), name)
	}
	for _, name := range []string{"", "Send", "a.b", "a b", "a*", "a>", "é", strings.Repeat("z", 65)} {
		require.False(t, ValidTool(name), name)
	}
}

func TestEnvelopeJSONRoundTrip(t *testing.T) {
	t.Parallel()
	full := &Envelope{
		Tool: "send_email", Args: json.RawMessage(`{"to":"a@example.com"}`), Session: "s",
		Key: "k", CallID: "c", CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 600, time.FixedZone("", 3600)),
	}
	b, err := json.Marshal(full)
	require.NoError(t, err)
	require.Equal(t, `{"tool":"send_email","args":{"to":"a@example.com"},"session":"s","key":"k","call_id":"c","created_at":"2025-01-02T03:04:05.0000006+01:00"}`, string(b))
	back, err := Decode(b, Limits{})
	require.NoError(t, err)
	require.True(t, back.CreatedAt.Equal(full.CreatedAt))
	back.CreatedAt = full.CreatedAt
	require.Equal(t, full, back)

	b, err = json.Marshal(Envelope{Tool: "noop"})
	require.NoError(t, err)
	require.Equal(t, `{"tool":"noop","args":{}}`, string(b))

	var env Envelope
	require.NoError(t, json.Unmarshal([]byte(`{"tool":"noop","args":{"b":1,"a":2}}`), &env))
	require.Equal(t, `{"a":2,"b":1}`, string(env.Args))
	require.ErrorIs(t, json.Unmarshal([]byte(`{"tool":"noop","args":{},"extra":1}`), &env), ErrInvalid)

	_, err = json.Marshal(Envelope{Tool: "noop", CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	require.ErrorIs(t, err, ErrInvalid)
}
