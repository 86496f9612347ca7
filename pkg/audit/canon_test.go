package audit

import (
	"encoding/json"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

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
