package audit

import (
	"bytes"
	"testing"
	"time"

	"github.com/idemgate/idemgate/pkg/intent"
)

// Audit's canonical encoding is intent's: a string is written as an
// envelope writes its tool, and an event is what intent's canonicalizer
// makes of it. An integer beyond 2^53 in an event is left out: audit
// writes it exactly, and intent refuses it (it has no exact float64).
func FuzzCanonicalAgree(f *testing.F) {
	f.Add("plain", uint64(1))
	f.Add("\x00\x1f\"\\\b\f\n\r\t\x7f", uint64(1<<53))
	f.Add("\xff\xed\xa0\x80é😀\u2028", uint64(1<<53+1))
	f.Fuzz(func(t *testing.T, s string, n uint64) {
		env, err := intent.Envelope{Tool: s, Args: []byte(`{}`)}.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		want := append(intent.AppendCanonicalString([]byte(`{"tool":`), s), `,"args":{}}`...)
		if !bytes.Equal(env, want) {
			t.Errorf("string %q: an envelope writes %q, audit %q", s, env, want)
		}
		if n > 1<<53 {
			return
		}
		e := Event{Kind: KindGap, Key: s, Reason: s, Dropped: n, IntentSeq: n, At: time.Unix(0, 0)}
		ev := e.Canonical()
		if c, err := intent.Canonicalize(ev); err != nil || !bytes.Equal(c, ev) {
			t.Errorf("event %q: canonically %q (%v)", ev, c, err)
		}
	})
}
