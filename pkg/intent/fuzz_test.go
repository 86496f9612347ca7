package intent

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// jsonSeeds are interesting JSON texts, valid and not, for both fuzzers.
var jsonSeeds = []string{
	`{}`, `[]`, `null`, `true`, `0`, `-0`, `1.0`, `1e-7`, `0.000001`, `1e21`, `1e400`, `1e-400`,
	`9007199254740991`, `9007199254740992`, `9007199254740993`, `-9007199254740992.5`, `0.9007199254740993e16`,
	`123.456e-2`, `5e-324`, `1.7976931348623157e308`,
	`"\u0000\u001f\"\\\/\b\f\n\r\t"`, `"\u2028\u2029"`, `"\ud83d\ude00"`, `"\ud800"`, `"\udc00"`, `"\ud800\u0041"`,
	"\"\xff\"", "\"\xed\xa0\x80\"", "\"é😀\"",
	`{"\u20ac":1,"\ud83d\ude00":2,"\ufb33":3,"\r":4,"1":5}`,
	`{"a":1,"a":2}`, `{"a":{"b":[1,{"c":null}]}}`, `[[[[[[[[[[]]]]]]]]]]`,
	` { "b" : [ 1 , 2 ] , "a" : { } } `, `{"a":1}x`, `[1,]`, `{"a" 1}`, `01`, `1.`, `-`, `"`,
}

func FuzzCanonicalize(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := Canonicalize(data)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not a *SyntaxError wrapping ErrInvalid", err)
			}
			if se.Offset < 0 || se.Offset > len(data) {
				t.Fatalf("offset %d outside the input (%d bytes)", se.Offset, len(data))
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted %q, which encoding/json rejects", data)
		}
		again, err := Canonicalize(out)
		if err != nil {
			t.Fatalf("canonical output %q rejected: %v", out, err)
		}
		if string(again) != string(out) {
			t.Fatalf("not idempotent: %q then %q", out, again)
		}
		var in, canon any
		if err := json.Unmarshal(data, &in); err != nil {
			t.Fatalf("encoding/json: input: %v", err)
		}
		if err := json.Unmarshal(out, &canon); err != nil {
			t.Fatalf("encoding/json: output %q: %v", out, err)
		}
		if !reflect.DeepEqual(in, canon) {
			t.Fatalf("value changed: %q -> %q", data, out)
		}
	})
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"tool":"send_email","args":{"to":"a@example.com"},"session":"s","call_id":"c"}`))
	f.Add([]byte(`{"tool":"t","args":{},"key":"k","created_at":"2025-01-06T10:00:00.5+02:00"}`))
	f.Add([]byte(`{"tool":"t","args":{"id":1,"trace":"x","n":[1.0,2e-7]}}`))
	f.Add([]byte(`{"tool":"t","args":{"\u2028<&>":"\ud83d\ude00"},"session":"\u0000"}`))
	f.Add([]byte(`{"tool":"t","args":null}`))
	f.Add([]byte(`{"Tool":"t","args":{}}`))
	f.Add([]byte(`{"tool":"t","args":{},"key":""}`))
	for _, s := range jsonSeeds {
		f.Add([]byte(`{"tool":"t","args":{"v":` + s + `}}`))
	}
	specs := []KeySpec{
		{},
		{KeyArgs: []string{"id", "to"}, VolatileArgs: []string{"trace"}},
		{Window: time.Hour},
	}
	msgTime := time.Date(2025, 1, 6, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := Decode(data, Limits{MaxBytes: 4096})
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			if !strings.HasPrefix(err.Error(), "intent: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
			return
		}
		b, err := json.Marshal(env)
		if err != nil {
			t.Fatalf("marshal %+v: %v", env, err)
		}
		back, err := Decode(b, Limits{MaxBytes: 1 << 20})
		if err != nil {
			t.Fatalf("re-marshalled envelope %q rejected: %v", b, err)
		}
		if !back.CreatedAt.Equal(env.CreatedAt) || back.Tool != env.Tool || back.Session != env.Session ||
			back.Key != env.Key || back.CallID != env.CallID || string(back.Args) != string(env.Args) {
			t.Fatalf("round trip changed the envelope: %+v -> %+v", env, back)
		}
		for _, spec := range specs {
			want, err := Derive(env, spec, msgTime)
			if err != nil {
				t.Fatalf("derive %+v: %v", spec, err)
			}
			got, err := Derive(back, spec, msgTime)
			if err != nil || got != want {
				t.Fatalf("round trip changed the identity under %+v: %v -> %v (%v)", spec, want, got, err)
			}
		}
	})
}
