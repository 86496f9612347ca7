package audit

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The quick check takes data for canonical only when the canonicalizer
// leaves it as it is, and it takes the common results.
func TestCanonicalAlready(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		data string
		want bool
	}{
		{`{}`, true},
		{`[]`, true},
		{`{"a":1,"b":[true,false,null,-12,0,"x"],"c":{"d":"é☃𝄞 \"q\" \\ \n\t\u001f\u0000"}}`, true},
		{`{"echo":{"n":123456789012345,"pad":"xxxx"}}`, true},
		{`"plain"`, true},
		{`0`, true},
		{`{"b":1,"a":2}`, false},    // order
		{`{"a":1,"a":1}`, false},    // repeated
		{`{"a": 1}`, false},         // whitespace
		{` {}`, false},              // whitespace
		{`{} `, false},              // whitespace
		{`1.5`, false},              // not an integer: the long way
		{`1e3`, false},              // exponent
		{`-0`, false},               // canonical: 0
		{`01`, false},               // leading zero
		{`1234567890123456`, false}, // 16 digits
		{`"\u0041"`, false},         // needless escape
		{`"\/"`, false},             // needless escape
		{`"\u000a"`, false},         // \n
		{`"\u001F"`, false},         // uppercase hex
		{`"\ud800"`, false},         // lone surrogate
		{"\"\xff\"", false},         // invalid UTF-8
		{"\"\x01\"", false},         // raw control character
		{`{"é":1}`, false},          // non-ASCII name: the long way
		{`{"a\"":1}`, false},        // escaped name: the long way
		{`[1,]`, false},             // not JSON
		{`{"a":1`, false},           // truncated
		{`"abc`, false},             // truncated
		{`tru`, false},              // truncated
		{`"\u0100"`, false},         // needless escape of a non-control character
	} {
		got := canonicalAlready([]byte(c.data))
		require.Equalf(t, c.want, got, "%s", c.data)
		if got {
			canon, err := intent.Canonicalize([]byte(c.data))
			require.NoError(t, err, c.data)
			require.Equal(t, string(canon), c.data)
		}
	}
}

// Whatever the quick check takes is what the canonicalizer makes of it.
func FuzzCanonicalAlready(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[true,false,null,-12,0,"x"],"c":{"d":"é \"q\" \\ \n\u001f"}}`))
	f.Add([]byte(`{"b":1,"a":2}`))
	f.Add([]byte(`[1.5,1e3,-0,"\u0041"]`))
	var vectors []struct{ Envelope, Material string }
	if data, err := os.ReadFile("../intent/testdata/vectors.json"); err == nil && json.Unmarshal(data, &vectors) == nil {
		for _, v := range vectors {
			f.Add([]byte(v.Envelope))
			f.Add([]byte(v.Material))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !canonicalAlready(data) {
			return
		}
		canon, err := intent.Canonicalize(data)
		if err != nil {
			t.Fatalf("taken as canonical, but the canonicalizer refuses it: %q: %v", data, err)
		}
		if string(canon) != string(data) {
			t.Fatalf("taken as canonical: %q, but its canonical form is %q", data, canon)
		}
	})
}

// An append's lines: as they are without an encoding, decoded with s2;
// an unknown encoding or undecodable data is refused.
func TestAppendLines(t *testing.T) {
	t.Parallel()
	lines := []byte(`{"event":{"at":"2026-01-02T03:04:05Z","kind":"x","v":1},"partition":0,"pos":1,"prev":""}`)
	got, err := appendLines(nil, lines)
	require.NoError(t, err)
	require.Equal(t, lines, got)
	got, err = appendLines(nats.Header{HeaderEncoding: []string{EncodingS2}}, s2.Encode(nil, lines))
	require.NoError(t, err)
	require.Equal(t, lines, got)
	_, err = appendLines(nats.Header{HeaderEncoding: []string{EncodingS2}}, lines)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = appendLines(nats.Header{HeaderEncoding: []string{"gzip"}}, lines)
	require.ErrorIs(t, err, ErrInvalid)
}

// Members removed from canonical data by slicing it are what the
// canonicalizer's way makes of it.
func TestQuickWithoutIsWithout(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	cases := []string{`{}`, `{"seal":1}`, `{"a":1,"seal":{"sig":"x","signer":"y"}}`, `{"proof":["L00"],"sig":"s","z":{"sig":1}}`,
		`{"a":[{"sig":1}],"b":"\"sig\":","sig":"q"}`}
	for _, l := range trail(t, s, 2, 8) {
		cases = append(cases, string(l))
		var e Entry
		require.NoError(t, json.Unmarshal(l, &e))
		cases = append(cases, string(e.Event))
	}
	for _, c := range cases {
		for _, names := range [][]string{{"seal"}, {"sig", "proof"}, {"a", "z"}} {
			quick, qr, ok := quickWithout([]byte(c), names...)
			require.True(t, ok, c)
			slow, sr, err := slowWithout([]byte(c), names...)
			require.NoError(t, err)
			require.Equal(t, string(slow), string(quick), c)
			require.Len(t, qr, len(sr), c)
			for k, v := range sr {
				require.JSONEq(t, string(v), string(qr[k]), c)
			}
		}
	}
	_, _, ok := quickWithout([]byte(`{"b":1,"a":2}`), "a")
	require.False(t, ok, "not canonical: the long way")
}
