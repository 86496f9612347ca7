package audit

import (
	"bytes"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemgate/idemgate/pkg/intent"
)

// The two canonical encoders agree: audit's string encoding is intent's
// (seen through an envelope's tool), its events are what intent's
// canonicalizer makes of them, and what its quick check takes is canonical.
// Two differences are known and left out: a string of invalid UTF-8
// (audit writes U+FFFD, intent the bytes as they are) and an integer
// beyond 2^53 in an event (audit writes it, intent refuses it).
func FuzzCanonicalAgree(f *testing.F) {
	f.Add("plain", []byte(`{"a":1}`), uint64(1))
	f.Add("\x00\x1f\"\\\b\f\n\r\t\x7f", []byte(`[1.5,"\u0041"]`), uint64(1<<53))
	f.Add("\xff\xed\xa0\x80é😀\u2028", []byte(`"\ud800"`), uint64(1<<53+1))
	f.Fuzz(func(t *testing.T, s string, data []byte, n uint64) {
		if !utf8.ValidString(s) || n > 1<<53 {
			return
		}
		env, err := intent.Envelope{Tool: s, Args: []byte(`{}`)}.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		want := append(appendString([]byte(`{"tool":`), s), `,"args":{}}`...)
		if !bytes.Equal(env, want) {
			t.Errorf("string %q: intent writes %q, audit %q", s, env, want)
		}
		str := appendString(nil, s)
		if c, err := intent.Canonicalize(str); err != nil || !bytes.Equal(c, str) {
			t.Errorf("string %q: audit writes %q, canonically %q (%v)", s, str, c, err)
		}
		e := Event{Kind: KindGap, Key: s, Dropped: n, IntentSeq: n, At: time.Unix(0, 0)}
		ev := e.Canonical()
		if c, err := intent.Canonicalize(ev); err != nil || !bytes.Equal(c, ev) {
			t.Errorf("event %q: canonically %q (%v)", ev, c, err)
		}
		if canonicalAlready(data) {
			if c, err := intent.Canonicalize(data); err != nil || !bytes.Equal(c, data) {
				t.Errorf("%q taken as canonical: canonically %q (%v)", data, c, err)
			}
		}
	})
}
